"""Convoys: which service instance a correlated message goes to (docs/concepts.md: Orchestrations).

A *convoy* row maps (service, correlation values) to the running instance. Routing
finds or creates it in the publish's transaction, so concurrent first messages for one
value create one instance; completing the instance deletes it
(:func:`messagebox.service_instances.complete`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox import schema
from messagebox.dialects.base import Dialect
from messagebox.ids import uuid7
from messagebox.properties import Value, family, sql_key

_CHUNK = 1000


def correlation_key(names: Sequence[str], props: Mapping[str, Value]) -> str:
    """The convoy key of a message: its values of ``names``, encoded so that two values
    that routing finds equal (``42`` and ``42.0``) give one key."""
    parts: list[Any] = []
    for name in names:
        value = props.get(name)
        if value is None:
            parts.append(None)
        elif isinstance(value, str):
            parts.append(["s", value])
        else:
            hi, lo = sql_key(value)
            parts.append([int(family(value)), hi, lo])
    return json.dumps(parts, separators=(",", ":"), ensure_ascii=False)


def resolve_convoys(
    conn: sa.Connection, dialect: Dialect, wanted: Sequence[tuple[str, str]], now: datetime
) -> dict[tuple[str, str], str]:
    """The running instance id for each (service, key), created when there is none.

    Existing rows are only read (publishers of one convoy do not write the same row).
    Missing ones are inserted unless there (:meth:`Dialect.insert_new`) and read again:
    on PostgreSQL a concurrent creator of the same key makes the insert wait for it,
    and the second read sees its instance; on DuckDB the insert or the commit fails with
    :class:`~messagebox.errors.Conflict` and the publish is retried.
    """
    c = schema.convoy
    found = find_convoys(conn, wanted)
    missing = sorted(set(wanted) - set(found))
    for start in range(0, len(missing), _CHUNK):
        chunk = missing[start : start + _CHUNK]
        dialect.insert_new(
            conn,
            c,
            [
                {"service": s, "key": k, "instance_id": str(uuid7()), "created_at": now}
                for s, k in chunk
            ],
            [c.c.service, c.c.key],
        )
        found.update(find_convoys(conn, chunk))
    return found


def find_convoys(
    conn: sa.Connection, wanted: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], str]:
    """The running instance id of each (service, key) that has one."""
    c = schema.convoy
    found: dict[tuple[str, str], str] = {}
    want = set(wanted)
    keys = sorted({k for _, k in want})
    services = sorted({s for s, _ in want})
    for start in range(0, len(keys), _CHUNK):
        rows = conn.execute(
            sa.select(c.c.service, c.c.key, c.c.instance_id).where(
                c.c.key.in_(keys[start : start + _CHUNK]), c.c.service.in_(services)
            )
        )
        found.update(
            ((r.service, r.key), r.instance_id) for r in rows if (r.service, r.key) in want
        )
    return found
