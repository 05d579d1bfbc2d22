"""How a search reads its window (:mod:`messagebox.ops.search`): the stored messages and
those tracking kept (``mb_spool``, ``mb_tracked_message``), newest first by
``(published_at, id)``, a page a statement, never more than its scan cap.

A :class:`Walk` first finds where its next few pages end (four, then four times as
many each time), in one statement over keys only (on PostgreSQL the ``(published_at,
id)`` indexes alone: the newest keys below the last page, numbered, those at the pages'
ends kept); then reads each page, one statement bounded by its two ends, with the test
pushed down (:func:`pushdown`). The first page holds :data:`PAGE` messages and each
next twice the last, up to :data:`MAX_PAGE`: a search that finds its matches among the
newest reads little, one that goes through its whole scan, few statements. Pages are
read as they are asked for: a search that has its ``limit`` reads no more.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from messagebox import clock
from messagebox.errors import ValidationError
from messagebox.predicates.model import Filter, Op, Predicate
from messagebox.properties import INT64_MAX, INT64_MIN, Value, encode_context
from messagebox.storage import ids, schema, store_clock

PAGE = 1_000
"""Messages the first page of a search reads; each next twice as many, up to
:data:`MAX_PAGE`."""
MAX_PAGE = 16_000
ENDS_AT_ONCE = 4
"""Pages whose ends the first statement finds; each next finds four times as many (on
DuckDB each such statement reads the keys of the window below where it starts)."""
MAX_FRAGMENTS = 64
"""``LIKE`` tests pushed down at most (more: none, the Python test does it all)."""

SOURCES = (schema.spool, schema.tracked_message)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CURSOR = re.compile(r"(-?\d{1,17})\.([0-9a-f]{32})")


@dataclass(frozen=True, order=True)
class Key:
    """Where a message stands in a search's order: its publish time, then its id."""

    published_at: datetime
    id: uuid.UUID

    def text(self) -> str:
        """The cursor's text: microseconds since 1970, a dot, the id's hex digits."""
        micros = (self.published_at - _EPOCH) // timedelta(microseconds=1)
        return f"{micros}.{self.id.hex}"

    @classmethod
    def parse(cls, text: str) -> Key:
        """A cursor's text read back; a :class:`ValidationError` for anything else."""
        found = _CURSOR.fullmatch(text.strip()) if isinstance(text, str) else None
        if found is None:
            raise ValidationError(
                f"cursor {str(text)[:80]!r} is not one a search gave (MICROSECONDS.HEX)"
            )
        try:
            at = _EPOCH + timedelta(microseconds=int(found.group(1)))
        except OverflowError:
            raise ValidationError(f"cursor {text[:80]!r}: the time is out of range") from None
        return cls(at, uuid.UUID(hex=found.group(2)))


def _key_of(t: sa.Table) -> sa.ColumnElement[Any]:
    return sa.tuple_(t.c.published_at, t.c.id)


def _bound(key: Key) -> sa.ColumnElement[Any]:
    return sa.tuple_(sa.literal(key.published_at, schema.Stamp), sa.literal(key.id, sa.Uuid))


@dataclass(frozen=True)
class Window:
    """Which messages of a source a statement reads."""

    since: datetime
    until: datetime | None
    below: Key | None
    """Only messages before this key (the cursor; then the last page's end)."""
    down_to: Key | None = None
    """Only messages from this key on (the page's end)."""
    like: Callable[[sa.Table], sa.ColumnElement[bool]] | None = None
    """The test pushed down, if any."""

    def where(self, t: sa.Table) -> list[sa.ColumnElement[bool]]:
        """The window's conditions on source ``t`` (the plain time bounds too, which a
        zone map or an index range can use)."""
        where = [t.c.published_at >= self.since]
        if self.until is not None:
            where.append(t.c.published_at < self.until)
        if self.below is not None:
            where += [t.c.published_at <= self.below.published_at]
            where.append(_key_of(t) < _bound(self.below))
        if self.down_to is not None:
            where += [t.c.published_at >= self.down_to.published_at]
            where.append(_key_of(t) >= _bound(self.down_to))
        if self.like is not None:
            where.append(self.like(t))
        return where


def _ends(conn: sa.Connection, window: Window, positions: list[int]) -> tuple[list[Key], bool]:
    """The keys at ``positions`` (from the newest of ``window``, 1), as far as the
    window goes; and whether a message follows the last position. Keys only (an index,
    on PostgreSQL): the newest of each source, numbered."""
    last = positions[-1]
    union = sa.union_all(
        *(
            sa.select(t.c.published_at, t.c.id)
            .where(*window.where(t))
            .order_by(t.c.published_at.desc(), t.c.id.desc())
            .limit(last + 1)
            for t in SOURCES
        )
    ).subquery()
    order = [union.c.published_at.desc(), union.c.id.desc()]
    numbered = sa.select(
        union.c.published_at, union.c.id, sa.func.row_number().over(order_by=order).label("n")
    ).subquery()
    rows = conn.execute(
        sa.select(numbered.c.published_at, numbered.c.id, numbered.c.n)
        .where(numbered.c.n.in_([*positions, last + 1]))
        .order_by(numbered.c.n)
    ).all()
    ends = [Key(clock.utc(r.published_at), ids.as_uuid(r.id)) for r in rows if r.n <= last]
    return ends, bool(rows) and rows[-1].n == last + 1


def count(conn: sa.Connection, window: Window) -> int:
    """How many messages the window holds (bounded by the caller: at most a scan)."""
    union = sa.union_all(*(sa.select(t.c.id).where(*window.where(t)) for t in SOURCES)).subquery()
    return int(conn.execute(sa.select(sa.func.count()).select_from(union)).scalar_one())


def _page(conn: sa.Connection, window: Window) -> list[Any]:
    """The window's messages that pass the pushed-down test, newest first: each its id,
    publish time (as fetched: :func:`messagebox.clock.fetched`), context and whether
    tracking kept it (deleted)."""
    union = sa.union_all(
        *(
            sa.select(
                ids.fetchable(conn, t.c.id).label("id"),
                store_clock.fetchable(conn, t.c.published_at).label("at"),
                t.c.context,
                sa.literal(t is schema.tracked_message).label("gone"),
                t.c.published_at,
                t.c.id.label("uid"),
            ).where(*window.where(t))
            for t in SOURCES
        )
    ).subquery()
    return list(
        conn.execute(  # all at once: one row at a time is the driver's fetchone each
            sa.select(union.c.id, union.c.at, union.c.context, union.c.gone).order_by(
                union.c.published_at.desc(), union.c.uid.desc()
            )
        ).all()
    )


@dataclass
class Walk:
    """The pages of a window, newest first, found as they are read, through at most
    ``scan`` messages. Once read: ``edge`` is the last message gone through when the
    scan cap stopped it (None: the window was read to its start)."""

    conn: sa.Connection
    window: Window
    scan: int
    edge: Key | None = None

    def pages(self) -> Iterator[list[Any]]:
        """Each page's rows (:func:`_page`), as asked for."""
        keys = replace(self.window, like=None)
        below, done, size, at_once = self.window.below, 0, PAGE, ENDS_AT_ONCE
        while done < self.scan:
            positions: list[int] = []
            while len(positions) < at_once and done + (positions or [0])[-1] < self.scan:
                at = (positions or [0])[-1]
                positions.append(min(at + size, self.scan - done))
                size = min(size * 2, MAX_PAGE)
            at_once *= 4
            ends, more = _ends(self.conn, replace(keys, below=below), positions)
            for end in ends:
                yield _page(self.conn, replace(self.window, below=below, down_to=end))
                below = end
            if len(ends) < len(positions):  # the window's start is within these pages
                yield _page(self.conn, replace(self.window, below=below))
                return
            if not more:
                return
            done += positions[-1]
        self.edge = below


# --- the test pushed down ---


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


_HEAD, _TAIL = len('{"promoted":{'), len('},"written":{}}')


def _text_of(name: str, value: Value) -> str:
    """``"NAME":[tag,value]`` as a stored context writes it."""
    return encode_context({name: value}, {})[_HEAD:-_TAIL]


def _stored_alike(value: Value) -> list[Value]:
    """The values stored that equal ``value`` in the filter language: a number in its
    other type too (``42`` and ``42.0``), zero with either sign."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return [value]
    alike: list[Value] = [value]
    if isinstance(value, int) and float(value) == value:
        alike.append(float(value))
    if isinstance(value, float) and value.is_integer() and INT64_MIN <= value <= INT64_MAX:
        alike.append(int(value))
    if value == 0:
        alike += [0.0, -0.0]
    unique = {(type(v), repr(v)): v for v in alike}
    return list(unique.values())


def _fragments(pred: Predicate) -> list[str] | None:
    """Texts one of which a stored context holds when ``pred`` holds (None: no such
    test: ``!=``, ranges, ``not_exists``, ``bitwise_and``)."""
    name = pred.property
    if pred.op is Op.EXISTS:
        return [f'"{name}":[']
    if pred.op is Op.PREFIX:
        return [_text_of(name, pred.value)[: -len('"]')]]
    if pred.op is Op.EQ:
        values = [pred.value]
    elif pred.op is Op.IN:
        values = list(pred.value)
    else:
        return None
    return [_text_of(name, v) for value in values for v in _stored_alike(value)]


_RANK = {Op.EQ: 0, Op.IN: 1, Op.PREFIX: 2, Op.EXISTS: 3}


def pushdown(filt: Filter | None) -> list[str] | None:
    """The texts a stored context must hold one of to match ``filt``: for each group,
    those of its most selective test that has some (None: a group has none, or there
    are more than :data:`MAX_FRAGMENTS`)."""
    if filt is None:
        return None
    texts: dict[str, None] = {}
    for group in filt.groups:
        ranked = sorted((p for p in group.predicates if p.op in _RANK), key=lambda p: _RANK[p.op])
        found = next((f for p in ranked if (f := _fragments(p))), None)
        if found is None:
            return None
        texts.update(dict.fromkeys(found))
    return list(texts) if len(texts) <= MAX_FRAGMENTS else None


def like(texts: list[str]) -> Callable[[sa.Table], sa.ColumnElement[bool]]:
    """The pushed-down test: the context holds one of ``texts``."""

    def holds(t: sa.Table) -> sa.ColumnElement[bool]:
        return sa.or_(*(t.c.context.like(f"%{_like_escaped(x)}%", escape="\\") for x in texts))

    return holds
