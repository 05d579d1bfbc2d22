"""Convoys: which service instance a correlated message goes to (docs/concepts.md: Orchestrations).

A *convoy* row maps (service, correlation values) to the running instance. Routing
finds or creates it in the publish's transaction, so concurrent first messages for one
value create one instance; completing the instance deletes it
(:func:`messagebox.delivery.service_instances.complete`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.properties import Value, family, sql_key
from messagebox.storage.dialects.base import Dialect
from messagebox.storage.ids import uuid7s

_CHUNK = 5000
"""Pairs per statement (arrays: no limit on parameters, only on one statement's size)."""


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

    Each is inserted with a new id unless there (:meth:`Dialect.create_convoys`); when
    fewer rows were made than asked for, the others are read: existing rows are only
    read (publishers of one convoy do not write the same row). On PostgreSQL a
    concurrent creator of the same key makes the insert wait for it, and the read sees
    its instance; on DuckDB the insert or the commit fails with
    :class:`~messagebox.errors.Conflict` and the publish is retried.
    """
    found: dict[tuple[str, str], str] = {}
    wanted = sorted(set(wanted))
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        made = [str(i) for i in uuid7s(len(chunk))]
        if dialect.create_convoys(conn, chunk, made, now) == len(chunk):
            found.update(zip(chunk, made, strict=True))
        else:  # some were there (or came meanwhile): read them all
            found.update(find_convoys(conn, dialect, chunk))
    return found


def find_convoys(
    conn: sa.Connection, dialect: Dialect, wanted: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], str]:
    """The running instance id of each (service, key) that has one."""
    found: dict[tuple[str, str], str] = {}
    wanted = sorted(set(wanted))
    for start in range(0, len(wanted), _CHUNK):
        rows = dialect.find_convoys(conn, wanted[start : start + _CHUNK])
        found.update(((service, key), instance) for service, key, instance in rows)
    return found
