"""Service instances in memory (as :mod:`messagebox.delivery.service_instances` does them in
SQL): loading, committing steps (state, timers, publications, completion) and firing
due timers. Every function runs under the store's lock."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Sequence

from messagebox.errors import Conflict, LeaseLost
from messagebox.memory.state import MemoryStore, Timer
from messagebox.message import Message
from messagebox.models import INSTANCE_COMPLETED, InstanceState, RoutingPolicy
from messagebox.steps import TIMEOUT_TYPE, TIMER_PUBLISHER, Step, Stored


def load(store: MemoryStore, instance_ids: Sequence[str]) -> dict[str, Stored]:
    """The stored instances among ``instance_ids``."""
    return {i: store.rows.instances[i] for i in set(instance_ids) if i in store.rows.instances}


def message_ids(instance_id: str, version: int, n: int) -> list[uuid.UUID]:
    """Ids of a step's publications, the same for a step run again (as
    ``service_instances.message_ids``)."""
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"mb:{instance_id}:{version}:{i}") for i in range(n)]


def _check(store: MemoryStore, steps: Sequence[Step]) -> None:
    """Raise :class:`LeaseLost` if an entry is no longer its step's owner's, or
    :class:`Conflict` if another step changed an instance first; nothing is changed."""
    for s in steps:
        e = store.rows.queue.get(s.entry_id)
        if e is None or e.lease_owner != s.owner:
            raise LeaseLost(
                f"queue entry {s.entry_id} is no longer leased by {s.owner}; its step was not "
                "committed"
            )
        found = store.rows.instances.get(s.instance_id)
        if (found is None) != (s.version is None) or (found and found.version != s.version):
            raise Conflict(
                f"instance {s.instance_id} changed since its step began; the steps were not "
                "committed"
            )


def commit_steps(store: MemoryStore, steps: Sequence[Step], publisher: str) -> int:
    """Commit steps at once: delete their entries, store the new states and timers,
    complete instances, publish; returns the messages discarded by completions."""
    _check(store, steps)
    rows, now = store.rows, store.now()
    for s in steps:
        del rows.queue[s.entry_id]
        old = rows.instances.get(s.instance_id)
        state = InstanceState.COMPLETED if s.complete else InstanceState.RUNNING
        rows.instances[s.instance_id] = Stored(
            s.instance_id, s.service, s.host, state,
            dict(old.correlation if old else s.correlation), s.data,
            1 if old is None else old.version + 1, now if s.complete else None,
        )  # fmt: skip
        if not s.complete:
            for tid in [t.id for t in rows.timers.values() if t.instance_id == s.instance_id]:
                if rows.timers[tid].name in s.cancel:
                    del rows.timers[tid]
            for spec in s.timers:
                t = Timer(store.next_id(), s.instance_id, s.service, s.host, s.sub, spec.name,
                          spec.due_at)  # fmt: skip
                rows.timers[t.id] = t
    done = {s.instance_id for s in steps if s.complete}
    discarded = _complete(store, done) if done else 0
    for s in (s for s in steps if s.publish):
        version = 1 if s.version is None else s.version + 1
        store.publish(
            s.publish,
            policy=RoutingPolicy.SUSPEND,
            publisher=publisher,
            strict=False,
            ids=message_ids(s.instance_id, version, len(s.publish)),
        )
    return discarded


def _complete(store: MemoryStore, done: set[str]) -> int:
    """End completed instances: remove their instance subscriptions and timers; every
    entry still queued for them (in hand or not) is suspended, not resumable
    (``completed-with-discarded-messages``), a fired timeout dropped. Returns the
    messages suspended."""
    rows = store.rows
    for i in [i for i, sub in rows.subs.items() if sub.instance_id in done]:
        del rows.subs[i]
    for tid in [t.id for t in rows.timers.values() if t.instance_id in done]:
        del rows.timers[tid]
    discarded = 0
    for e in [e for e in rows.queue.values() if e.instance_id in done]:
        del rows.queue[e.id]
        if rows.messages.get(e.msg, (None, ""))[1] == TIMER_PUBLISHER:
            continue
        store.suspend(e, INSTANCE_COMPLETED, f"instance {e.instance_id} completed")
        discarded += 1
    return discarded


def fire_timers(store: MemoryStore, host: str, limit: int = 500) -> Counter[str]:
    """Turn the host's due timers into timeout messages queued for their instances
    through the subscriptions that set them (a timer whose subscription is gone is
    dropped)."""
    rows, now = store.rows, store.now()
    due = sorted(
        (t for t in rows.timers.values() if t.host == host and t.due_at <= now),
        key=lambda t: (t.due_at, t.id),
    )[:limit]
    queued: Counter[str] = Counter()
    for t in due:
        del rows.timers[t.id]
        sub = rows.subs.get(t.sub)
        if sub is None:
            continue
        message = Message(
            json.dumps(
                {"timer": t.name, "instance": t.instance_id, "due_at": t.due_at.isoformat()}
            ),
            promoted={"messagebox.MessageType": TIMEOUT_TYPE},
            written={
                "messagebox.TimerName": t.name,
                "messagebox.TimerDue": t.due_at.isoformat(),
                "messagebox.InstanceId": t.instance_id,
            },
        )
        msg_id = uuid.uuid5(uuid.NAMESPACE_URL, f"mb-timer:{t.id}")
        store.enqueue_direct(message, msg_id, sub, t.instance_id, now)
        queued[sub.host] += 1
    return queued


def next_due(store: MemoryStore, host: str) -> float | None:
    """Seconds until the host's next timer is due (0 if one is), or None."""
    due = min((t.due_at for t in store.rows.timers.values() if t.host == host), default=None)
    if due is None:
        return None
    return max((due - store.now()).total_seconds(), 0.0)
