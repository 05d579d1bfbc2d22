"""The ``orchestrations`` commands: ``list``, ``find`` (by correlation value), ``show``
and ``terminate`` orchestration instances. (``instances`` lists host instances: the
processes.)"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from messagebox.cli import confirm, inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal

if TYPE_CHECKING:
    from messagebox.engine import MessageBox
    from messagebox.ops.instance_history import InstanceDetail
    from messagebox.ops.orchestrations import ServiceInstanceView
    from messagebox.properties import Value


def correlation_text(values: dict[str, Value]) -> str:
    """Correlation values as ``NAME=VALUE`` (text values quoted), comma-separated."""
    from messagebox.predicates.text import format_value

    return ", ".join(f"{k}={format_value(v)}" for k, v in values.items()) or "-"


def find(
    box: MessageBox, items: list[str], *, service: str | None, state: str | None, limit: int
) -> list[ServiceInstanceView]:
    """The instances with the ``NAME[:TYPE]=VALUE`` correlation values given, newest
    first. A value given without a type that reads as a number or a bool (``123``) also
    finds the same text stored as text."""
    values = inputs.assignments(items, "NAME=VALUE")
    found = box.find_instances(values, service=service, state=state, limit=limit)
    texts = {n: raw for n, raw in inputs.inferred(items).items() if not isinstance(values[n], str)}
    if texts:
        seen = {i.id for i in found}
        more = box.find_instances({**values, **texts}, service=service, state=state, limit=limit)
        found += [i for i in more if i.id not in seen]
        found.sort(key=lambda i: (i.created_at, i.id), reverse=True)
    return found[:limit]


def orchestrations_list(args: argparse.Namespace, out: Terminal) -> None:
    """Instances, newest first (``find``: only those with the correlation values)."""
    state = getattr(args, "state", None)
    service = getattr(args, "service", None)
    limit = getattr(args, "limit", 200)
    with open_box(args) as box:
        if getattr(args, "values", None):
            found = find(box, args.values, service=service, state=state, limit=limit)
        else:
            found = box.service_instances(service=service, state=state, limit=limit)
    if out.json:
        out.emit(found)
        return
    out.table(
        ["id", "service", "state", "correlation", "queued", "suspended", "created", "updated"],
        [
            [
                i.id,
                i.service,
                i.state,
                correlation_text(i.correlation),
                i.queued,
                i.suspended,
                i.created_at.isoformat(timespec="seconds"),
                i.updated_at.isoformat(timespec="seconds"),
            ]
            for i in found
        ],
        empty="no orchestration instances" + (" with those values" if "values" in args else ""),
    )
    if len(found) == limit:
        out.note(f"(the newest {limit}; --limit shows more)")


def orchestrations_show(args: argparse.Namespace, out: Terminal) -> None:
    """One instance: its correlation values, saved state, the messages that reached it
    in order with their outcomes, what it published, its timers and tracked history."""
    with open_box(args) as box:
        found = box.service_instance(args.id)
        names = {s.id: s.name for s in box.subscriptions()}
    if out.json:
        out.emit(found)
        return
    _show(found, names, out)


def _show(d: InstanceDetail, names: dict[int, str], out: Terminal) -> None:
    i = d.instance
    out.fields(
        [
            ("instance", i.id),
            ("service", f"{i.service} (host {i.host or '-'})"),
            ("state", i.state + (f", version {d.version}" if d.version is not None else "")),
            ("correlation", correlation_text(i.correlation)),
            ("created", i.created_at.isoformat()),
            ("updated", i.updated_at.isoformat()),
            ("ended", i.completed_at.isoformat() if i.completed_at else "-"),
            ("waiting for", ", ".join(i.waiting_for) or "-"),
            ("timers", "\n".join(f"{n} at {due.isoformat()}" for n, due in i.timers) or "-"),
            (
                "saved data",
                "- (no step has committed)"
                if d.data is None
                else json.dumps(d.data, indent=2, ensure_ascii=False),
            ),
        ]
    )
    out.say()
    out.table(
        ["entry", "message", "receive", "outcome", "at", "failures", "detail"],
        [
            [
                m.entry,
                str(m.message_id),
                ("timeout " if m.timeout else "")
                + (names.get(m.subscription, str(m.subscription)) if m.subscription else "-"),
                m.outcome,
                m.at.isoformat(timespec="seconds") if m.at else "-",
                m.failures,
                m.detail or "",
            ]
            for m in d.messages
        ],
        empty="no messages known"
        + ("" if d.tracking else " (tracking is off: handled steps are not recorded)"),
    )
    if d.published:
        out.say()
        out.table(
            ["step", "published", "at", "routed to"],
            [
                [
                    p.step,
                    str(p.message_id),
                    p.published_at.isoformat(timespec="seconds") if p.published_at else "-",
                    ", ".join(names.get(s, str(s)) for s in p.subscriptions) or "-",
                ]
                for p in d.published
            ],
            empty="",
        )
    if d.history:
        out.note(f"({len(d.history)} tracked events of these messages: --json shows them)")
    if not d.tracking:
        out.note("tracking is off: handled steps are not recorded (`messagebox tracking enable`)")


def orchestrations_terminate(args: argparse.Namespace, out: Terminal) -> None:
    """End an instance: its queued and suspended messages terminated, its timers,
    convoy and instance subscriptions removed. Asks first (:mod:`messagebox.cli.confirm`)."""
    confirm.require_yes(args)
    with open_box(args) as box:
        done = box.terminate_instance(args.id)
        args.audit_count = len(done.entries) + len(done.suspended)
        args.audit_target = f"orchestration instance {done.id} ({done.service})"
    if out.json:
        out.emit(done)
        return
    out.say(
        f"terminated instance {done.id} of {done.service}: "
        + _count(len(done.entries), "queued message")
        + ", "
        + _count(len(done.suspended), "suspended entry", "suspended entries")
        + " terminated, "
        + _count(done.timers, "timer")
        + " cancelled"
    )


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"
