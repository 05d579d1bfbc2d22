"""The cleanup job (docs/concepts.md: Spool): what nothing references any more is deleted.

1. Host instances whose heartbeat is stale are unregistered and every lease held by an
   instance that is not alive is released, so another instance delivers the entry.
2. Completed service instances are deleted once past their retention (a day); any
   message still queued for one is suspended (not resumable: "completed with discarded
   messages"), as completing it did for those queued at the time.
3. Expired entries of hosts that no instance runs are suspended or dropped, as their
   subscriptions say (an instance sweeps its own host's at every heartbeat).
4. The reference logs are summed per message. A message whose references sum to zero,
   and that no queue or suspended entry names, is deleted with its log rows; a part is
   deleted when no message uses it any more. While tracking is on, a deleted message's
   spool row (its context) is kept as ``mb_tracked_message``, for search.
5. Receive-location receipts and tracked events (and messages) past their retention are
   trimmed, and so are routing versions behind the newest thousand.

Why it is safe while others publish and deliver: a message's references only reach
zero when its last entry is completed or terminated, and nothing adds a reference to
such a message again (a publish creates new messages; re-routing and resuming need a
suspended entry, which holds a reference). So zero is final, and each chunk is deleted
in one transaction that also re-checks that no entry names the message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from messagebox.delivery import registry, service_instances
from messagebox.models import ENDED
from messagebox.storage import (
    arrays,
    expiry,
    ids,
    recent,
    rollup,
    schema,
    store_clock,
    subscriptions,
    tracking,
)
from messagebox.storage.store import Store
from messagebox.upkeep import EXPIRY_BATCH
from messagebox.upkeep import CleanupReport as CleanupReport  # its home before upkeep


def _zero_referenced(conn: sa.Connection, limit: int) -> tuple[list[uuid.UUID], int]:
    """Up to ``limit`` messages whose references are all released and that no queue or
    suspended entry holds; and how many had all their references released. Two short
    statements, not one: the sums read only the reference logs, then the queue is
    probed with a fresh snapshot. As one statement on PostgreSQL its probes ran under the
    snapshot of its start while hosts churned the queue, each probe walking more row
    versions than the last and no vacuum able to remove them: one cleanup ran for 15
    minutes in a million-message run."""
    add, rel, q, s = schema.ref_add, schema.ref_release, schema.queue, schema.suspended
    logs = sa.union_all(
        sa.select(add.c.msg, add.c.n),
        sa.select(rel.c.msg, (-rel.c.n).label("n")),
    ).subquery()
    released = list(
        conn.execute(
            sa.select(logs.c.msg)
            .group_by(logs.c.msg)
            .having(sa.func.sum(logs.c.n) == 0)
            .limit(limit)
        ).scalars()
    )
    if not released:
        return [], 0
    msgs = [ids.as_uuid(m) for m in released]
    held = {
        ids.as_uuid(m)
        for m in conn.execute(
            sa.union(
                sa.select(q.c.msg).where(arrays.one_of(conn, q.c.msg, msgs)),
                sa.select(s.c.msg).where(arrays.one_of(conn, s.c.msg, msgs)),
            )
        ).scalars()
    }
    return [m for m in msgs if m not in held], len(msgs)


DELETE_SLICE = 2_500
"""Messages deleted a statement: a chunk's ids are found at once (the reference logs are
summed once a chunk) and deleted in slices, which bounds the ids, parts and rows held in
memory at a time (one cleanup of 60,000 messages in chunks of 10,000 raised a process's
RSS by 10 MB deleting them whole, by 7 MB in slices of 2,500, for 10% more time; chunks
of 2,500 raised it by 3 MB but took 1.5 times as long, summing the logs four times as
often)."""


def _delete_messages(
    conn: sa.Connection, msgs: list[uuid.UUID], keep: bool = False
) -> tuple[int, int, int]:
    """Delete messages, their log rows and the parts only they used, in slices of
    ``DELETE_SLICE``; (messages, parts, log rows) deleted. ``keep``: tracking is on,
    their spool rows are kept as ``mb_tracked_message`` first."""
    n_msgs = n_parts = n_refs = 0
    for start in range(0, len(msgs), DELETE_SLICE):
        m, p, r = _delete_slice(conn, msgs[start : start + DELETE_SLICE], keep)
        n_msgs, n_parts, n_refs = n_msgs + m, n_parts + p, n_refs + r
    return n_msgs, n_parts, n_refs


def _delete_slice(conn: sa.Connection, msgs: list[uuid.UUID], keep: bool) -> tuple[int, int, int]:
    """:func:`_delete_messages` for one slice. Each list is one
    array parameter (``one_of``): the statements' texts are the same whatever a chunk's
    length (an IN list of each new length was a new statement for the driver to
    convert, and on PostgreSQL a parameter per message)."""
    mp, p, f, sp = schema.message_part, schema.part, schema.fragment, schema.spool

    def among(column: sa.ColumnElement[Any], values: list[uuid.UUID]) -> sa.ColumnElement[bool]:
        return arrays.one_of(conn, column, values)

    parts = list(conn.execute(sa.select(mp.c.part).where(among(mp.c.msg, msgs))).scalars())
    conn.execute(mp.delete().where(among(mp.c.msg, msgs)))
    if keep:  # tracking is on: a search still finds them, as deleted
        tm = schema.tracked_message
        kept = sa.select(
            sp.c.id,
            sp.c.context,
            sp.c.published_at,
            sp.c.publisher,
            sa.literal(store_clock.now(conn), schema.Stamp),
        ).where(among(sp.c.id, msgs), ~sa.exists().where(tm.c.id == sp.c.id))
        columns = ["id", "context", "published_at", "publisher", "deleted_at"]
        conn.execute(tm.insert().from_select(columns, kept))  # an id kept before: kept once
    deleted = conn.execute(schema.spool.delete().where(among(schema.spool.c.id, msgs))).rowcount
    recent.deleted(conn, msgs)  # no longer read from memory once this commits
    refs = 0
    for table in (schema.ref_add, schema.ref_release):
        refs += conn.execute(table.delete().where(among(table.c.msg, msgs))).rowcount
    n_parts = 0
    if parts:
        unused = list(
            conn.execute(
                sa.select(p.c.id).where(
                    among(p.c.id, parts), ~sa.exists().where(mp.c.part == p.c.id)
                )
            ).scalars()
        )
        if unused:
            conn.execute(f.delete().where(among(f.c.part, unused)))
            n_parts = conn.execute(p.delete().where(among(p.c.id, unused))).rowcount
    return int(deleted), int(n_parts), int(refs)


def _purge_completed(
    conn: sa.Connection, store: Store, report: CleanupReport, retention: float
) -> None:
    si, c, q, sp = schema.service_instance, schema.convoy, schema.queue, schema.suspended
    # a convoy whose first message was terminated before any step committed names an
    # instance that will never exist; nothing waits for it
    orphans = conn.execute(
        c.delete()
        .where(
            c.c.created_at < store.dialect.now_plus(-retention),
            ~sa.exists().where(si.c.id == c.c.instance_id),
            ~sa.exists().where(q.c.instance_id == c.c.instance_id),
            ~sa.exists().where(sp.c.instance_id == c.c.instance_id),
        )
        .returning(c.c.instance_id)
    ).all()
    report.purged_instances += len(orphans)
    rows = conn.execute(
        sa.select(si.c.id, si.c.service, si.c.completed_at).where(
            si.c.state.in_(sorted(ENDED)),  # completed or terminated
            si.c.completed_at < store.dialect.now_plus(-retention),
        )
    ).all()
    if not rows:
        return
    done = {r.id: r.service for r in rows}
    # completion removed these already; a message routed as the instance completed
    # (another process's publish) is caught here at the latest
    report.discarded_messages += service_instances.complete(
        conn, store.dialect, done, store_clock.now(conn), {r.id: r.completed_at for r in rows}
    )
    conn.execute(si.delete().where(si.c.id.in_(list(done))))
    report.purged_instances += len(done)


INSTANCE_RETENTION_SECONDS = 24 * 3600.0
"""How long a completed service instance is kept (its state, for reporting and to name
it in a zombie's report) before cleanup deletes it."""

RECEIPT_RETENTION_SECONDS = 7 * 24 * 3600.0
"""How long a receive location's receipts are kept: a location that crashed after a
publish must restart within this to be sure not to publish that input again."""


def _expire_unrun(store: Store, stop: Callable[[], bool] | None) -> int:
    """Sweep the expired entries of the hosts with no registered instance, a batch a
    transaction (:func:`messagebox.storage.expiry.sweep`); how many."""
    with store.transaction() as conn:
        running = {i.host for i in registry.instances(conn, None)}
        hosts = [h.name for h in subscriptions.list_hosts(conn) if h.name not in running]
    total = 0
    for host in hosts:
        while stop is None or not stop():
            with store.transaction(serial=True) as conn:
                swept = expiry.sweep(conn, store.dialect, host)
            total += swept.total
            if swept.total < EXPIRY_BATCH:
                break
    return total


def run(
    store: Store,
    *,
    batch: int = 10_000,
    progress: Callable[[str], None] | None = None,
    stop: Callable[[], bool] | None = None,
    receipt_retention_seconds: float = RECEIPT_RETENTION_SECONDS,
    instance_retention_seconds: float = INSTANCE_RETENTION_SECONDS,
) -> CleanupReport:
    """Run every cleanup step once; deletes in chunks of ``batch`` messages, each a
    transaction, and ends between two when ``stop()`` is true (a host instance that
    stops)."""
    started = time.monotonic()
    report = CleanupReport()
    say = progress or (lambda _text: None)
    with store.transaction(serial=True) as conn:
        if not store.dialect.try_lock_cleanup(conn):
            report.skipped = True
            say("another cleanup is running; skipped")
            return report
        for host in subscriptions.list_hosts(conn):
            dead, released = registry.release_dead(
                conn, store.dialect, host.name, host.settings.dead_after_seconds
            )
            report.dead_instances += len(dead)
            report.released_leases += released
        _purge_completed(conn, store, report, instance_retention_seconds)
        r = schema.receipt
        report.receipts = conn.execute(
            r.delete().where(r.c.received_at < store.dialect.now_plus(-receipt_retention_seconds))
        ).rowcount
        report.routing_versions = subscriptions.prune_versions(conn)
    report.expired = _expire_unrun(store, stop)
    if report.expired:
        say(f"{report.expired} expired entries of hosts no instance runs suspended or dropped")
    with store.transaction() as conn:
        settings = tracking.read_settings(conn)
        retention = settings.retention
        report.tracking_events = tracking.trim(conn, store.dialect, retention)
        report.tracked_trimmed = tracking.trim_messages(conn, store.dialect, retention)
        report.rollup_rows = rollup.trim(conn)
    if report.tracking_events:
        say(f"trimmed {report.tracking_events} tracked events older than {retention}")
    if report.receipts:
        say(f"trimmed {report.receipts} receipts older than {receipt_retention_seconds:g} s")
    if report.dead_instances or report.released_leases:
        say(
            f"released {report.released_leases} leases of "
            f"{report.dead_instances} dead host instances"
        )
    while True:
        if stop is not None and stop():
            report.stopped = True
            break
        with store.transaction(serial=True) as conn:
            if not store.dialect.try_lock_cleanup(conn):
                report.skipped = True
                break
            # uncached: SQLAlchemy's statement cache keeps the first statement of each
            # shape with its bound values, here a chunk's ids: 10 MB of UUIDs kept for
            # the process's life after one cleanup (seen as a host instance's RSS step)
            conn.execution_options(compiled_cache=None)
            msgs, released = _zero_referenced(conn, batch)
            if not msgs:
                break
            n_msgs, n_parts, n_refs = _delete_messages(conn, msgs, settings.enabled)
        report.messages += n_msgs
        report.tracked_messages += n_msgs if settings.enabled else 0
        report.parts += n_parts
        report.reference_rows += n_refs
        say(f"deleted {report.messages} unreferenced messages so far")
        if released < batch:
            break
    report.seconds = time.monotonic() - started
    return report
