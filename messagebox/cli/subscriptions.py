"""The ``subscriptions``, ``services`` and ``hosts`` commands: list, add, remove, and
start, stop or unenlist a service."""

from __future__ import annotations

import argparse
import json
from typing import Any

from messagebox.cli import inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal


def _subscription_json(sub: Any) -> dict[str, Any]:
    """A subscription as JSON, its filter in text and in JSON."""
    from messagebox.predicates import format_filter

    return {
        "id": sub.id,
        "name": sub.name,
        "service": sub.service,
        "host": sub.host,
        "state": sub.state,
        "kind": sub.kind,
        "priority": sub.priority,
        "ordered": sub.ordered,
        "ordered_by": sub.ordered_by,
        "on_failure": sub.on_failure,
        "on_expiry": sub.on_expiry,
        "instance_id": sub.instance_id,
        "correlation": list(sub.correlation),
        "created_at": sub.created_at,
        "filter": format_filter(sub.filter),
        "filter_json": json.loads(sub.filter.to_json()),
    }


def subscriptions_list(args: argparse.Namespace, out: Terminal) -> None:
    """The subscriptions, only of ``--host`` and ``--service`` when given."""
    with open_box(args) as box:
        subs = box.subscriptions(
            host=getattr(args, "host", None), service=getattr(args, "service", None)
        )
    if out.json:
        out.emit([_subscription_json(s) for s in subs])
        return
    from messagebox.predicates import format_filter

    out.table(
        ["id", "name", "service", "host", "state", "order", "on expiry", "filter"],
        [
            [
                s.id,
                s.name,
                s.service,
                s.host,
                s.state.value,
                f"by {s.ordered_by}" if s.ordered_by else "publish" if s.ordered else "-",
                s.on_expiry.value,
                format_filter(s.filter),
            ]
            for s in subs
        ],
        empty="no subscriptions",
    )


def subscriptions_add(args: argparse.Namespace, out: Terminal) -> None:
    """Subscribe a service on a known host (the subscription named as ``--name``, else
    after the service). The spelling of earlier versions, ``add NAME --service S``,
    still works, with a deprecation note."""
    filt = inputs.filter_arg(args.filter)
    service, name = args.service, args.name
    if args.old_service is not None:
        if name is not None:
            raise inputs.UsageError("give --name (and SERVICE first), not --service")
        service, name = args.old_service, args.service
        out.note(
            f"note: `subscriptions add {name} --service {service}` is deprecated; "
            f"write `subscriptions add {service} --name {name}` (SERVICE first, as in Python)"
        )
    with open_box(args) as box:
        inputs.known_host(box, args.host)
        sub = box.subscribe(
            service,
            host=args.host,
            filter=filt,
            name=name,
            priority=args.priority,
            ordered=args.ordered,
            ordered_by=args.ordered_by,
            on_failure=args.on_failure,
            on_expiry=args.on_expiry,
            state=args.state,
        )
        traps = box.type_traps({sub.name: sub.filter})
        traps += [str(f) for f in box.lint_subscriptions(sub.id)]
    for trap in traps:
        out.note(f"warning: {trap}")
    if out.json:
        out.emit(_subscription_json(sub))
    else:
        out.say(f"subscription {sub.id} {sub.name!r}: {sub.service} on {sub.host}")


def subscriptions_remove(args: argparse.Namespace, out: Terminal) -> None:
    """Remove subscriptions by id or name; entries waiting for them are suspended."""
    refs = [inputs.ref(r) for r in args.refs]
    with open_box(args) as box:
        removed = box.unsubscribe(*refs)
    if out.json:
        out.emit({"removed": removed})
    else:
        out.say(
            f"removed {removed} subscription{'s' if removed != 1 else ''}; entries still "
            "waiting for them are suspended (subscription-removed; `messagebox suspended "
            "reroute` routes them again)"
        )


def subscriptions_set_filter(args: argparse.Namespace, out: Terminal) -> None:
    """Give a subscription a new filter in place."""
    from messagebox.predicates import format_filter

    filt = inputs.filter_arg(args.filter)
    with open_box(args) as box:
        sub = box.set_filter(inputs.ref(args.ref), filt)
        for trap in box.type_traps({sub.name: sub.filter}):
            out.note(f"warning: {trap}")
        for finding in box.lint_subscriptions(sub.id):
            out.note(f"warning: {finding}")
    if out.json:
        out.emit({"id": sub.id, "name": sub.name, "filter": format_filter(sub.filter)})
    else:
        out.say(
            f"subscription {sub.id} {sub.name!r}: {format_filter(sub.filter)} (its waiting "
            "entries stay; publishes route by the new filter)"
        )


def hosts_remove(args: argparse.Namespace, out: Terminal) -> None:
    """Remove a host nothing refers to."""
    with open_box(args) as box:
        box.remove_host(args.name)
    if out.json:
        out.emit({"removed": args.name})
    else:
        out.say(f"removed host {args.name!r}")


_STATE_EFFECT = {
    "started": "its held messages are released to its hosts",
    "stopped": "new messages are routed to it and held until it starts",
    "unenlisted": "nothing routes to it; its waiting messages are suspended "
    "(reason service-unenlisted, resumable)",
}


def services_state(args: argparse.Namespace, out: Terminal) -> None:
    """Start, stop or unenlist every subscription of a service."""
    from messagebox.models import SERVICE_ACTIONS

    state = SERVICE_ACTIONS[args.action].value
    with open_box(args) as box:
        changed = box.set_service_state(args.service, state)
    if out.json:
        out.emit({"service": args.service, "state": state, "subscriptions": changed})
    else:
        out.say(
            f"service {args.service!r} {state} ({changed} subscription"
            f"{'s' if changed != 1 else ''}): {_STATE_EFFECT[state]}"
        )


def hosts_list(args: argparse.Namespace, out: Terminal) -> None:
    """The hosts with their instances, queued and suspended entries and settings."""
    with open_box(args) as box:
        hosts = box.host_stats()
    for h in hosts:
        for repair in h.repairs:
            out.note(
                f"messagebox: warning: host {h.name!r} stored a bad setting: {repair} "
                f"(repair it: messagebox hosts set {h.name} --set SETTING=VALUE)"
            )
    if out.json:
        out.emit(hosts)
        return
    out.table(
        ["host", "instances", "queued", "suspended", "threads", "max attempts"],
        [
            [
                h.name,
                h.instances,
                h.queued,
                h.suspended,
                h.settings.dequeue_threads,
                h.settings.max_attempts,
            ]
            for h in hosts
        ],
        empty="no hosts",
    )


def _settings(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` options: each value read as JSON, else as a string."""
    from messagebox.models import setting_values

    try:
        return setting_values(items)
    except ValueError as exc:
        raise inputs.UsageError(f"--set: {exc}") from None


def _checked(name: str, settings: dict[str, Any]) -> None:
    """Settings given on the command line, checked here: a bad one is bad usage (exit 2),
    apart from a store that refuses them."""
    from messagebox.errors import ValidationError
    from messagebox.models import HostSettings

    try:
        HostSettings.checked(f"host {name!r}", settings)
    except ValidationError as exc:
        raise inputs.UsageError(f"--set: {exc}") from None


def hosts_set(args: argparse.Namespace, out: Terminal) -> None:
    """Change some of a host's settings; running instances keep theirs until restarted."""
    changes = _settings(args.set)
    if not changes:
        raise inputs.UsageError("give at least one --set SETTING=VALUE")
    with open_box(args) as box:
        _checked(args.name, {**box.host(args.name).settings.model_dump(), **changes})
        host = box.configure_host(args.name, **changes)
    if out.json:
        out.emit({"name": host.name, "settings": host.settings.model_dump()})
        return
    now = host.settings.model_dump()
    out.say(
        f"host {host.name!r}: "
        + ", ".join(f"{k}={json.dumps(now[k])}" for k in changes)
        + " (running instances keep their settings until restarted)"
    )


def hosts_add(args: argparse.Namespace, out: Terminal) -> None:
    """Create a host; each ``--set KEY=VALUE`` is read as JSON, else as a string."""
    settings = _settings(args.set)
    _checked(args.name, settings)
    with open_box(args) as box:
        host = box.create_host(args.name, **settings)
    if out.json:
        out.emit({"name": host.name, "settings": host.settings.model_dump()})
    else:
        out.say(f"host {host.name!r} created")
