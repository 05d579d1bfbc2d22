"""Hosts and subscriptions: validated, then written one transaction a call (the storage
side of :class:`~messagebox.engine.MessageBox`'s host and subscription methods)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from messagebox.config import routing_lint, typecheck
from messagebox.errors import (
    Conflict,
    MessageBoxError,
    UnknownHost,
    UnknownSubscription,
)
from messagebox.models import (
    SERVICE_UNENLISTED,
    SUBSCRIPTION_REMOVED,
    Host,
    HostSettings,
    State,
    Subscription,
)
from messagebox.predicates import Filter, to_filter
from messagebox.properties import check_text
from messagebox.specs import check_name, check_spec
from messagebox.storage import schema, store_clock, subscriptions, suspension
from messagebox.storage.fence import Fence
from messagebox.storage.store import Store
from messagebox.suggest import did_you_mean

log = logging.getLogger("messagebox.typecheck")
lint_log = logging.getLogger("messagebox.lint")


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
            made = subscriptions.create_host(conn, name, config, store_clock.now(conn))
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
            made = subscriptions.subscribe(
                conn, self._store.dialect, checked, store_clock.now(conn)
            )
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
