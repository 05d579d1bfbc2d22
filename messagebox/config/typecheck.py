"""Typing traps a subscription can fall into: a predicate that compares a property with
a family of values (text, numbers, booleans, times) that the stored messages never
carry for it, so that it never matches them (``orders.Zip == "12345"`` while publishers
send ``orders.Zip`` as the number 12345). Checked against the newest stored messages."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import orjson
import sqlalchemy as sa

from messagebox.predicates import Filter
from messagebox.predicates.model import Op
from messagebox.properties import Family, Value, decode_value, family
from messagebox.storage import schema

SAMPLE = 1000
"""How many of the newest stored messages a check reads."""

_OF_TAG = {
    "s": Family.STR,
    "i": Family.NUM,
    "f": Family.NUM,
    "b": Family.BOOL,
    "d": Family.DATETIME,
}
_NAMES = {
    Family.STR: "text",
    Family.NUM: "a number",
    Family.BOOL: "a boolean",
    Family.DATETIME: "a time",
}


def compared(filt: Filter) -> Iterator[tuple[str, Value]]:
    """(property, value) for each value a predicate of ``filt`` compares its property
    with (each of an ``in`` list; ``exists`` and ``not_exists`` compare none)."""
    for group in filt.groups:
        for p in group.predicates:
            if p.op in (Op.EXISTS, Op.NOT_EXISTS):
                continue
            for v in p.value if p.op is Op.IN else (p.value,):
                yield p.property, v


def stored_families(
    conn: sa.Connection, names: Iterable[str]
) -> tuple[int, dict[str, set[Family]]]:
    """How many messages were read, and the families each of ``names`` has in them."""
    wanted = set(names)
    s = schema.spool
    rows = conn.execute(sa.select(s.c.context).order_by(s.c.id.desc()).limit(SAMPLE)).scalars()
    seen: dict[str, set[Family]] = {}
    n = 0
    for text in rows:
        n += 1
        promoted = json.loads(text)["promoted"]
        for name in wanted.intersection(promoted):
            tag = promoted[name][0]
            seen.setdefault(name, set()).add(
                _OF_TAG.get(tag) or family(decode_value(promoted[name]))
            )
    return n, seen


KNOWN_SAMPLE = 10_000
"""How many of the newest stored messages say which property names publishers send
(:func:`carried`)."""


def carried(conn: sa.Connection, sample: int = KNOWN_SAMPLE) -> tuple[int, set[str]]:
    """How many of the newest ``sample`` stored messages were read, and the names of the
    properties they promote."""
    s = schema.spool
    rows = conn.execute(sa.select(s.c.context).order_by(s.c.id.desc()).limit(sample)).scalars()
    names: set[str] = set()
    n = 0
    for text in rows:
        n += 1
        names.update(orjson.loads(text)["promoted"])
    return n, names


def traps(conn: sa.Connection, filters: Iterable[tuple[str, Filter]]) -> list[str]:
    """A warning for each predicate of each ``(subscription name, filter)`` that compares
    its property with a family the newest stored messages never carry for it (nothing
    when no stored message carries the property: then nothing says which type publishers
    use). One read of the stored messages for them all."""
    families: dict[tuple[str, str], dict[Family, str]] = {}
    for subscription, filt in filters:
        for name, v in compared(filt):
            families.setdefault((subscription, name), {}).setdefault(family(v), repr(v))
    if not families:
        return []
    n, stored = stored_families(conn, {name for _, name in families})
    out = []
    for (subscription, name), of_it in families.items():
        have = stored.get(name)
        if not have:
            continue
        for fam, example in sorted(of_it.items()):
            if fam not in have:
                kinds = " or ".join(sorted(_NAMES[f] for f in have))
                out.append(
                    f"subscription {subscription!r}: {name} is compared with {_NAMES[fam]} "
                    f"({example}), but the {n} newest stored messages that carry {name} have "
                    f"it as {kinds}: it never matches them (publish it as {_NAMES[fam]}, or "
                    "compare it with the type publishers send)"
                )
    return out
