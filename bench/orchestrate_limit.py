"""The step limit ``bench.orchestrate`` measures beside orchestration steps, in the same
run: what a step must write, done with the raw driver and no engine.

The same conversations (an ``order`` then a ``payment`` per instance; the payment
publishes a ``confirm`` that a counting service takes off the queue) over four plain
tables: a queue, a spool, one part a message, and a state row per instance. A batch
is as large as the host instance's batches of steps can be: ``STEP_BATCHES`` claim
batches of 50 (800). On PostgreSQL the same threads as the host instance (4; DuckDB:
see below). A batch is:

1. claim: ``UPDATE … RETURNING`` of the oldest unclaimed entries (``FOR UPDATE SKIP
   LOCKED`` on PostgreSQL), committed;
2. read the messages (spool joined with parts) and the instances' states (on PostgreSQL
   in one round trip, as a pipeline; every statement prepared);
3. in one transaction (on PostgreSQL one round trip): delete the entries, upsert each
   instance's new state (the message's values decoded, the state re-encoded as JSON),
   and for each payment publish its confirmation: a spool row, a part and a queue entry.

It does less than a step: no routing (the confirmation's queue entry is written
directly), no per-instance order (an instance's two messages may run at once; the upsert
takes either order), no leases, tracking, timers or convoys. So it is an upper bound: the
rate a step could reach on this machine if the engine cost nothing.

On PostgreSQL each thread has its own connection, as the host instance's threads do. On
DuckDB, where the engine's transactions take turns and the threads waiting for a turn
claim and commit together (a group commit), one thread takes the batches and holds its
claims in memory (entries are appended in id order: it reads on from the last id it
took), which is what those shared transactions do at best.

Until the host instances took steps in batches of up to ``STEP_BATCHES`` claim batches,
this limit took batches of 50 (PostgreSQL) and 200 (DuckDB): at 2,000 conversations,
PostgreSQL 5.5-7.6k steps/s against 12.2-16.9k with 800, DuckDB 7.9k against 10.6k.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import psycopg

from bench.spent import Meter, Spent
from messagebox.hosts.cutting import STEP_BATCHES

THREADS = 4
BATCH = STEP_BATCHES * 50
"""Steps a batch: as many as a host instance of ``bench.orchestrate`` may take together."""
ORDER, PAYMENT, CONFIRM = 1, 2, 3

_TABLES = (
    "CREATE TABLE lim_q (id BIGINT PRIMARY KEY, msg UUID NOT NULL, kind SMALLINT NOT NULL, "
    "inst BIGINT NOT NULL, owner TEXT)",
    "CREATE TABLE lim_spool (id UUID PRIMARY KEY, context TEXT NOT NULL, published_at "
    "TIMESTAMP WITH TIME ZONE NOT NULL)",
    "CREATE TABLE lim_part (msg UUID PRIMARY KEY, data {blob} NOT NULL)",
    "CREATE TABLE lim_state (id BIGINT PRIMARY KEY, data TEXT NOT NULL, version INTEGER NOT NULL)",
)


def _fill_rows(n: int) -> tuple[list[Any], list[Any], list[Any]]:
    """Queue entries, spool rows and parts of N orders and N payments, orders first."""
    q: list[Any] = []
    spool: list[Any] = []
    parts: list[Any] = []
    for kind in (ORDER, PAYMENT):
        for i in range(n):
            msg = uuid.uuid4()
            props: dict[str, Any] = {"b.Kind": "order" if kind == ORDER else "payment", "b.Id": i}
            if kind == ORDER:
                props["b.Total"] = 10.0
            q.append((len(q) + 1, msg, kind, i))
            spool.append((msg, json.dumps(props)))
            parts.append((msg, b"order" if kind == ORDER else b"pay"))
    return q, spool, parts


class _Batch:
    """What one claimed batch writes (built in Python from what it read)."""

    def __init__(self, claimed: Sequence[Any], messages: dict[Any, Any], states: dict[int, Any]):
        self.done = [row[0] for row in claimed]
        self.pub_ids: list[str] = []
        self.pub_context: list[str] = []
        self.pub_insts: list[int] = []
        new: dict[int, dict[str, Any]] = {}
        for _, msg, kind, inst in claimed:
            if kind == CONFIRM:
                continue
            context = json.loads(messages[msg])
            if inst not in new:
                saved = states.get(inst)
                new[inst] = json.loads(saved)["state"] if saved is not None else {"amount": 0.0}
            state = new[inst]
            if kind == ORDER:
                state["amount"] = float(context.get("b.Total", 0.0))
            else:
                state["completed"] = True
                self.pub_ids.append(str(uuid.uuid5(uuid.NAMESPACE_URL, f"lim:{inst}")))
                self.pub_context.append(json.dumps({"b.Kind": "confirm", "b.Id": inst}))
                self.pub_insts.append(inst)
        self.state_ids = list(new)
        self.state_data = [json.dumps({"state": s, "timers": {}}) for s in new.values()]


class _Counter:
    def __init__(self, target: int) -> None:
        self.target = target
        self.handled = 0
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def add(self, n: int) -> None:
        with self.lock:
            self.handled += n
            if self.handled >= self.target:
                self.finished.set()


def _run_threads(work: Callable[[_Counter], None], target: int, threads: int = THREADS) -> Spent:
    """What the threads took to handle ``target`` entries (an error in one is raised)."""
    counter = _Counter(target)
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            work(counter)
        except BaseException as exc:
            errors.append(exc)
            counter.finished.set()

    running = [threading.Thread(target=guarded) for _ in range(threads)]
    meter = Meter()
    for t in running:
        t.start()
    counter.finished.wait()
    spent = meter.stop()
    for t in running:
        t.join()
    if errors:
        raise errors[0]
    return spent


# --- PostgreSQL ---

_PG_CLAIM = (
    "UPDATE lim_q SET owner = %s WHERE id IN (SELECT id FROM lim_q WHERE owner IS NULL "
    "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, msg, kind, inst"
)
_PG_READ = (
    "SELECT s.id, s.context, p.data FROM lim_spool s JOIN lim_part p ON p.msg = s.id "
    "WHERE s.id = ANY(%s::UUID[])"
)
_PG_DELETE = "DELETE FROM lim_q WHERE id = ANY(%s::BIGINT[])"
_PG_STATES = "SELECT id, data FROM lim_state WHERE id = ANY(%s::BIGINT[])"
_PG_UPSERT = (
    "INSERT INTO lim_state (id, data, version) SELECT id, data, 1 FROM "
    "unnest(%s::BIGINT[], %s::TEXT[]) AS v(id, data) ON CONFLICT (id) DO UPDATE SET "
    "data = excluded.data, version = lim_state.version + 1"
)
_PG_PUBLISH = (
    "WITH v AS (SELECT * FROM unnest(%s::UUID[], %s::TEXT[], %s::BIGINT[]) AS v(id, context, "
    "inst)), s AS (INSERT INTO lim_spool SELECT id, context, now() FROM v), "
    "p AS (INSERT INTO lim_part SELECT id, 'confirmed'::BYTEA FROM v) "
    "INSERT INTO lim_q (id, msg, kind, inst) SELECT nextval('lim_q_seq'), id, 3, inst FROM v"
)


def pg_limit(dsn: str, schema: str, n: int) -> Spent:
    """What handling the 2N conversation messages took (until every entry is handled)."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"SET search_path = {schema}")
        for ddl in _TABLES:
            admin.execute(ddl.format(blob="BYTEA"))
        admin.execute(f"CREATE SEQUENCE lim_q_seq START {2 * n + 1}")
        q, spool, parts = _fill_rows(n)
        with admin.cursor() as cur:
            with cur.copy("COPY lim_q (id, msg, kind, inst) FROM STDIN") as copy:
                for row in q:
                    copy.write_row(row)
            with cur.copy("COPY lim_spool (id, context, published_at) FROM STDIN") as copy:
                for msg, context in spool:
                    copy.write_row((msg, context, "2026-01-01T00:00:00Z"))
            with cur.copy("COPY lim_part (msg, data) FROM STDIN") as copy:
                for row in parts:
                    copy.write_row(row)
        admin.execute("ANALYZE lim_q, lim_spool, lim_part, lim_state")

    def work(counter: _Counter) -> None:
        owner = uuid.uuid4().hex
        with psycopg.connect(dsn, autocommit=True, options=f"-csearch_path={schema}") as conn:
            while not counter.finished.is_set():
                claimed = conn.execute(_PG_CLAIM, (owner, BATCH), prepare=True).fetchall()
                if not claimed:
                    counter.finished.wait(0.001)
                    continue
                msgs = [row[1] for row in claimed if row[2] != CONFIRM]
                insts = [row[3] for row in claimed if row[2] != CONFIRM]
                with conn.pipeline(), conn.transaction():  # one round trip
                    read = conn.execute(_PG_READ, (msgs,), prepare=True)
                    saved = conn.execute(_PG_STATES, (insts,), prepare=True)
                messages = {r[0]: r[1] for r in read}
                batch = _Batch(claimed, messages, {r[0]: r[1] for r in saved})
                with conn.pipeline(), conn.transaction():  # one round trip
                    conn.execute(_PG_DELETE, (batch.done,), prepare=True)
                    if batch.state_ids:
                        conn.execute(_PG_UPSERT, (batch.state_ids, batch.state_data), prepare=True)
                    if batch.pub_ids:
                        conn.execute(
                            _PG_PUBLISH,
                            (batch.pub_ids, batch.pub_context, batch.pub_insts),
                            prepare=True,
                        )
                counter.add(len(claimed))

    return _run_threads(work, 3 * n)


# --- DuckDB ---

_DUCK_CLAIM = "SELECT id, msg, kind, inst FROM lim_q WHERE id > ? ORDER BY id LIMIT ?"
_DUCK_READ = (
    "SELECT s.id, s.context, p.data FROM lim_spool s JOIN lim_part p ON p.msg = s.id "
    "WHERE s.id IN (SELECT unnest(?::UUID[]))"
)
_DUCK_STATES = "SELECT id, data FROM lim_state WHERE id IN (SELECT unnest(?::BIGINT[]))"
_DUCK_UPDATE = (
    "UPDATE lim_state SET data = v.data, version = lim_state.version + 1 FROM (SELECT "
    "unnest(?::BIGINT[]) AS id, unnest(?::TEXT[]) AS data) AS v WHERE lim_state.id = v.id"
)
_DUCK_INSERT_STATES = (
    "INSERT INTO lim_state (id, data, version) SELECT unnest(?::BIGINT[]), unnest(?::TEXT[]), 1"
)


def duckdb_limit(path: str, n: int) -> Spent:
    """What handling the 2N conversation messages took (until every entry is handled)."""
    db = duckdb.connect(path)
    try:
        for ddl in _TABLES:
            db.execute(ddl.format(blob="BLOB"))
        q, spool, parts = _fill_rows(n)
        db.execute(
            "INSERT INTO lim_q (id, msg, kind, inst) SELECT unnest(?::BIGINT[]), "
            "unnest(?::UUID[]), unnest(?::SMALLINT[]), unnest(?::BIGINT[])",
            [[r[0] for r in q], [str(r[1]) for r in q], [r[2] for r in q], [r[3] for r in q]],
        )
        db.execute(
            "INSERT INTO lim_spool SELECT unnest(?::UUID[]), unnest(?::TEXT[]), now()",
            [[str(m) for m, _ in spool], [c for _, c in spool]],
        )
        db.execute(
            "INSERT INTO lim_part SELECT unnest(?::UUID[]), unnest(?::BLOB[])",
            [[str(m) for m, _ in parts], [d for _, d in parts]],
        )
        return _run_threads(_duckdb_work(db, 2 * n + 1), 3 * n, threads=1)
    finally:
        db.close()


def _duckdb_work(db: duckdb.DuckDBPyConnection, next_id: int) -> Callable[[_Counter], None]:
    """One thread's loop: batches of ``BATCH``, claimed by position (entries
    are appended in id order, and one process holds the claims)."""
    position = 0

    def work(counter: _Counter) -> None:
        nonlocal position, next_id
        cur = db.cursor()
        try:
            while not counter.finished.is_set():
                claimed = cur.execute(_DUCK_CLAIM, [position, BATCH]).fetchall()
                if not claimed:
                    counter.finished.wait(0.001)
                    continue
                position = claimed[-1][0]
                msgs = [str(row[1]) for row in claimed if row[2] != CONFIRM]
                insts = [row[3] for row in claimed if row[2] != CONFIRM]
                messages = {r[0]: r[1] for r in cur.execute(_DUCK_READ, [msgs]).fetchall()}
                states = {r[0]: r[1] for r in cur.execute(_DUCK_STATES, [insts]).fetchall()}
                batch = _Batch(claimed, messages, states)
                cur.execute("BEGIN")
                cur.execute(
                    "DELETE FROM lim_q WHERE id IN (SELECT unnest(?::BIGINT[]))", [batch.done]
                )
                old = [i for i, inst in enumerate(batch.state_ids) if inst in states]
                new = [i for i, inst in enumerate(batch.state_ids) if inst not in states]
                for sql, which in ((_DUCK_UPDATE, old), (_DUCK_INSERT_STATES, new)):
                    if which:
                        cur.execute(
                            sql,
                            [
                                [batch.state_ids[i] for i in which],
                                [batch.state_data[i] for i in which],
                            ],
                        )
                if batch.pub_ids:
                    first, next_id = next_id, next_id + len(batch.pub_ids)
                    cur.execute(
                        "INSERT INTO lim_spool SELECT unnest(?::UUID[]), unnest(?::TEXT[]), now()",
                        [batch.pub_ids, batch.pub_context],
                    )
                    cur.execute(
                        "INSERT INTO lim_part SELECT unnest(?::UUID[]), 'confirmed'::BLOB",
                        [batch.pub_ids],
                    )
                    cur.execute(
                        "INSERT INTO lim_q (id, msg, kind, inst) SELECT unnest(?::BIGINT[]), "
                        "unnest(?::UUID[]), 3, unnest(?::BIGINT[])",
                        [
                            list(range(first, first + len(batch.pub_ids))),
                            batch.pub_ids,
                            batch.pub_insts,
                        ],
                    )
                cur.execute("COMMIT")
                counter.add(len(claimed))
        finally:
            cur.close()

    return work
