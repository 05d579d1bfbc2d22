"""What must hold between the spool, the queues and the reference logs, checked.

Every publish, completion, suspension and cleanup changes these tables together, in one
transaction, so a store is never left with half of one; after a crash or a failover
(docs/howto-postgresql.md, High availability) :func:`check` says whether that held:

- each message's references (``mb_ref_add`` minus ``mb_ref_release``) equal its queue
  and suspended entries;
- no queue or suspended entry, reference row or part link names a message that is not
  in the spool, and no part link names a part that is not stored;
- each message has the parts its spool row counts, each part the fragments it counts,
  and every stored part is used by a message (cleanup deletes a part with the last
  message that uses it).

Each check is one statement, so it sees one snapshot of the store even while others
publish and deliver; each reads its tables whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.expression import SelectBase

from messagebox.storage import schema

EXAMPLES = 5
"""Rows named per problem (its count is of them all)."""


@dataclass(frozen=True)
class Problem:
    """One kind of inconsistency, how many rows show it, and a few of them."""

    what: str
    count: int
    examples: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        shown = "; ".join(self.examples)
        more = ", ..." if self.count > len(self.examples) else ""
        return f"{self.what}: {self.count} ({shown}{more})"


def _references() -> SelectBase:
    """Messages whose references differ from their queue and suspended entries."""
    add, rel, q, s = schema.ref_add, schema.ref_release, schema.queue, schema.suspended
    logs = sa.union_all(
        sa.select(add.c.msg, add.c.n), sa.select(rel.c.msg, (-rel.c.n).label("n"))
    ).subquery()
    refs = sa.select(logs.c.msg, sa.func.sum(logs.c.n).label("n")).group_by(logs.c.msg).subquery()
    entries = sa.union_all(sa.select(q.c.msg), sa.select(s.c.msg)).subquery()
    held = sa.select(entries.c.msg, sa.func.count().label("n")).group_by(entries.c.msg).subquery()
    n_refs, n_held = sa.func.coalesce(refs.c.n, 0), sa.func.coalesce(held.c.n, 0)
    return (
        sa.select(
            sa.func.coalesce(refs.c.msg, held.c.msg).label("msg"),
            n_refs.label("refs"),
            n_held.label("entries"),
        )
        .select_from(refs.join(held, refs.c.msg == held.c.msg, full=True))
        .where(n_refs != n_held)
    )


def _without_message() -> SelectBase:
    """Rows of other tables naming a message the spool does not hold."""
    sp = schema.spool
    tables = (
        schema.queue,
        schema.suspended,
        schema.ref_add,
        schema.ref_release,
        schema.message_part,
    )
    return sa.union_all(
        *(
            sa.select(t.c.msg, sa.literal(t.name).label("table")).where(
                ~sa.exists().where(sp.c.id == t.c.msg)
            )
            for t in tables
        )
    )


def _missing_parts() -> SelectBase:
    """Part links and fragments naming a part that is not stored."""
    mp, p, f = schema.message_part, schema.part, schema.fragment
    return sa.union_all(
        *(
            sa.select(sa.literal(t.name).label("table"), column).where(
                ~sa.exists().where(p.c.id == column)
            )
            for t, column in ((mp, mp.c.part), (f, f.c.part))
        )
    )


def _unused_parts() -> SelectBase:
    """Stored parts no message uses."""
    mp, p = schema.message_part, schema.part
    return sa.select(p.c.id).where(~sa.exists().where(mp.c.part == p.c.id))


def _part_counts() -> SelectBase:
    """Messages with another number of parts than their spool row says."""
    sp, mp = schema.spool, schema.message_part
    n = sa.select(sa.func.count()).where(mp.c.msg == sp.c.id).scalar_subquery()
    return sa.select(sp.c.id, sp.c.n_parts, n.label("found")).where(sp.c.n_parts != n)


def _fragment_counts() -> SelectBase:
    """Parts with another number of fragments than they say (the first is inline)."""
    p, f = schema.part, schema.fragment
    n = sa.select(sa.func.count()).where(f.c.part == p.c.id).scalar_subquery()
    return sa.select(p.c.id, p.c.n_fragments - 1, n).where(p.c.n_fragments - 1 != n)


CHECKS: list[tuple[str, Callable[[], SelectBase], Callable[[Any], str]]] = [
    (
        "messages whose references differ from their entries",
        _references,
        lambda r: f"{r[0]} references {r[1]}, entries {r[2]}",
    ),
    ("rows naming a message not in the spool", _without_message, lambda r: f"{r[1]} {r[0]}"),
    ("rows naming a part not stored", _missing_parts, lambda r: f"{r[0]} {r[1]}"),
    ("stored parts no message uses", _unused_parts, lambda r: str(r[0])),
    (
        "messages with another number of parts than they say",
        _part_counts,
        lambda r: f"{r[0]} says {r[1]}, has {r[2]}",
    ),
    (
        "parts with another number of fragments than they say",
        _fragment_counts,
        lambda r: f"{r[0]} says {r[1]} besides the first, has {r[2]}",
    ),
]
"""Each check: what it finds, its statement, how a row of it reads."""


def check(conn: sa.Connection) -> list[Problem]:
    """The inconsistencies of the store (see the module); empty when there is none."""
    problems = []
    for what, statement, shown in CHECKS:
        found = statement().subquery()
        rows = conn.execute(
            sa.select(sa.func.count().over().label("n_rows"), found).limit(EXAMPLES)
        ).all()
        if rows:
            problems.append(Problem(what, int(rows[0][0]), [shown(r[1:]) for r in rows]))
    return problems
