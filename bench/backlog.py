"""Statistics for a bench's backlog, as a production server would have them.

A bench publishes its backlog and then starts the clock. On a PostgreSQL server with
autovacuum on (the default) the tables that backlog filled are analysed within about a
minute (``autovacuum_naptime``; a table's first 50 changed rows call for it); the CI
server runs with autovacuum off, so without this a bench measures plans made with no
statistics at all. The raw baselines beside the engine (``orchestrate_limit``,
``deliver_raw``, PgQueuer in ``deliver_throughput``) ANALYZE their tables after filling
them; :func:`analyze` gives the engine's tables the same before its clock starts.

Without statistics PostgreSQL read a batch of messages by scanning all of
``mb_message_part`` (a hash join; 2.5 ms for 50 messages of 20,000, against 0.55 ms
analysed), which held plain delivery by services that read their messages to 11k
msgs/s against 18k.
"""

from __future__ import annotations

from messagebox import MessageBox
from messagebox.storage import schema as mb_schema


def analyze(box: MessageBox) -> None:
    """ANALYZE the store's tables (PostgreSQL; DuckDB keeps its statistics as it goes)."""
    if box.store.dialect.name != "postgresql":
        return
    names = ", ".join(t.name for t in mb_schema.metadata.sorted_tables)
    with box.store.transaction() as conn:
        conn.exec_driver_sql(f"ANALYZE {names}")
