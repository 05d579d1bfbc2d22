"""The ``route explain`` command: per subscription, whether a message routes to it,
and why not."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from messagebox.cli import inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal

if TYPE_CHECKING:
    from messagebox.models import RouteExplanation, SubscriptionExplanation
    from messagebox.predicates.explain import PredicateCheck
    from messagebox.properties import Value


def route_explain(args: argparse.Namespace, out: Terminal) -> None:
    """Explain a stored message or given properties against every subscription (or the
    one ``--subscription`` names): as JSON, or a summary and a table."""
    target = _explain_target(args)
    with open_box(args) as box:
        only = (
            None if args.subscription is None else box.subscription(inputs.ref(args.subscription))
        )
        found = box.explain(target)
    explained = [e for e in found.subscriptions if only is None or e.subscription.id == only.id]
    if out.json:
        out.emit(_explanation_json(found, explained))
        return
    _say_explanation(out, found, explained)


def _explain_target(args: argparse.Namespace) -> uuid.UUID | dict[str, Value]:
    """The message id, or the properties, to explain: the positional argument (a UUID or a
    JSON object) or ``-p``/``--properties-json``; a usage error for both or neither."""
    given = inputs.properties(args)
    if args.target is None:
        if given:
            return given
        raise inputs.UsageError("give a message id or properties (JSON, -p or --properties-json)")
    if given:
        raise inputs.UsageError("give a message id or properties, not both")
    if args.target.lstrip().startswith("{"):
        args.properties_json, args.properties = args.target, []
        return inputs.properties(args)
    try:
        return uuid.UUID(args.target)
    except ValueError:
        raise inputs.UsageError(
            f"{args.target!r} is neither a message id (a UUID) nor a JSON object of properties"
        ) from None


def _explanation_json(
    found: RouteExplanation, explained: Sequence[SubscriptionExplanation]
) -> dict[str, Any]:
    """The ``--json`` output: the message, where it routes, each subscription's groups."""
    return {
        "message_id": found.message_id,
        "properties": found.properties,
        "routes_to": [s.id for s in found.routes_to],
        "subscriptions": [_subscription_json(e) for e in explained],
    }


def _subscription_json(e: SubscriptionExplanation) -> dict[str, Any]:
    from messagebox.predicates import format_filter

    return {
        "id": e.subscription.id,
        "name": e.subscription.name,
        "service": e.subscription.service,
        "host": e.subscription.host,
        "state": e.subscription.state,
        "filter": format_filter(e.subscription.filter),
        "routes": e.routes,
        "matched": e.matched,
        "groups": [
            {"matched": g.matched, "failed": _failed_json(g.failed)} for g in e.filter.groups
        ],
    }


def _failed_json(failed: PredicateCheck | None) -> dict[str, Any] | None:
    from messagebox.predicates.text import format_predicate

    if failed is None:
        return None
    return {
        "predicate": format_predicate(failed.predicate),
        "property": failed.predicate.property,
        "op": failed.predicate.op,
        "present": failed.present,
        "actual": failed.actual,
        "why": failed.why,
    }


def _say_explanation(
    out: Terminal, found: RouteExplanation, explained: Sequence[SubscriptionExplanation]
) -> None:
    """The output for people: the message, where it routes, and a table of the
    subscriptions with each failing group's first failing predicate."""
    from messagebox.predicates.text import format_value

    what = f"message {found.message_id}" if found.message_id else "a message"
    props = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(found.properties.items()))
    out.say(f"{what} with {props or 'no promoted properties'}")
    out.say(
        f"routes to {len(found.routes_to)} of {len(found.subscriptions)} subscriptions"
        + (f": {', '.join(s.name for s in found.routes_to)}" if found.routes_to else "")
    )
    out.say()
    out.table(
        ["id", "name", "service", "host", "state", "routes", "group", "first failing", "why"],
        [row for e in explained for row in _explanation_rows(e)],
        empty="no subscriptions",
    )


def _explanation_rows(e: SubscriptionExplanation) -> list[list[Any]]:
    """One subscription's table rows: one when its filter matches, else one per group
    that fails (the subscription's columns on the first only)."""
    from messagebox.predicates.text import format_predicate

    s = e.subscription
    head = [s.id, s.name, s.service, s.host, s.state.value, "yes" if e.routes else "no"]
    if e.matched and not e.routes:
        return [[*head, None, "(its filter matches; the service is unenlisted)", ""]]
    failed = [(i, g.failed) for i, g in enumerate(e.filter.groups, 1) if g.failed]
    if e.matched or not failed:
        matched = next(i for i, g in enumerate(e.filter.groups, 1) if g.matched)
        return [[*head, matched, "(matches)", ""]]
    return [
        [*(head if n == 0 else [None, "", "", "", "", ""]), i, format_predicate(f.predicate), f.why]
        for n, (i, f) in enumerate(failed)
    ]
