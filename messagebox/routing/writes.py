"""What a publish writes (:mod:`messagebox.routing.router`): queue entries, references and
suspended entries, gathered as columns and written in a few statements at the end.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate, chain, islice, repeat
from typing import Any

import sqlalchemy as sa

from messagebox import compiled, order_keys
from messagebox.compiled import native
from messagebox.models import ROUTING_FAILURE, Outcome, Routed, Suspension
from messagebox.properties import Value
from messagebox.storage import expiry, handover, schema, tracking
from messagebox.storage.dialects import Dialect, Indexed, Same, Target, Uuids
from messagebox.storage.dialects.base import distinct
from messagebox.storage.routing_index import QUEUE_COLUMNS, Matches
from messagebox.timing import Times, entry_expiry

_SUSPENDED_COLUMNS = ("id", "msg", "reason", "error", "report")
_MATCHED_NOTHING = "the message matched no subscription"


@dataclass
class Writes:
    """Rows a publish writes. Queue entries are kept as columns: a publish's matches
    come as columns (:class:`Matches`); entries queued one by one (:meth:`enqueue`) are
    kept as their targets and turned into columns once. A message's id, repeated over
    its entries, is converted once (:class:`Indexed`). Every row of one publish has the
    same time, so time and other constant columns are written as one value."""

    now: datetime
    targets: list[Target]
    entry_ids: list[int]
    msgs: list[uuid.UUID | str]
    entry_msgs: list[int]
    suspended: list[tuple[Any, ...]]
    refs: dict[str, list[Any]]
    columns: Mapping[str, Sequence[Any]] | None = None
    """The entries' :data:`QUEUE_COLUMNS`, once :meth:`matched` took them."""
    routed_entries: int = 0
    """How many of the matched entries :meth:`routed` has queued."""
    batch_ids: Sequence[uuid.UUID] | None = None
    """The batch's ids when :meth:`routed_all` queued it whole: then the messages of the
    entries, the references and the suspended rows are positions in it, so that the
    ids are converted for the database once (:class:`Uuids`)."""
    times: Times | None = None
    """The batch's messages' due and expiry times, by position (None: due now, no
    expiry of their own: the common case, written as one value)."""
    positions: list[int] | None = None
    """Each message of :attr:`msgs`' position in the batch, where :meth:`routed` queued
    it (for :attr:`times`)."""
    promoted: Sequence[Mapping[str, Value]] = ()
    """The batch's messages' promoted properties, by position: the keys of entries of
    subscriptions ordered by a property (:mod:`messagebox.order_keys`) are their values."""
    enqueued: list[Mapping[str, Value]] | None = None
    """Each message of :attr:`msgs`' promoted properties, where :meth:`enqueue` queued it."""

    @classmethod
    def empty(
        cls,
        now: datetime,
        times: Times | None = None,
        promoted: Sequence[Mapping[str, Value]] = (),
    ) -> Writes:
        return cls(now, [], [], [], [], [], {"msg": [], "n": []}, times=times, promoted=promoted)

    def enqueue(
        self,
        entry_id: int,
        msg: uuid.UUID | str,
        target: Target,
        promoted: Mapping[str, Value] | None = None,
    ) -> None:
        """Queue ``msg`` (its id, or the id's text) for one match; ``promoted``, its
        properties, give its entry's key when the match is ordered by one."""
        self.targets.append(target)
        self.columns = None
        self.entry_ids.append(entry_id)
        self.entry_msgs.append(len(self.msgs))
        self.msgs.append(msg)
        if self.enqueued is None:
            self.enqueued = []
        self.enqueued.append(promoted or {})

    def matched(self, matches: Matches) -> Counter[str]:
        """Take a publish's matches (as :meth:`routed` then queues them, message by
        message); returns the number of entries per host."""
        self.columns = matches.columns
        return Counter(matches.columns["host"])

    def routed(
        self,
        entry_ids: Iterator[int],
        msg_id: uuid.UUID,
        k: int,
        suspension: Suspension | None = None,
        at: int = 0,
    ) -> Routed:
        """Queue a message (at position ``at`` of the batch) for its next ``k`` matches
        (see :meth:`matched`), and with a suspension also store it suspended (one entry
        more)."""
        if self.columns is None:
            raise RuntimeError("Writes.routed before matched")
        start = self.routed_entries
        self.routed_entries += k
        subs: tuple[int, ...] = tuple(self.columns["sub"][start : start + k])
        if k:
            self.entry_ids.extend(islice(entry_ids, k))
            self.entry_msgs.extend(repeat(len(self.msgs), k))
            self.msgs.append(msg_id)
            if self.positions is None:
                self.positions = []
            self.positions.append(at)
        if suspension is None:
            self.reference(msg_id, k)
            return Routed(msg_id, Outcome.ROUTED, subs)
        s = suspension
        self.suspend(next(entry_ids), msg_id, s.reason, s.error, s.report)
        self.reference(msg_id, k + 1)
        return Routed(msg_id, Outcome.SUSPENDED, subs)

    def routed_all(
        self,
        entry_ids: list[int],
        ids: Sequence[uuid.UUID],
        counts: Sequence[int],
        *,
        suspend_unrouted: bool,
    ) -> list[Routed]:
        """:meth:`routed` of every message at once, in order, for a batch with no
        suspension asked for: a message that matched nothing is stored suspended (with
        ``suspend_unrouted``, taking the next entry id as the message-by-message path
        does) or dropped. The columns are made whole instead of message by message."""
        if self.columns is None or self.routed_entries:
            raise RuntimeError("Writes.routed_all before matched, or after routed")
        if self.msgs or self.refs["msg"] or self.suspended:
            raise RuntimeError("Writes.routed_all after other entries")
        self.batch_ids = ids
        subs = self.columns["sub"]
        kept = [i for i, k in enumerate(counts) if k]
        kept_counts = [counts[i] for i in kept]
        self.routed_entries = total = sum(kept_counts)
        if suspend_unrouted and len(kept) < len(counts):
            self._interleave_unrouted(entry_ids, ids, counts)
        else:
            self.entry_ids.extend(entry_ids[:total])
            self.refs["msg"].extend(kept)
            self.refs["n"].extend(kept_counts)
        self.entry_msgs.extend(chain.from_iterable(map(repeat, kept, kept_counts)))
        unmatched = Outcome.SUSPENDED if suspend_unrouted else Outcome.DROPPED
        if compiled.NATIVE:  # the same objects, made in C (0.5 µs a message less)
            values = ids.values if isinstance(ids, Uuids) else ids
            return native.routed(
                Routed, values, list(counts), tuple(subs), Outcome.ROUTED, unmatched
            )
        results = []
        start = 0
        for msg_id, k in zip(ids, counts, strict=True):
            if k:
                results.append(Routed(msg_id, Outcome.ROUTED, tuple(subs[start : start + k])))
                start += k
            else:
                results.append(Routed(msg_id, unmatched, ()))
        return results

    def _interleave_unrouted(
        self, entry_ids: list[int], ids: Sequence[uuid.UUID], counts: Sequence[int]
    ) -> None:
        """The entry ids and references of a batch where some messages matched nothing
        and are stored suspended: each message takes its entry ids in message order (a
        routed one one per match, an unrouted one one for its suspended entry), as the
        message-by-message path does; the runs between unrouted messages go whole."""
        widths = [k or 1 for k in counts]
        starts = list(accumulate(widths, initial=0))
        taken = 0
        for i in [i for i, k in enumerate(counts) if not k]:
            at = starts[i]
            self.entry_ids.extend(entry_ids[taken:at])
            # the message as its position in batch_ids, as the references below
            self.suspended.append((entry_ids[at], i, ROUTING_FAILURE, _MATCHED_NOTHING, None))
            taken = at + 1
        self.entry_ids.extend(entry_ids[taken : starts[-1]])
        self.refs["msg"].extend(range(len(ids)))  # positions in batch_ids
        self.refs["n"].extend(widths)

    def unrouted(self, entry_id: int, msg_id: uuid.UUID) -> Routed:
        """Store a message that matched nothing suspended, as a routing failure (its
        report is read from the spool)."""
        self.suspend(entry_id, msg_id, ROUTING_FAILURE, _MATCHED_NOTHING, None)
        self.reference(msg_id, 1)
        return Routed(msg_id, Outcome.SUSPENDED, ())

    def suspend(
        self,
        entry_id: int,
        msg_id: uuid.UUID,
        reason: str,
        error: str,
        report: Mapping[str, Any] | None,
    ) -> None:
        text = None if report is None else json.dumps(report, ensure_ascii=False)
        self.suspended.append((entry_id, msg_id, reason, error, text))

    def reference(self, msg_id: uuid.UUID, n: int) -> None:
        self.refs["msg"].append(msg_id)
        self.refs["n"].append(n)

    def flush(
        self,
        conn: sa.Connection,
        dialect: Dialect,
        before: Sequence[tuple[sa.Table, Mapping[str, Sequence[Any]]]] = (),
        *,
        hosts: Mapping[str, int] | None = None,
    ) -> None:
        """Insert the rows, after ``before`` (other rows of the same publish), in as few
        statements as the dialect can; given the entries queued per host (``hosts``),
        count them for metrics from it and wake those hosts at the commit."""
        now = self.now
        writes = list(before)
        q: dict[str, Sequence[Any]] | None = None
        s: dict[str, Sequence[Any]] | None = None
        if self.entry_ids:
            n = len(self.entry_ids)
            if self.columns is None:
                self.columns = Matches.of([self.targets]).columns
            msgs = self.msgs if self.batch_ids is None else self.batch_ids
            q = {
                "id": self.entry_ids,
                "msg": Indexed(msgs, self.entry_msgs),  # each id converted once
                **{name: self.columns[name] for name in QUEUE_COLUMNS},
            }
            q["attempts"] = Same(0, n)
            q["available_at"] = Same(now, n)
            q["enqueued_at"] = Same(now, n)
            by = self.columns.get("ordered_by")
            if by is not None and not (isinstance(by, Same) and by.value is None):
                q["order_key"] = self._order_keys(by)
            self._timed(conn, q)
            handover.lease(conn, q, now)  # to an idle host instance of this process
            writes.append((schema.queue, q))
        if self.suspended:
            n = len(self.suspended)
            s = dict(zip(_SUSPENDED_COLUMNS, zip(*self.suspended, strict=True), strict=True))
            if self.batch_ids is not None:  # positions in it (routed_all)
                s["msg"] = Indexed(self.batch_ids, s["msg"])
            s.update(
                sub=Same(None, n),
                host=Same(None, n),
                resumable=Same(False, n),
                attempts=Same(0, n),
                suspended_at=Same(now, n),
            )
            writes.append((schema.suspended, s))
        if self.refs["msg"]:
            refs: dict[str, Sequence[Any]] = dict(self.refs)
            if self.batch_ids is not None:
                refs["msg"] = Indexed(self.batch_ids, self.refs["msg"])
            refs["logged_at"] = Same(now, len(refs["msg"]))
            writes.append((schema.ref_add, refs))
        dialect.insert_many(conn, writes, wake=sorted(hosts or ()))
        if q is not None:
            tracking.record(
                conn,
                dialect,
                tracking.ROUTED,
                q["msg"],
                subs=q["sub"],
                hosts=q["host"],
                entries=q["id"],
                counted=True if hosts is None else hosts,
            )
        if s is not None:
            tracking.record(
                conn, dialect, tracking.SUSPENDED, s["msg"], entries=s["id"], details=s["reason"]
            )

    def _order_keys(self, by: Sequence[str | None]) -> list[str | None]:
        """Each entry's key: its message's value of the property its subscription is
        ordered by (``by``, per entry), or None where it is not ordered by one."""
        keys: list[str | None] = []
        for prop, m in zip(by, self.entry_msgs, strict=True):
            if prop is None:
                keys.append(None)
                continue
            if self.batch_ids is not None:  # positions in the batch
                props = self.promoted[m]
            elif self.enqueued is not None:
                props = self.enqueued[m]
            else:
                props = self.promoted[(self.positions or [])[m]]
            keys.append(order_keys.encode(props.get(prop)))
        return keys

    def _timed(self, conn: sa.Connection, q: dict[str, Sequence[Any]]) -> None:
        """The entries' due times and expiry, where a message of the batch has its own
        or a host of theirs has ``message_ttl_seconds`` (else ``q`` keeps due now, no
        expiry: one value for the column)."""
        ttls = expiry.host_ttls(conn)
        hosts = q["host"]
        if ttls and ttls.keys().isdisjoint(distinct(hosts)):
            ttls = {}
        times = self.times
        if times is None and not ttls:
            return
        if times is None:  # due now; expiring by their hosts' ttl
            q["expires_at"] = [entry_expiry(self.now, None, ttls.get(h)) for h in hosts]
            return
        # per message, where the entries' message positions point (entry_msgs)
        due: Sequence[datetime] = times.due
        ends: Sequence[datetime | None] = times.expires
        if self.batch_ids is None:
            due = [due[p] for p in self.positions or ()]
            ends = [ends[p] for p in self.positions or ()]
        q["available_at"] = Indexed(due, self.entry_msgs)
        if ttls:
            q["expires_at"] = [
                entry_expiry(due[m], ends[m], ttls.get(h))
                for m, h in zip(self.entry_msgs, hosts, strict=True)
            ]
        elif any(e is not None for e in ends):
            q["expires_at"] = Indexed(ends, self.entry_msgs)
