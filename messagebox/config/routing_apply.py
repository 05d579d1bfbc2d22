"""Applying a routing configuration: the difference with what is live, made in one
transaction, and recorded as a numbered version (``mb_config_version``).

A publish routes against the subscriptions before an apply or after it, never a mix:
the apply takes the subscription lock and commits every change, with its routing
versions, at once (:mod:`messagebox.storage.routing_index`). What changes in place keeps the
subscription's id and its waiting entries: its filter (waiting entries stay, routed by
the old one), priority and ordered (waiting entries take the new values; one being
delivered finishes as it is), on_failure, on_expiry (for the entries that expire from
then on) and state (as ``set_service_state`` does it, for that subscription). A change
of service, host, kind, correlation or ordered_by replaces the subscription: the old
one is removed (its waiting entries are suspended as ``subscription-removed``,
re-routable: a reroute gives them the new subscription's keys) and a new one made.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.config.routing_file import Declared, RoutingConfig, dump, settings_changes
from messagebox.errors import Conflict, NotFound
from messagebox.models import SERVICE_UNENLISTED, SUBSCRIPTION_REMOVED, State, Subscription
from messagebox.predicates import format_filter
from messagebox.storage import schema, store_clock, subscriptions, suspension
from messagebox.storage.dialects import Dialect

IN_PLACE = ("filter", "priority", "ordered", "on_failure", "on_expiry", "state")
"""What an apply changes on a live subscription; any other difference replaces it."""

_FIELDS = ("service", "host", "kind", "correlation", "ordered_by", *IN_PLACE)


@dataclass(frozen=True)
class SubscriptionChange:
    """One subscription that an apply adds, removes, changes in place or replaces."""

    name: str
    action: str
    """``add``, ``remove``, ``change`` (in place) or ``replace`` (remove, then add)."""
    before: Declared | None
    after: Declared | None
    fields: tuple[str, ...] = ()
    """What differs (``change`` and ``replace``)."""

    def describe(self) -> list[str]:
        """Lines for a person: the action, then each field ``old -> new``."""
        sign = {"add": "+", "remove": "-", "change": "~", "replace": "-/+"}[self.action]
        head = f"{sign} subscription {self.name}"
        if self.action == "add" and self.after:
            return [
                f"{head} (service {self.after.service}, host {self.after.host})",
                f"    filter: {format_filter(self.after.filter)}",
            ]
        if self.action == "remove" and self.before:
            return [
                f"{head} (service {self.before.service}; its waiting entries are suspended)",
                f"    filter: {format_filter(self.before.filter)}",
            ]
        lines = [
            head
            + ("" if self.action == "change" else " (replaced: its waiting entries are suspended)")
        ]
        assert self.before
        assert self.after
        for name in self.fields:
            old, new = _field(self.before, name), _field(self.after, name)
            if name == "filter":
                lines += [f"    filter: - {old}", f"            + {new}"]
            else:
                lines.append(f"    {name}: {old} -> {new}")
        return lines


@dataclass(frozen=True)
class HostChange:
    name: str
    action: str
    """``add``, ``remove`` or ``change`` (settings)."""
    settings: dict[str, tuple[Any, Any]]
    """Settings that differ: name → (old, new); for ``add``, those not at their default."""

    def describe(self) -> list[str]:
        sign = {"add": "+", "remove": "-", "change": "~"}[self.action]
        return [f"{sign} host {self.name}"] + [
            f"    {k}: {old} -> {new}" for k, (old, new) in sorted(self.settings.items())
        ]


@dataclass(frozen=True)
class ConfigDiff:
    """What applying a configuration would change."""

    hosts: tuple[HostChange, ...]
    subscriptions: tuple[SubscriptionChange, ...]

    @property
    def changed(self) -> bool:
        return bool(self.hosts or self.subscriptions)

    def describe(self) -> list[str]:
        if not self.changed:
            return ["no change"]
        changes: list[HostChange | SubscriptionChange] = [*self.hosts, *self.subscriptions]
        return [line for c in changes for line in c.describe()]

    def as_json(self) -> dict[str, Any]:
        return {
            "hosts": [
                {"name": h.name, "action": h.action, "settings": h.settings} for h in self.hosts
            ],
            "subscriptions": [
                {
                    "name": c.name,
                    "action": c.action,
                    "fields": list(c.fields),
                    "before": _decl_json(c.before),
                    "after": _decl_json(c.after),
                }
                for c in self.subscriptions
            ],
        }


def _field(decl: Declared, name: str) -> Any:
    value = getattr(decl, name)
    if name == "filter":
        return format_filter(value)
    if name == "correlation":
        return list(value)
    return value.value if hasattr(value, "value") else value


def _decl_json(decl: Declared | None) -> dict[str, Any] | None:
    return None if decl is None else {name: _field(decl, name) for name in ("name", *_FIELDS)}


def diff(live: RoutingConfig, wanted: RoutingConfig) -> ConfigDiff:
    """The changes that turn ``live`` into ``wanted``."""
    hosts: list[HostChange] = []
    for name in sorted(live.hosts.keys() | wanted.hosts.keys()):
        old, new = live.hosts.get(name), wanted.hosts.get(name)
        if new is None:
            hosts.append(HostChange(name, "remove", {}))
        elif old is None:
            hosts.append(HostChange(name, "add", settings_changes(type(new)(), new)))
        elif old != new:
            hosts.append(HostChange(name, "change", settings_changes(old, new)))
    subs: list[SubscriptionChange] = []
    for name in sorted(live.subscriptions.keys() | wanted.subscriptions.keys()):
        before, after = live.subscriptions.get(name), wanted.subscriptions.get(name)
        if before is None:
            subs.append(SubscriptionChange(name, "add", None, after))
        elif after is None:
            subs.append(SubscriptionChange(name, "remove", before, None))
        else:
            fields = tuple(f for f in _FIELDS if not _same(before, after, f))
            if fields:
                action = "change" if set(fields) <= set(IN_PLACE) else "replace"
                subs.append(SubscriptionChange(name, action, before, after, fields))
    return ConfigDiff(tuple(hosts), tuple(subs))


def _same(a: Declared, b: Declared, name: str) -> bool:
    return a.same_filter(b) if name == "filter" else getattr(a, name) == getattr(b, name)


# --- storage ---


@dataclass(frozen=True)
class ConfigVersion:
    """One applied configuration."""

    version: int
    applied_at: datetime
    who: str
    digest: str
    changes: dict[str, Any]
    """:meth:`ConfigDiff.as_json` of what it changed."""
    rollback_of: int | None
    content: str | None = None
    """The routing file as applied (read by :func:`version`, not by :func:`versions`)."""

    @property
    def summary(self) -> str:
        """What it changed, by action: ``1 add, 2 change`` (``-``: nothing)."""
        counts: dict[str, int] = {}
        for c in (*self.changes.get("hosts", []), *self.changes.get("subscriptions", [])):
            counts[c["action"]] = counts.get(c["action"], 0) + 1
        return ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) or "-"


def live_config(conn: sa.Connection, subs: Sequence[Subscription] | None = None) -> RoutingConfig:
    """The configuration the store holds (of ``subs`` when the caller read them already)."""
    if subs is None:
        subs = subscriptions.list_subscriptions(conn)
    return RoutingConfig.of(subscriptions.list_hosts(conn), subs)


def apply(
    conn: sa.Connection,
    dialect: Dialect,
    wanted: RoutingConfig,
    *,
    content: str,
    who: str,
    rollback_of: int | None = None,
) -> tuple[ConfigDiff, int | None]:
    """Make the store's configuration ``wanted``, in the caller's transaction; returns
    what changed and the version recorded (None when neither the configuration nor the
    newest version's differ)."""
    from messagebox.specs import check_spec

    dialect.lock_subscriptions(conn)
    live = live_config(conn)
    change = diff(live, wanted)
    now = store_clock.now(conn)
    for h in change.hosts:
        if h.action == "add":
            subscriptions.create_host(conn, h.name, wanted.hosts[h.name], now)
        elif h.action == "change":
            subscriptions.update_host(conn, h.name, wanted.hosts[h.name])
    ids = {s.name: s.id for s in subscriptions.list_subscriptions(conn) if s.instance_id is None}
    gone = [ids[c.name] for c in change.subscriptions if c.action in ("remove", "replace")]
    if gone:
        suspension.suspend_waiting(conn, dialect, gone, SUBSCRIPTION_REMOVED)
        subscriptions.unsubscribe(conn, dialect, gone)
        suspension.orphan_suspended(conn, gone)
    new = [c.after for c in change.subscriptions if c.action in ("add", "replace") and c.after]
    if new:
        specs = [check_spec(i, d.spec()) for i, d in enumerate(new)]
        subscriptions.subscribe(conn, dialect, specs, now)
    for c in change.subscriptions:
        if c.action == "change" and c.after:
            _change_in_place(conn, dialect, ids[c.name], c)
    for h in change.hosts:
        if h.action == "remove":
            _remove_host(conn, h.name)
    version = _record(conn, live, wanted, change, content=content, who=who, rollback_of=rollback_of)
    return change, version


def _change_in_place(
    conn: sa.Connection, dialect: Dialect, sub_id: int, c: SubscriptionChange
) -> None:
    assert c.after is not None
    after = c.after
    if "filter" in c.fields:
        subscriptions.replace_filter(conn, dialect, sub_id, after.filter)
    s = schema.subscription
    values = {
        f: (getattr(after, f).value if f in ("on_failure", "on_expiry") else getattr(after, f))
        for f in ("priority", "ordered", "on_failure", "on_expiry")
        if f in c.fields
    }
    if values:
        conn.execute(s.update().where(s.c.id == sub_id).values(**values))
        subscriptions.changed(conn, dialect, [sub_id])
        q = schema.queue
        waiting = {k: v for k, v in values.items() if k in ("priority", "ordered")}
        if waiting:  # the entries waiting for it follow; a leased one finishes as it is
            conn.execute(
                q.update()
                .where(
                    q.c.sub == sub_id,
                    sa.or_(q.c.lease_expires.is_(None), q.c.lease_expires < sa.func.now()),
                )
                .values(**waiting)
            )
    if "state" in c.fields:
        suspension.hold(conn, [sub_id], after.state)
        subscriptions.changed(conn, dialect, [sub_id])
        if after.state is State.UNENLISTED:
            suspension.suspend_waiting(conn, dialect, [sub_id], SERVICE_UNENLISTED)
        elif after.state is State.STARTED:
            dialect.notify(conn, [after.host])


def blockers(conn: sa.Connection, change: ConfigDiff) -> list[str]:
    """Why applying ``change`` now would be refused: each host it removes that is not
    empty (the entries waiting for subscriptions it removes stay there, suspended)."""
    out = []
    for h in change.hosts:
        if h.action != "remove":
            continue
        made = subscriptions.list_subscriptions(conn, host=h.name)
        runtime = [s for s in made if s.instance_id is not None]
        left = subscriptions.host_left(conn, h.name)
        if runtime:
            left = ", ".join(filter(None, [f"{len(runtime)} instance subscriptions", left]))
        if left:
            out.append(
                f"host {h.name} cannot be removed yet ({left}): apply would be refused; "
                "drain it first, or keep it in the file for one more apply"
            )
    return out


def _remove_host(conn: sa.Connection, name: str) -> None:
    made = subscriptions.list_subscriptions(conn, host=name)  # at run time, by orchestrations
    if made:
        raise Conflict(
            f"host {name!r} is not in the routing file but has {len(made)} instance "
            "subscription(s) of running orchestrations; nothing was applied"
        )
    left = subscriptions.host_left(conn, name)
    if left:
        raise Conflict(
            f"host {name!r} is not in the routing file but is not empty ({left}; the "
            "waiting entries of subscriptions this file removes or moves off it count, "
            "suspended there): drain it first, or keep it in the file for one more "
            "apply; nothing was applied"
        )
    subscriptions.delete_host(conn, name)


FIRST = "(the configuration live before the first apply)"
"""Who version 1 names when it records what was live before the first apply."""


def _record(
    conn: sa.Connection,
    live: RoutingConfig,
    wanted: RoutingConfig,
    change: ConfigDiff,
    *,
    content: str,
    who: str,
    rollback_of: int | None,
) -> int | None:
    cv = schema.config_version
    digest = wanted.digest()
    newest = conn.execute(
        sa.select(cv.c.version, cv.c.digest).order_by(cv.c.version.desc()).limit(1)
    ).first()
    if not change.changed and newest is not None and newest.digest == digest:
        return None
    version = newest.version if newest else 0
    rows: list[tuple[int, str, str, str, ConfigDiff, int | None]] = []
    if newest is None and (live.hosts or live.subscriptions):  # keep it, to roll back to
        version += 1
        empty = ConfigDiff((), ())
        rows.append((version, FIRST, live.digest(), dump(live), empty, None))
    version += 1
    rows.append((version, who, digest, content, change, rollback_of))
    for number, by, hashed, text, what, of in rows:
        conn.execute(
            cv.insert().values(
                version=number,
                applied_at=store_clock.now(conn),
                who=by,
                digest=hashed,
                content=text,
                changes=json.dumps(what.as_json(), default=str),
                rollback_of=of,
            )
        )
    return int(version)


def versions(conn: sa.Connection, limit: int = 100) -> list[ConfigVersion]:
    """The newest applied versions, newest first (without their files)."""
    cv = schema.config_version
    rows = conn.execute(
        sa.select(
            cv.c.version, cv.c.applied_at, cv.c.who, cv.c.digest, cv.c.changes, cv.c.rollback_of
        )
        .order_by(cv.c.version.desc())
        .limit(limit)
    )
    return [_version(r) for r in rows]


def version(conn: sa.Connection, number: int) -> ConfigVersion:
    cv = schema.config_version
    row = conn.execute(sa.select(cv).where(cv.c.version == number)).first()
    if row is None:
        raise NotFound(f"no routing version {number} (see: messagebox versions)")
    return _version(row, row.content)


def _version(row: Any, content: str | None = None) -> ConfigVersion:
    return ConfigVersion(
        version=int(row.version),
        applied_at=row.applied_at,
        who=row.who,
        digest=row.digest,
        changes=json.loads(row.changes),
        rollback_of=row.rollback_of,
        content=content,
    )
