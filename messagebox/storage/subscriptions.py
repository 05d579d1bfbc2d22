"""Hosts and subscriptions in storage: the queries that create, list and remove them.

A subscription's filter is stored twice: as JSON on the subscription (the source of
truth, for listing and explaining), and decomposed into groups and shared, typed
predicate rows (what routing joins against). All of it in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.errors import AlreadyExists, UnknownHost, ValidationError
from messagebox.models import (
    ENDED,
    Host,
    HostSettings,
    Kind,
    OnExpiry,
    OnFailure,
    State,
    Subscription,
)
from messagebox.predicates import Filter
from messagebox.predicates.sql import anchor_rank, typed_rows
from messagebox.specs import SubscriptionSpec
from messagebox.storage import routing_index, schema, store_clock
from messagebox.storage.dialects import Dialect
from messagebox.storage.ids import allocate
from messagebox.suggest import did_you_mean

_CHUNK = 1000

_TABLES = {
    t.name: t for t in (schema.pred_str, schema.pred_num, schema.pred_mask, schema.pred_exists)
}


def _chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


def _lookup(
    conn: sa.Connection, column: sa.Column[Any], result: sa.Column[Any], keys: Sequence[Any]
) -> dict[Any, Any]:
    found: dict[Any, Any] = {}
    for chunk in _chunks(keys):
        rows = conn.execute(sa.select(column, result).where(column.in_(chunk)))
        found.update((key, value) for key, value in rows)
    return found


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {key: [row[key] for row in rows] for key in rows[0]}


def insert_rows(
    conn: sa.Connection, dialect: Dialect, table: sa.Table, rows: list[dict[str, Any]]
) -> None:
    """Bulk-insert rows given as dicts (no-op for none)."""
    if rows:
        dialect.insert(conn, table, _columns(rows))


def create_host(conn: sa.Connection, name: str, settings: HostSettings, now: datetime) -> Host:
    if conn.execute(sa.select(schema.host.c.name).where(schema.host.c.name == name)).first():
        raise AlreadyExists(f"host {name!r} exists already")
    conn.execute(
        schema.host.insert().values(name=name, settings=settings.model_dump_json(), created_at=now)
    )
    return Host(name=name, settings=settings, created_at=now)


def update_host(conn: sa.Connection, name: str, settings: HostSettings) -> None:
    """Store a host's new settings."""
    h = schema.host
    conn.execute(h.update().where(h.c.name == name).values(settings=settings.model_dump_json()))


def list_hosts(conn: sa.Connection) -> list[Host]:
    rows = conn.execute(sa.select(schema.host).order_by(schema.host.c.name))
    hosts = []
    for r in rows:
        settings, repairs = HostSettings.from_stored(r.settings)
        hosts.append(Host(name=r.name, settings=settings, created_at=r.created_at, repairs=repairs))
    return hosts


def subscribe(
    conn: sa.Connection, dialect: Dialect, specs: Sequence[SubscriptionSpec], now: datetime
) -> list[Subscription]:
    """Store subscriptions; predicates equal to stored ones are shared, not stored again."""
    dialect.lock_subscriptions(conn)
    _check_hosts(conn, specs)
    _check_correlated(conn, specs)
    filters = [spec.filter for spec in specs]
    prop_ids = _intern_properties(conn, dialect, filters)
    pred_ids = _intern_predicates(conn, dialect, filters, prop_ids)
    subs, groups, links, made = _subscription_rows(conn, specs, pred_ids, now)
    _check_names(conn, [s["name"] for s in subs])
    insert_rows(conn, dialect, schema.subscription, subs)
    insert_rows(conn, dialect, schema.group, groups)
    insert_rows(conn, dialect, schema.group_pred, links)
    changed(conn, dialect, [m.id for m in made])
    return made


VERSIONS_KEPT = 1000
"""Routing versions the cleanup job keeps (a routing index further behind reloads)."""


def prune_versions(conn: sa.Connection, keep: int = VERSIONS_KEPT) -> int:
    """Delete the routing-version rows behind the newest ``keep`` versions."""
    rc = schema.routing_change
    last = conn.execute(sa.select(sa.func.max(rc.c.version))).scalar_one()
    if last is None:
        return 0
    return int(conn.execute(rc.delete().where(rc.c.version <= int(last) - keep)).rowcount)


def changed(conn: sa.Connection, dialect: Dialect, sub_ids: Sequence[int]) -> None:
    """Record one routing version that changes these subscriptions (added, removed or
    their state set): each process's routing index reloads them from its next publish.
    Takes the subscription lock, so versions commit in order."""
    if not sub_ids:
        return
    dialect.lock_subscriptions(conn)
    routing_index.mark_changed(conn)
    rc = schema.routing_change
    # scalar_one reads the result to its end: DuckDB refuses other work before that
    last = conn.execute(sa.select(sa.func.max(rc.c.version))).scalar_one()
    version = int(last or 0) + 1
    dialect.insert(
        conn,
        rc,
        {
            "version": [version] * len(sub_ids),
            "sub": list(sub_ids),
            "changed_at": [store_clock.now(conn)] * len(sub_ids),
        },
    )


def _check_hosts(conn: sa.Connection, specs: Sequence[SubscriptionSpec]) -> None:
    """Raise :class:`UnknownHost` for the first spec whose host does not exist."""
    hosts = {s.host for s in specs}
    known = set(_lookup(conn, schema.host.c.name, schema.host.c.created_at, sorted(hosts)))
    for spec in specs:
        if spec.host not in known:
            hint = did_you_mean(spec.host, conn.execute(sa.select(schema.host.c.name)).scalars())
            raise UnknownHost(
                f"subscription of service {spec.service!r}: no host named {spec.host!r}"
                + (hint or " (create it with create_host)")
            )


def _check_correlated(conn: sa.Connection, specs: Sequence[SubscriptionSpec]) -> None:
    """Raise :class:`ValidationError` for a correlated subscription of a service whose
    correlated subscriptions are on another host (stored, or earlier in ``specs``). A
    correlated service's instances and convoys are the service's, keyed by its name and
    correlation values: on two hosts, both would step the same instances, each host's
    claims ordering only its own queue."""
    correlated = [s for s in specs if s.correlation]
    if not correlated:
        return
    s = schema.subscription
    hosts: dict[str, str] = {}
    for service, host in conn.execute(
        sa.select(s.c.service, s.c.host)
        .where(
            s.c.service.in_(sorted({spec.service for spec in correlated})),
            s.c.correlation.is_not(None),
        )
        .order_by(s.c.id)
    ):
        hosts.setdefault(service, host)
    for spec in correlated:
        host = hosts.setdefault(spec.service, spec.host)
        if host != spec.host:
            raise ValidationError(
                f"service {spec.service!r} has correlated subscriptions on host {host!r}: "
                f"a correlated service runs on one host (its instances are the service's), "
                f"so it cannot be correlated on host {spec.host!r} too"
            )


def _intern_properties(
    conn: sa.Connection, dialect: Dialect, filters: Sequence[Filter]
) -> dict[str, int]:
    """The id of each property the filters name, storing the new ones."""
    names = sorted({p for f in filters for p in f.properties})
    prop_ids = _lookup(conn, schema.prop.c.name, schema.prop.c.id, names)
    new_names = [n for n in names if n not in prop_ids]
    if new_names:
        ids = allocate(conn, len(new_names))
        prop_ids.update(zip(new_names, ids, strict=True))
        insert_rows(
            conn,
            dialect,
            schema.prop,
            [{"id": i, "name": n} for n, i in zip(new_names, ids, strict=True)],
        )
    return prop_ids


def _intern_predicates(
    conn: sa.Connection,
    dialect: Dialect,
    filters: Sequence[Filter],
    prop_ids: Mapping[str, int],
) -> dict[str, int]:
    """The id of each predicate the filters hold, by key: a stored equal predicate's,
    or a new one's, stored with its typed rows."""
    preds = {p.key(): p for f in filters for g in f.groups for p in g.predicates}
    keys = sorted(preds)
    pred_ids = _lookup(conn, schema.predicate.c.key, schema.predicate.c.id, keys)
    new_keys = [k for k in keys if k not in pred_ids]
    if new_keys:
        ids = allocate(conn, len(new_keys))
        pred_ids.update(zip(new_keys, ids, strict=True))
        typed: dict[str, list[dict[str, Any]]] = {name: [] for name in _TABLES}
        master = []
        for key, pred_id in zip(new_keys, ids, strict=True):
            pred = preds[key]
            prop_id = prop_ids[pred.property]
            master.append({"id": pred_id, "key": key, "prop": prop_id, "op": pred.op.value})
            for table_name, row in typed_rows(pred, pred_id, prop_id):
                typed[table_name].append(row)
        insert_rows(conn, dialect, schema.predicate, master)
        for table_name, rows in typed.items():
            insert_rows(conn, dialect, _TABLES[table_name], rows)
    return pred_ids


def _subscription_rows(
    conn: sa.Connection,
    specs: Sequence[SubscriptionSpec],
    pred_ids: Mapping[str, int],
    now: datetime,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[Subscription]]:
    """The rows of the subscriptions, their groups and the groups' predicate links, with
    the subscriptions they make (ids allocated)."""
    sub_ids = allocate(conn, len(specs))
    names = _default_names(conn, specs)
    n_groups = sum(len(s.filter.groups) for s in specs)
    group_ids = iter(allocate(conn, n_groups))
    subs: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    made: list[Subscription] = []
    for spec, sub_id, name in zip(specs, sub_ids, names, strict=True):
        subs.append(
            {
                "id": sub_id,
                "name": name,
                "service": spec.service,
                "host": spec.host,
                "kind": spec.kind.value,
                "instance_id": spec.instance_id,
                "priority": spec.priority,
                "state": spec.state.value,
                "ordered": spec.ordered,
                "on_failure": spec.on_failure.value,
                "on_expiry": spec.on_expiry.value,
                "filter": spec.filter.to_json(),
                "created_at": now,
                "correlation": json.dumps(list(spec.correlation)) if spec.correlation else None,
                "ordered_by": spec.ordered_by,
            }
        )
        _group_rows(spec.filter, sub_id, group_ids, pred_ids, groups, links)
        made.append(_subscription(subs[-1], spec.filter))
    return subs, groups, links, made


def _default_names(conn: sa.Connection, specs: Sequence[SubscriptionSpec]) -> list[str]:
    """Each spec's name: the one given, else its service's when free, else the service's
    with the first free ``-2``, ``-3`` … (taken names: stored ones and this batch's)."""
    s = schema.subscription
    taken = {spec.name for spec in specs if spec.name}
    for service in sorted({spec.service for spec in specs if not spec.name}):
        taken.update(
            conn.execute(
                sa.select(s.c.name).where(
                    sa.or_(s.c.name == service, s.c.name.startswith(f"{service}-", autoescape=True))
                )
            ).scalars()
        )
    names: list[str] = []
    for spec in specs:
        name = spec.name
        if not name:
            name, n = spec.service, 1
            while name in taken:
                n += 1
                name = f"{spec.service}-{n}"
            taken.add(name)
        names.append(name)
    return names


def _group_rows(
    filt: Filter,
    sub_id: int,
    group_ids: Iterator[int],
    pred_ids: Mapping[str, int],
    groups: list[dict[str, Any]],
    links: list[dict[str, Any]],
) -> None:
    """Add the rows of a filter's groups (and their predicate links) to ``groups`` and
    ``links``: each group anchored on its most selective positive predicate."""
    for group in filt.groups:
        group_id = next(group_ids)
        anchors = [(anchor_rank(p), i) for i, p in enumerate(group.predicates)]
        ranked = sorted((r, i) for r, i in anchors if r is not None)
        anchor = pred_ids[group.predicates[ranked[0][1]].key()] if ranked else None
        groups.append({"id": group_id, "sub": sub_id, "n_pos": len(ranked), "anchor": anchor})
        links.extend({"grp": group_id, "pred": pred_ids[p.key()]} for p in group.predicates)


def replace_filter(conn: sa.Connection, dialect: Dialect, sub_id: int, filt: Filter) -> None:
    """Give a subscription a new filter in place: same id, same waiting entries (routed
    by the old filter), new groups; predicates no group uses any more are removed."""
    dialect.lock_subscriptions(conn)
    old_preds = _drop_groups(conn, [sub_id])
    prop_ids = _intern_properties(conn, dialect, [filt])
    pred_ids = _intern_predicates(conn, dialect, [filt], prop_ids)
    groups: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    _group_rows(filt, sub_id, iter(allocate(conn, len(filt.groups))), pred_ids, groups, links)
    insert_rows(conn, dialect, schema.group, groups)
    insert_rows(conn, dialect, schema.group_pred, links)
    s = schema.subscription
    conn.execute(s.update().where(s.c.id == sub_id).values(filter=filt.to_json()))
    _drop_unused_predicates(conn, old_preds)
    changed(conn, dialect, [sub_id])


def host_usage(conn: sa.Connection, name: str) -> dict[str, int]:
    """What still refers to a host: queued and suspended entries, registered host
    instances, service instances that have not ended (completed or terminated), pending
    timers."""
    si = schema.service_instance
    counted = (
        ("queued entries", schema.queue, schema.queue.c.host == name),
        ("suspended entries", schema.suspended, schema.suspended.c.host == name),
        ("registered host instances", schema.instance, schema.instance.c.host == name),
        (
            "service instances not ended",
            si,
            (si.c.host == name) & si.c.state.not_in(sorted(ENDED)),
        ),
        ("pending timers", schema.timer, schema.timer.c.host == name),
    )
    return {
        what: int(conn.execute(sa.select(sa.func.count()).select_from(t).where(cond)).scalar_one())
        for what, t, cond in counted
    }


def host_left(conn: sa.Connection, name: str) -> str:
    """What still refers to a host (:func:`host_usage`), as text; empty when nothing."""
    return ", ".join(f"{n} {k}" for k, n in host_usage(conn, name).items() if n)


def delete_host(conn: sa.Connection, name: str) -> int:
    return int(conn.execute(schema.host.delete().where(schema.host.c.name == name)).rowcount)


def _check_names(conn: sa.Connection, names_given: Sequence[str]) -> None:
    """Raise :class:`AlreadyExists` for a name given twice or taken already."""
    if len(set(names_given)) != len(names_given):
        dup = next(n for n in names_given if names_given.count(n) > 1)
        raise AlreadyExists(f"subscription name {dup!r} is given twice")
    taken = _lookup(conn, schema.subscription.c.name, schema.subscription.c.id, names_given)
    if taken:
        raise AlreadyExists(f"a subscription named {sorted(taken)[0]!r} exists already")


def _subscription(row: Mapping[Any, Any], filt: Filter | None = None) -> Subscription:
    return Subscription(
        id=row["id"],
        name=row["name"],
        service=row["service"],
        host=row["host"],
        filter=filt or Filter.from_json(row["filter"]),
        kind=Kind(row["kind"]),
        instance_id=row["instance_id"],
        priority=row["priority"],
        state=State(row["state"]),
        ordered=bool(row["ordered"]),
        created_at=row["created_at"],
        on_failure=OnFailure(row["on_failure"]),
        correlation=tuple(json.loads(row["correlation"])) if row.get("correlation") else (),
        on_expiry=OnExpiry(row.get("on_expiry") or OnExpiry.SUSPEND),
        ordered_by=row.get("ordered_by"),
    )


def list_subscriptions(
    conn: sa.Connection,
    *,
    ids: Sequence[int] | None = None,
    service: str | None = None,
    host: str | None = None,
    instance_id: str | None = None,
) -> list[Subscription]:
    s = schema.subscription
    query = sa.select(s).order_by(s.c.id)
    if ids is not None:
        query = query.where(s.c.id.in_(list(ids)))
    if service is not None:
        query = query.where(s.c.service == service)
    if host is not None:
        query = query.where(s.c.host == host)
    if instance_id is not None:
        query = query.where(s.c.instance_id == instance_id)
    return [_subscription(r._mapping) for r in conn.execute(query)]


def service_filters(
    conn: sa.Connection, services: Sequence[str], skip: Sequence[int] = ()
) -> list[tuple[int, str, str, Filter]]:
    """(id, name, service, filter) of the subscriptions of these services but ``skip``
    and the instance subscriptions made at run time (a query per 1000 services)."""
    s = schema.subscription
    left_out = set(skip)
    return [
        (r.id, r.name, r.service, Filter.from_stored_json(r.filter))
        for chunk in _chunks(sorted(set(services)))
        for r in conn.execute(
            sa.select(s.c.id, s.c.name, s.c.service, s.c.filter).where(
                s.c.service.in_(list(chunk)), s.c.instance_id.is_(None)
            )
        )
        if r.id not in left_out
    ]


def unsubscribe(conn: sa.Connection, dialect: Dialect, sub_ids: Sequence[int]) -> int:
    """Remove subscriptions, their groups, and predicates no other group uses."""
    dialect.lock_subscriptions(conn)
    s = schema.subscription
    preds = _drop_groups(conn, sub_ids)
    removed = conn.execute(s.delete().where(s.c.id.in_(list(sub_ids)))).rowcount
    _drop_unused_predicates(conn, preds)
    changed(conn, dialect, sub_ids)
    return int(removed)


def _drop_groups(conn: sa.Connection, sub_ids: Sequence[int]) -> list[int]:
    """Delete the subscriptions' groups and links; the predicates they used."""
    g, gp = schema.group, schema.group_pred
    groups = [r for (r,) in conn.execute(sa.select(g.c.id).where(g.c.sub.in_(list(sub_ids))))]
    preds = (
        sorted({r for (r,) in conn.execute(sa.select(gp.c.pred).where(gp.c.grp.in_(groups)))})
        if groups
        else []
    )
    conn.execute(gp.delete().where(gp.c.grp.in_(groups)))
    conn.execute(g.delete().where(g.c.id.in_(groups)))
    return preds


def _drop_unused_predicates(conn: sa.Connection, preds: Sequence[int]) -> None:
    """Delete those of ``preds`` that no group uses (with their typed rows)."""
    if not preds:
        return
    gp = schema.group_pred
    still_used = {
        r
        for (r,) in conn.execute(sa.select(gp.c.pred).where(gp.c.pred.in_(list(preds))).distinct())
    }
    orphans = [p for p in preds if p not in still_used]
    if orphans:
        for table in (*_TABLES.values(),):
            conn.execute(table.delete().where(table.c.pred.in_(orphans)))
        conn.execute(schema.predicate.delete().where(schema.predicate.c.id.in_(orphans)))
