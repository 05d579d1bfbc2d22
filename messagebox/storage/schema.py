"""The tables, as one SQLAlchemy Core ``MetaData`` (docs/concepts.md: Spool).

Subscriptions live in typed predicate tables, one per operator family; a predicate that
several subscriptions share is stored once (``mb_predicate.key`` is unique) and linked to
each group that uses it. Every group names one *anchor* predicate, chosen to be the most
selective (equality first), from which routing starts.

Messages are stored once: ``mb_spool`` (context) and ``mb_part`` (bytes, the first
fragment inline, the rest in ``mb_fragment``). Each queue or suspended entry holds one
reference, logged insert-only in ``mb_ref_add`` / ``mb_ref_release``.

No table is ever reflected; ids come from sequences or from the application.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

SCHEMA_VERSION = "23"

metadata = sa.MetaData()

block_seq = sa.Sequence("mb_block_seq", metadata=metadata)
"""Every numeric id comes from a block of ``ID_BLOCK`` ids: one ``nextval`` per block, so a
publish or a bulk subscribe takes its ids with one statement (DuckDB has no SERIAL)."""

ID_BLOCK = 1 << 20

Stamp = sa.DateTime(timezone=True)

meta = sa.Table(
    "mb_meta",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

host = sa.Table(
    "mb_host",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("settings", sa.Text, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
)

prop = sa.Table(
    "mb_property",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("name", sa.Text, nullable=False, unique=True),
)

subscription = sa.Table(
    "mb_subscription",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("service", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("instance_id", sa.Text),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("ordered", sa.Boolean, nullable=False),
    sa.Column("on_failure", sa.Text, nullable=False),
    sa.Column("filter", sa.Text, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
    # JSON list of property names: an activation subscription that routes each message
    # to the running instance of its service for those properties' values (a convoy)
    sa.Column("correlation", sa.Text),
    # what becomes of its entries that expire before delivery: suspend or drop
    sa.Column("on_expiry", sa.Text, nullable=False, server_default="suspend"),
    # the property whose value orders its entries per key (ordered_by; NULL: none)
    sa.Column("ordered_by", sa.Text),
)
sa.Index("mb_subscription_service", subscription.c.service)

predicate = sa.Table(
    "mb_predicate",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("key", sa.Text, nullable=False, unique=True),
    sa.Column("prop", sa.BigInteger, nullable=False),
    sa.Column("op", sa.Text, nullable=False),
)

pred_str = sa.Table(
    "mb_pred_str",
    metadata,
    sa.Column("pred", sa.BigInteger, nullable=False),
    sa.Column("prop", sa.BigInteger, nullable=False),
    sa.Column("op", sa.Text, nullable=False),
    # PostgreSQL compares in code-point order only under the "C" collation; DuckDB always does.
    sa.Column("v", sa.Text().with_variant(sa.Text(collation="C"), "postgresql"), nullable=False),
)
sa.Index("mb_pred_str_lookup", pred_str.c.prop, pred_str.c.v)
sa.Index("mb_pred_str_pred", pred_str.c.pred)

pred_num = sa.Table(
    "mb_pred_num",
    metadata,
    sa.Column("pred", sa.BigInteger, nullable=False),
    sa.Column("prop", sa.BigInteger, nullable=False),
    sa.Column("fam", sa.SmallInteger, nullable=False),
    sa.Column("op", sa.Text, nullable=False),
    sa.Column("hi", sa.Double, nullable=False),
    sa.Column("lo", sa.Double, nullable=False),
)
sa.Index("mb_pred_num_lookup", pred_num.c.prop, pred_num.c.fam, pred_num.c.hi)
sa.Index("mb_pred_num_pred", pred_num.c.pred)

pred_mask = sa.Table(
    "mb_pred_mask",
    metadata,
    sa.Column("pred", sa.BigInteger, nullable=False),
    sa.Column("prop", sa.BigInteger, nullable=False),
    sa.Column("mask", sa.BigInteger, nullable=False),
)
sa.Index("mb_pred_mask_pred", pred_mask.c.pred)

pred_exists = sa.Table(
    "mb_pred_exists",
    metadata,
    sa.Column("pred", sa.BigInteger, nullable=False),
    sa.Column("prop", sa.BigInteger, nullable=False),
    sa.Column("op", sa.Text, nullable=False),
)
sa.Index("mb_pred_exists_pred", pred_exists.c.pred)

group = sa.Table(
    "mb_group",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("sub", sa.BigInteger, nullable=False),
    sa.Column("n_pos", sa.Integer, nullable=False),
    sa.Column("anchor", sa.BigInteger),
)
sa.Index("mb_group_anchor", group.c.anchor)
sa.Index("mb_group_sub", group.c.sub)

group_pred = sa.Table(
    "mb_group_pred",
    metadata,
    sa.Column("grp", sa.BigInteger, nullable=False),
    sa.Column("pred", sa.BigInteger, nullable=False),
)
sa.Index("mb_group_pred_grp", group_pred.c.grp)
sa.Index("mb_group_pred_pred", group_pred.c.pred)

routing_change = sa.Table(
    "mb_routing_change",
    metadata,
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("sub", sa.BigInteger, nullable=False),
    sa.Column("changed_at", Stamp, nullable=False),
)
"""The subscriptions each routing version changed (added, removed, or a state change).
Versions are consecutive and commit in order (written under the subscription lock), so a
process's in-memory routing index catches up by reading the rows after its version."""
sa.Index("mb_routing_change_version", routing_change.c.version)

spool = sa.Table(
    "mb_spool",
    metadata,
    sa.Column("id", sa.Uuid, primary_key=True),
    sa.Column("context", sa.Text, nullable=False),
    sa.Column("n_parts", sa.Integer, nullable=False),
    sa.Column("body_part", sa.Text, nullable=False),
    sa.Column("published_at", Stamp, nullable=False),
    sa.Column("publisher", sa.Text, nullable=False),
)
sa.Index("mb_spool_published", spool.c.published_at, spool.c.id)
"""Stored messages by publish time, then id (PostgreSQL; DuckDB prunes by the zone maps
of its row groups instead): the order a search walks, a page at a time, from the newest
of its window (:mod:`messagebox.ops.search`)."""

message_part = sa.Table(
    "mb_message_part",
    metadata,
    sa.Column("msg", sa.Uuid, primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("part", sa.Uuid, nullable=False),
)
sa.Index("mb_message_part_part", message_part.c.part)

part = sa.Table(
    "mb_part",
    metadata,
    sa.Column("id", sa.Uuid, primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("n_fragments", sa.Integer, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

fragment = sa.Table(
    "mb_fragment",
    metadata,
    sa.Column("part", sa.Uuid, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

queue = sa.Table(
    "mb_queue",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("msg", sa.Uuid, nullable=False),
    sa.Column("sub", sa.BigInteger, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("available_at", Stamp, nullable=False),
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_expires", Stamp),
    sa.Column("enqueued_at", Stamp, nullable=False),
    sa.Column("instance_id", sa.Text),
    sa.Column("ordered", sa.Boolean, nullable=False),
    sa.Column("claimed_at", Stamp),  # the first claim; a give-back or lapsed lease keeps it
    # failed deliveries, and deliveries started (started_by) whose host then ended: the
    # count max_attempts limits (attempts also counts deliveries cut short unstarted)
    sa.Column("charges", sa.Integer, nullable=False, server_default=sa.text("0")),
    # this delivery follows one that ended with no outcome (its lease lapsed, was
    # released from a dead instance or at a stop): handled alone, marked started first
    sa.Column("interrupted", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("started_by", sa.Text),  # the instance that marked this delivery started
    sa.Column("crashed_by", sa.Text),  # the last instance that ended while handling it
    # past this (the message's expiry, or its host's message_ttl_seconds) the entry is
    # never handed to a service: the expiry sweep suspends or drops it (expiry.py)
    sa.Column("expires_at", Stamp),
    # the entry's key, where its subscription is ordered by a property (ordered_by):
    # the property's value in keys.encode's typed form; NULL for every other entry
    sa.Column("order_key", sa.Text),
)
sa.Index("mb_queue_claim", queue.c.host, queue.c.state, queue.c.priority.desc(), queue.c.id)
sa.Index(
    "mb_queue_plain",
    queue.c.host,
    queue.c.priority.desc(),
    queue.c.id,
    postgresql_where=sa.and_(
        queue.c.state == "ready",
        sa.not_(queue.c.ordered),
        queue.c.instance_id.is_(None),
        queue.c.order_key.is_(None),
    ),
)
"""What a plain claim walks, in its order (PostgreSQL): by ``mb_queue_claim`` it walked
past every instance and ordered entry of the host first, 37 ms a claim behind 200,000."""
sa.Index(
    "mb_queue_ordered",
    queue.c.host,
    queue.c.sub,
    queue.c.id,
    postgresql_where=queue.c.ordered,
)
# PostgreSQL: each key's entries in publish order (a key's head and run: mb_claim_keyed),
# and a host's keyed entries in claim order (what that claim walks, past no plain entry:
# with mb_queue_claim's columns, as the smaller index, else the planner took that one,
# 5 ms a claim past 20,000 plain entries)
_keyed = queue.c.order_key.is_not(None)
sa.Index("mb_queue_keyed", queue.c.host, queue.c.sub, queue.c.order_key, queue.c.id,
         postgresql_where=_keyed)  # fmt: skip
sa.Index("mb_queue_keyed_claim", queue.c.host, queue.c.state, queue.c.priority.desc(),
         queue.c.id, postgresql_where=_keyed)  # fmt: skip
# No index on lease_owner: a claim then changes no indexed column, and PostgreSQL
# updates the row in place (a HOT update, with the room fillfactor leaves on each page)
# instead of adding an entry to every index of the queue. A claim takes neighbouring
# rows, so a page needs room for a new version of most of its rows, and a claimed
# version is wider than the published one (its lease owner): at fillfactor 50, 80% of
# claims were HOT (the rest added an entry to each of five indexes); at 40, all of them,
# and claim-and-complete ran 15% faster (86-88k msgs/s against 75-77k, batch 100, two
# threads; 600 bytes of WAL a message against 815). Measured earlier at batch 100: 45%
# HOT at 70, and 12.5k msgs/s at 100 against 20k at 50.
QUEUE_FILLFACTOR = 40

CHURN_TABLES = ("mb_queue", "mb_ref_add", "mb_ref_release")
"""Tables whose every row is deleted soon after it is written. On PostgreSQL autovacuum
takes them after a fixed number of dead rows (``CHURN_VACUUM_ROWS``), not a fraction of
the table: a claim scans past the dead rows of the queue until a vacuum removes them."""

CHURN_VACUUM_ROWS = 10_000
sa.Index("mb_queue_msg", queue.c.msg)
sa.Index("mb_queue_sub", queue.c.sub)
sa.Index(
    "mb_queue_due",
    queue.c.host,
    queue.c.available_at,
    postgresql_where=queue.c.available_at > queue.c.enqueued_at,
)
"""The entries due later than they were queued (scheduled, or waiting for a retry), by
due time (PostgreSQL): an idle host instance asks when the next is due. Partial, so
that an entry queued due at once (every plain publish) adds no index entry."""
sa.Index(
    "mb_queue_expiry",
    queue.c.host,
    queue.c.expires_at,
    postgresql_where=queue.c.expires_at.is_not(None),
)
"""The entries that expire, by expiry (PostgreSQL): what the expiry sweep reads."""
sa.Index(
    "mb_queue_instance",
    queue.c.host,
    queue.c.instance_id,
    queue.c.id,
    postgresql_where=queue.c.instance_id.is_not(None),
)

suspended = sa.Table(
    "mb_suspended",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("msg", sa.Uuid, nullable=False),
    sa.Column("sub", sa.BigInteger),
    sa.Column("host", sa.Text),
    sa.Column("resumable", sa.Boolean, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("report", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("suspended_at", Stamp, nullable=False),
    # what resuming needs to put a delivery failure back where it was
    sa.Column("priority", sa.Integer),
    sa.Column("ordered", sa.Boolean),
    sa.Column("instance_id", sa.Text),
    sa.Column("enqueued_at", Stamp),
    sa.Column("order_key", sa.Text),  # the queue entry's, put back by a resume
    # it holds its key: its subscription (ordered_by) stops on failure, and the key's
    # later entries wait until it is resumed or terminated
    sa.Column("holds_key", sa.Boolean, nullable=False, server_default=sa.false()),
)
sa.Index("mb_suspended_msg", suspended.c.msg)
# the keys suspended entries hold (PostgreSQL): what a keyed claim probes per key
sa.Index("mb_suspended_key", suspended.c.sub, suspended.c.order_key,
         postgresql_where=suspended.c.holds_key)  # fmt: skip
sa.Index(
    "mb_suspended_instance",
    suspended.c.instance_id,
    postgresql_where=suspended.c.instance_id.is_not(None),
)

ref_add = sa.Table(
    "mb_ref_add",
    metadata,
    sa.Column("msg", sa.Uuid, nullable=False),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("logged_at", Stamp, nullable=False),
)
sa.Index("mb_ref_add_msg", ref_add.c.msg)

ref_release = sa.Table(
    "mb_ref_release",
    metadata,
    sa.Column("msg", sa.Uuid, nullable=False),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("logged_at", Stamp, nullable=False),
)
sa.Index("mb_ref_release_msg", ref_release.c.msg)


instance = sa.Table(
    "mb_instance",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("hostname", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", Stamp, nullable=False),
    sa.Column("heartbeat_at", Stamp, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
)
"""Running host instances (docs/concepts.md: Hosts); a stale heartbeat marks one dead."""

service_instance = sa.Table(
    "mb_service_instance",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("service", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("correlation", sa.Text, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
    sa.Column("updated_at", Stamp, nullable=False),
    sa.Column("completed_at", Stamp),
)
"""Instances of long-running services (orchestrations; docs/concepts.md: Orchestrations):
their persisted state (``data``, JSON) and ``version``, bumped by each step that
commits. ``state`` is ``running``, ``suspended`` (a step failed past its retries: its
messages wait) or ``completed`` (kept for reporting until cleanup trims it)."""
sa.Index("mb_service_instance_service", service_instance.c.service, service_instance.c.state)

convoy = sa.Table(
    "mb_convoy",
    metadata,
    sa.Column("service", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("instance_id", sa.Text, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
)
"""The running instance of a correlated service per correlation value. Routing creates
a row (or finds it) for every message an activation subscription with a correlation
matches, in the publish's transaction, so concurrent first messages get one instance;
completing the instance deletes it."""
sa.Index("mb_convoy_instance", convoy.c.instance_id)

timer = sa.Table(
    "mb_timer",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("instance_id", sa.Text, nullable=False),
    sa.Column("service", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("sub", sa.BigInteger, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("due_at", Stamp, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
)
"""A service instance's pending timeout: when due, a host instance of ``host`` puts a
timeout message on the instance's queue (and deletes the row)."""
sa.Index("mb_timer_due", timer.c.host, timer.c.due_at)
sa.Index("mb_timer_instance", timer.c.instance_id)

receipt = sa.Table(
    "mb_receipt",
    metadata,
    sa.Column("location", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("messages", sa.Text, nullable=False),
    sa.Column("received_at", Stamp, nullable=False),
)
"""Inputs a receive location has published (a claimed file's token), written in the
publish's transaction: a location that crashed after the commit finds the receipt on
restart and does not publish the input again. Cleanup trims them past their retention."""
sa.Index("mb_receipt_received_at", receipt.c.received_at)

tracking = sa.Table(
    "mb_tracking",
    metadata,
    sa.Column("tracked_at", Stamp, nullable=False),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("msg", sa.Uuid, nullable=False),
    sa.Column("sub", sa.BigInteger),
    sa.Column("host", sa.Text),
    sa.Column("entry", sa.BigInteger),
    sa.Column("detail", sa.Text),
)
"""Tracked events (:mod:`messagebox.storage.tracking`), written only while tracking is enabled,
in the transaction of what they record; cleanup trims them past their retention."""
sa.Index("mb_tracking_msg", tracking.c.msg)
sa.Index("mb_tracking_at", tracking.c.tracked_at)

tracked_message = sa.Table(
    "mb_tracked_message",
    metadata,
    sa.Column("id", sa.Uuid, primary_key=True),
    sa.Column("context", sa.Text, nullable=False),
    sa.Column("published_at", Stamp, nullable=False),
    sa.Column("publisher", sa.Text, nullable=False),
    sa.Column("deleted_at", Stamp, nullable=False),
)
"""The spool rows of messages the cleanup job deleted while tracking was on (their
context, not their parts): a search still finds them, as deleted. Trimmed with the
tracked events, by publish time, past the tracking retention."""
sa.Index("mb_tracked_message_published", tracked_message.c.published_at, tracked_message.c.id)

audit = sa.Table(
    "mb_audit",
    metadata,
    sa.Column("acted_at", Stamp, nullable=False),
    sa.Column("who", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("via", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target", sa.Text),
    sa.Column("entries", sa.BigInteger),
    sa.Column("detail", sa.Text),
)
"""Every operator action (:mod:`messagebox.storage.audit`): who did what, when, through which
door (the console, the command line, a served command), to how many entries."""
sa.Index("mb_audit_acted_at", audit.c.acted_at)

rollup = sa.Table(
    "mb_rollup",
    metadata,
    sa.Column("minute", Stamp, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
)
"""Per-minute counts of what each process committed (published, routed, delivered,
failed, suspended, by host), and sampled queue depths (``depth`` by host), kept whether
or not tracking is on (:mod:`messagebox.storage.rollup`); cleanup trims them after a day."""
sa.Index("mb_rollup_minute", rollup.c.minute)

config_version = sa.Table(
    "mb_config_version",
    metadata,
    sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("applied_at", Stamp, nullable=False),
    sa.Column("who", sa.Text, nullable=False),
    sa.Column("digest", sa.Text, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("changes", sa.Text, nullable=False),
    sa.Column("rollback_of", sa.BigInteger),
)
"""Each routing configuration applied (:mod:`messagebox.config.routing_apply`): the routing
file as given (``content``), the sha256 of the configuration it declares (``digest``),
what it changed (JSON) and, for a rollback, the version it re-applied."""

user = sa.Table(
    "mb_user",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("password_hash", sa.Text, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
    sa.Column("disabled", sa.Boolean, nullable=False, server_default=sa.false()),
)
"""The console's named users (:mod:`messagebox.ops.users`): a role (reader, operator,
admin) and an Argon2id hash of the password, never the password."""

session = sa.Table(
    "mb_session",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),  # the SHA-256 of the cookie's token
    sa.Column("who", sa.Text, nullable=False),  # a user's name, or token:admin|reader
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("created_at", Stamp, nullable=False),
    sa.Column("expires_at", Stamp, nullable=False),
    sa.Column("last_seen", Stamp, nullable=False),
    # a token's session: an HMAC, keyed by the cookie's token, of the token it logged
    # in with (it ends when the console's token changes); NULL for a user's
    sa.Column("bound", sa.Text),
)
"""Console sessions, kept in the store so that they outlive the console's process; the
raw token is only ever in the browser's cookie."""
sa.Index("mb_session_who", session.c.who)
sa.Index("mb_session_expires_at", session.c.expires_at)


def queue_columns() -> list[sa.Column[Any]]:
    """The queue's columns a suspension or a step reads from the rows it deletes."""
    q = queue
    return [
        q.c.id,
        q.c.msg,
        q.c.sub,
        q.c.host,
        q.c.attempts,
        q.c.priority,
        q.c.ordered,
        q.c.instance_id,
        q.c.enqueued_at,
        q.c.order_key,
    ]
