"""Hosts and subscriptions: validated, then written one transaction a call (the storage
side of :class:`~messagebox.engine.MessageBox`'s host and subscription methods)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from messagebox import clock, routing_lint, schema, subscriptions, suspension, typecheck
from messagebox.errors import (
    Conflict,
    MessageBoxError,
    UnknownHost,
    UnknownSubscription,
    ValidationError,
)
from messagebox.fence import Fence
from messagebox.models import (
    SERVICE_UNENLISTED,
    SUBSCRIPTION_REMOVED,
    Host,
    HostSettings,
    Kind,
    OnExpiry,
    OnFailure,
    State,
    Subscription,
)
from messagebox.predicates import Filter, to_filter
from messagebox.predicates.model import Op
from messagebox.properties import canonical_name, check_text
from messagebox.store import Store
from messagebox.suggest import did_you_mean

log = logging.getLogger("messagebox.typecheck")
lint_log = logging.getLogger("messagebox.lint")

SPEC_FIELDS = frozenset(
    {
        "service",
        "host",
        "filter",
        "name",
        "kind",
        "instance_id",
        "priority",
        "state",
        "ordered",
        "on_failure",
        "on_expiry",
        "correlation",
        "ordered_by",
    }
)
"""What a subscription spec (a dict of ``subscribe``'s arguments) may give."""


def check_name(what: str, name: object) -> str:
    """A host, service or subscription name, checked (docs/reference.md: Names): a str
    of 1 to 256 characters, without whitespace at either end, control or format characters
    (Unicode categories Cc, Cf, Cs, Co, Cn, Zl, Zp) or any of ``<>&"'`` and the backtick,
    so that a name printed on a terminal or a page cannot drive it."""
    import unicodedata

    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        raise ValidationError(
            f"{what} name {name!r} must be a non-empty str of at most 256 characters"
        )
    try:
        check_text(name)  # PostgreSQL refuses NUL, every driver a lone surrogate
    except ValueError as exc:
        raise ValidationError(f"{what} name {name!r}: {exc}") from exc
    if name != name.strip():
        raise ValidationError(f"{what} name {name!r} starts or ends with whitespace")
    kinds = {
        "Cc": "control character",
        "Cf": "format character",
        "Cs": "surrogate",
        "Co": "private-use character",
        "Cn": "unassigned character",
        "Zl": "line separator",
        "Zp": "paragraph separator",
    }
    for at, char in enumerate(name):
        if char in "<>&\"'`":
            why = f"{char!r} (none of <>&\"'` is allowed)"
        elif (kind := kinds.get(unicodedata.category(char))) is not None:
            why = f"the {kind} {ascii(char)[1:-1]}"
        else:
            continue
        raise ValidationError(f"{what} name {name!r} has {why} at index {at}")
    return name


def check_host(conn: sa.Connection, host: str | None) -> None:
    """Raise :class:`UnknownHost` for a host filter that names no host (a typo would
    otherwise match nothing, silently)."""
    if host is None:
        return
    try:
        check_text(host)
    except ValueError:  # no host can have this name (and PostgreSQL refuses to look it up)
        raise UnknownHost(f"no host named {host!r}") from None
    h = schema.host
    if conn.execute(sa.select(h.c.name).where(h.c.name == host)).first() is None:
        raise unknown_host(host, conn.execute(sa.select(h.c.name)).scalars())


def unknown_host(name: str, known: Iterable[str]) -> UnknownHost:
    """No host ``name``, with the nearest of the ``known`` hosts' names."""
    return UnknownHost(f"no host named {name!r}{did_you_mean(name, known)}")


def _correlation(index: int | str, service: str, names: object) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValidationError(
            f"subscription {index} of {service!r}: correlation must be a list of property names"
        )
    checked = []
    for name in names:
        try:
            checked.append(canonical_name(name))
        except (ValueError, TypeError) as exc:
            raise ValidationError(
                f"subscription {index} of {service!r}: correlation property {name!r}: {exc}"
            ) from exc
    if len(set(checked)) != len(checked):
        raise ValidationError(
            f"subscription {index} of {service!r}: a correlation property is given twice"
        )
    return tuple(checked)


def _fields(index: int | str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's enumerated and named fields, checked."""
    unknown = set(args) - SPEC_FIELDS
    if unknown:
        raise ValidationError(f"subscription {index}: unknown field {sorted(unknown)[0]!r}")
    try:
        service = check_name("service", args.get("service"))
        host = check_name("host", args.get("host"))
        name = args.get("name")
        if name is not None:
            check_name("subscription", name)
        return {
            "service": service,
            "host": host,
            "name": name,
            "kind": Kind(args.get("kind", Kind.ACTIVATION)),
            "state": State(args.get("state", State.STARTED)),
            "on_failure": OnFailure(args.get("on_failure", OnFailure.SUSPEND)),
            "on_expiry": OnExpiry.of(args.get("on_expiry", OnExpiry.SUSPEND)),
        }
    except ValueError as exc:
        raise ValidationError(f"subscription {index}: {exc}") from exc


def check_spec(index: int | str, spec: Mapping[str, Any]) -> subscriptions.SubscriptionSpec:
    """One subscription spec, validated (errors name it by ``index``, its position or
    its name as a ``repr``, and service)."""
    args = dict(spec)
    fields = _fields(index, args)
    service, kind = fields["service"], fields["kind"]
    instance_id = args.get("instance_id")
    priority = args.get("priority", 0)
    if instance_id is not None:
        try:
            check_text(str(instance_id))
        except ValueError as exc:
            raise ValidationError(
                f"subscription {index} of {service!r}: instance_id {instance_id!r}: {exc}"
            ) from exc
    correlation = _correlation(index, service, args.get("correlation") or ())
    if kind is Kind.ACTIVATION and instance_id is not None:
        raise ValidationError(
            f"subscription {index} of {service!r}: only instance subscriptions take an instance_id"
        )
    if kind is Kind.INSTANCE and (instance_id is None) == (not correlation):
        raise ValidationError(
            f"subscription {index} of {service!r}: an instance subscription needs "
            "either an instance_id or a correlation (not both)"
        )
    if type(priority) is not int or not -1000 <= priority <= 1000:
        raise ValidationError(f"subscription {index}: priority must be an int in -1000..1000")
    filt = to_filter(args.get("filter"))
    ordered = bool(args.get("ordered", False))
    ordered_by = _ordered_by(index, service, args.get("ordered_by"), filt)
    if ordered_by is not None and (ordered or kind is Kind.INSTANCE or correlation):
        what = (
            "ordered=True (one order for the whole subscription)"
            if ordered
            else ("an instance subscription" if kind is Kind.INSTANCE else "a correlation")
        )
        raise ValidationError(
            f"subscription {index} of {service!r}: ordered_by {ordered_by!r} cannot go with "
            f"{what}: "
            + (
                "give one of them"
                if ordered
                else "its service instance takes its messages one at a time, in publish "
                "order, already"
            )
        )
    return subscriptions.SubscriptionSpec(
        **fields,
        filter=filt,
        instance_id=None if instance_id is None else str(instance_id),
        priority=priority,
        ordered=ordered,
        correlation=correlation,
        ordered_by=ordered_by,
    )


def _ordered_by(index: int | str, service: str, name: object, filt: Filter) -> str | None:
    """The property a subscription is ordered by, checked: a property name (canonical),
    that a message its filter matches can carry (not every group requires it absent)."""
    if name is None:
        return None
    try:
        prop = canonical_name(name)
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"subscription {index} of {service!r}: ordered_by: {exc}") from exc
    if all(
        any(p.op is Op.NOT_EXISTS and p.property == prop for p in g.predicates) for g in filt.groups
    ):
        raise ValidationError(
            f"subscription {index} of {service!r}: ordered_by {prop!r}: no message its filter "
            f"matches carries it (every group requires {prop} to be absent), so there is no "
            "key to order by"
        )
    return prop


def resolve(conn: sa.Connection, refs: Sequence[int | str]) -> list[Subscription]:
    """Subscriptions by id or name; an unknown one raises :class:`UnknownSubscription`."""
    s = schema.subscription
    ids = [r for r in refs if isinstance(r, int)]
    names = [r for r in refs if isinstance(r, str)]
    rows = (
        conn.execute(sa.select(s.c.id).where(sa.or_(s.c.id.in_(ids), s.c.name.in_(names))))
        .scalars()
        .all()
    )
    found = subscriptions.list_subscriptions(conn, ids=list(rows))
    known = {x.id for x in found} | {x.name for x in found}
    for ref in refs:
        if ref not in known:
            raise UnknownSubscription(f"no subscription {ref!r}")
    return found


class Catalog:
    """Hosts and subscriptions of one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def create_host(
        self, name: str, settings: HostSettings | None, options: Mapping[str, Any]
    ) -> Host:
        check_name("host", name)
        config = settings or HostSettings.checked(f"host {name!r}", options)
        with self._store.transaction(serial=True) as conn:
            made = subscriptions.create_host(conn, name, config, clock.now(conn))
        self._store.host_ttls.invalidate()
        return made

    def configure_host(self, name: str, options: Mapping[str, Any]) -> Host:
        with self._store.transaction(serial=True) as conn:
            hosts = {h.name: h for h in subscriptions.list_hosts(conn)}
            found = hosts.get(name)
            if found is None:
                raise unknown_host(name, hosts)
            merged = {**found.settings.model_dump(), **options}
            config = HostSettings.checked(f"host {name!r}", merged)
            subscriptions.update_host(conn, name, config)
        self._store.host_ttls.invalidate()  # this process's next publish reads it
        return Host(name=name, settings=config, created_at=found.created_at)

    def remove_host(self, name: str) -> None:
        with self._store.transaction(serial=True) as conn:
            # the subscription lock: a subscribe naming this host cannot commit meanwhile
            self._store.dialect.lock_subscriptions(conn)
            hosts = {h.name for h in subscriptions.list_hosts(conn)}
            if name not in hosts:
                raise unknown_host(name, hosts)
            subs = subscriptions.list_subscriptions(conn, host=name)
            if subs:
                raise Conflict(
                    f"host {name!r} has {len(subs)} subscription(s) "
                    f"({', '.join(s.name for s in subs[:5])}): remove them first; "
                    "nothing was changed"
                )
            left = subscriptions.host_left(conn, name)
            if left:
                raise Conflict(
                    f"host {name!r} is not empty ({left}): drain, terminate or stop them "
                    "first; nothing was changed"
                )
            subscriptions.delete_host(conn, name)

    def replace_filter(self, ref: int | str, filt: object) -> Subscription:
        new = to_filter(filt)
        with self._store.transaction(serial=True, fence=Fence.CHANGES) as conn:
            [sub] = resolve(conn, [ref])
            subscriptions.replace_filter(conn, self._store.dialect, sub.id, new)
            [changed] = subscriptions.list_subscriptions(conn, ids=[sub.id])
        self._warn([changed])
        return changed

    def hosts(self) -> list[Host]:
        with self._store.transaction() as conn:
            return subscriptions.list_hosts(conn)

    def host(self, name: str) -> Host:
        hosts = self.hosts()
        for h in hosts:
            if h.name == name:
                return h
        raise unknown_host(name, (h.name for h in hosts))

    def subscribe_many(self, specs: Iterable[Mapping[str, Any]]) -> list[Subscription]:
        checked = [check_spec(i, spec) for i, spec in enumerate(specs)]
        if not checked:
            return []
        with self._store.transaction(serial=True, fence=Fence.CHANGES) as conn:
            made = subscriptions.subscribe(conn, self._store.dialect, checked, clock.now(conn))
        self._warn(made)
        return made

    def type_traps(self, filters: Sequence[tuple[str, Filter]]) -> list[str]:
        with self._store.transaction() as conn:
            return typecheck.traps(conn, filters)

    def lint(self, subs: Sequence[Subscription]) -> list[routing_lint.Finding]:
        """Findings about these subscriptions (:func:`routing_lint.subscription_findings`),
        and the property names they test that none of the newest stored messages carries."""
        with self._store.transaction() as conn:
            stored = subscriptions.service_filters(
                conn, [s.service for s in subs], skip=[s.id for s in subs]
            )
            read, known = typecheck.carried(conn)
        every = sorted([*stored, *((s.id, s.name, s.service, s.filter) for s in subs)])
        found = routing_lint.subscription_findings(
            [(s.name, s.service, s.filter) for s in subs], [(n, sv, f) for _, n, sv, f in every]
        )
        if read:
            found += routing_lint.property_findings([(s.name, s.filter) for s in subs], known)
        return found

    def _warn(self, made: Sequence[Subscription]) -> None:
        """Log the typing traps (a filter that never matches the stored messages for the
        type they carry) and the lint findings of new or changed subscriptions; a failure
        to check is not one."""
        checks = (
            (
                log,
                "subscription-type-trap",
                lambda: self.type_traps([(s.name, s.filter) for s in made]),
            ),
            (lint_log, "subscription-lint", lambda: self.lint(made)),
        )
        for logger, event, check in checks:
            try:
                found: Sequence[object] = check()
            except MessageBoxError:
                continue
            for warning in found:
                logger.warning("%s", warning, extra={"event": event})

    def subscriptions(
        self, *, service: str | None, host: str | None, instance_id: str | None
    ) -> list[Subscription]:
        with self._store.transaction() as conn:
            return subscriptions.list_subscriptions(
                conn, service=service, host=host, instance_id=instance_id
            )

    def subscription(self, ref: int | str) -> Subscription:
        with self._store.transaction() as conn:
            return resolve(conn, [ref])[0]

    def unsubscribe(self, refs: Sequence[int | str]) -> int:
        with self._store.transaction(serial=True, fence=Fence.CHANGES) as conn:
            ids = [s.id for s in resolve(conn, refs)]
            suspension.suspend_waiting(conn, self._store.dialect, ids, SUBSCRIPTION_REMOVED)
            removed = subscriptions.unsubscribe(conn, self._store.dialect, ids)
            suspension.orphan_suspended(conn, ids)  # after: sees a suspension that raced it
            return removed

    def set_service_state(self, service: str, state: State | str) -> int:
        new = State(state)
        with self._store.transaction(serial=True, fence=Fence.CHANGES) as conn:
            subs = subscriptions.list_subscriptions(conn, service=service)
            if not subs:
                raise UnknownSubscription(f"service {service!r} has no subscription")
            ids = [s.id for s in subs]
            suspension.hold(conn, ids, new)
            subscriptions.changed(conn, self._store.dialect, ids)
            if new is State.UNENLISTED:
                suspension.suspend_waiting(conn, self._store.dialect, ids, SERVICE_UNENLISTED)
            elif new is State.STARTED:
                self._store.dialect.notify(conn, sorted({s.host for s in subs}))
        return len(subs)
