"""What each ``messagebox`` command does: it checks its inputs, calls the MessageBox,
and shows the result (a table or JSON) through a :class:`~messagebox.cli.terminal.
Terminal`. The logic lives in the library; this is presentation."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from messagebox.cli import inputs
from messagebox.cli.terminal import Terminal, age, size

if TYPE_CHECKING:
    from messagebox.engine import MessageBox
    from messagebox.models import SuspendedEntry
    from messagebox.properties import Value

BULK_BATCH = 1000
"""Entries per transaction of a bulk resume or terminate."""


@contextmanager
def open_box(args: argparse.Namespace, *, create: bool = False) -> Iterator[MessageBox]:
    """The MessageBox at the command's URL; only ``init`` creates one."""
    from messagebox.engine import MessageBox
    from messagebox.errors import NoSchema

    try:
        box = MessageBox(args.url, create=create)
    except NoSchema as exc:
        raise NoSchema(f"{exc}; `messagebox init` creates it (or upgrades it)") from exc
    with box:
        yield box


def init(args: argparse.Namespace, out: Terminal) -> None:
    from messagebox.schema import SCHEMA_VERSION

    with open_box(args, create=True) as box:
        url = box.url.render_as_string(hide_password=True)
    if out.json:
        out.emit({"url": url, "schema_version": SCHEMA_VERSION})
    else:
        out.say(f"schema version {SCHEMA_VERSION} ready at {url}")


def publish(args: argparse.Namespace, out: Terminal) -> None:
    from messagebox.errors import MessageBoxError
    from messagebox.message import Message

    promoted = inputs.properties(args)
    written = inputs.assignments(args.written, "--written")
    files = list(args.files) or ["-"]
    if files.count("-") > 1:
        raise inputs.UsageError("standard input ('-') can be published once")
    for name in files:
        if name == "-":
            continue
        path = Path(name)
        if not path.exists():
            raise inputs.UsageError(f"no file {name!r}")
        if not path.is_file():
            raise inputs.UsageError(f"{name!r} is not a file")
        if not os.access(path, os.R_OK):
            raise inputs.UsageError(f"cannot read {name!r}")
    Message(b"", promoted=promoted, written=written)  # refuses bad properties before any I/O
    if "-" in files and sys.stdin.isatty():
        out.note("reading the message body from standard input (end it with Ctrl-D)")
    stdin = sys.stdin.buffer.read() if "-" in files else b""
    results: list[tuple[str, Any]] = []
    with open_box(args) as box, out.progress("publishing") as step:
        for start in range(0, len(files), args.batch):
            chunk = files[start : start + args.batch]
            with ExitStack() as files_open:  # parts are read as they are stored
                batch = [
                    Message(
                        stdin if name == "-" else files_open.enter_context(open(name, "rb")),
                        promoted=promoted,
                        written=written,
                    )
                    for name in chunk
                ]
                try:
                    routed = box.publish(batch, policy=args.policy)
                except MessageBoxError:
                    if results:
                        out.note(
                            f"the first {len(results)} of {len(files)} files were published "
                            f"(batches of {args.batch}); none from {chunk[0]!r} on"
                        )
                    raise
            results.extend(zip(chunk, routed, strict=True))
            step(len(results), len(files))
        names = {s.id: s.name for s in box.subscriptions()}
    rows = [
        {
            "file": name,
            "message_id": r.message_id,
            "outcome": r.outcome,
            "subscriptions": [{"id": s, "name": names.get(s)} for s in r.subscriptions],
        }
        for name, r in results
    ]
    if out.json:
        out.emit(rows)
        return
    out.table(
        ["file", "message", "outcome", "subscriptions"],
        [
            [
                r["file"],
                str(r["message_id"]),
                str(r["outcome"]),
                ", ".join(str(s["name"]) for s in r["subscriptions"]) or "-",
            ]
            for r in rows
        ],
        empty="nothing published",
    )
    counts: dict[str, int] = {}
    for _name, r in results:
        counts[str(r.outcome)] = counts.get(str(r.outcome), 0) + 1
    out.note(
        f"published {len(results)} message{'s' if len(results) != 1 else ''}: "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    )


def _subscription_json(sub: Any) -> dict[str, Any]:
    from predicates import format_filter

    return {
        "id": sub.id,
        "name": sub.name,
        "service": sub.service,
        "host": sub.host,
        "state": sub.state,
        "kind": sub.kind,
        "priority": sub.priority,
        "ordered": sub.ordered,
        "on_failure": sub.on_failure,
        "instance_id": sub.instance_id,
        "correlation": list(sub.correlation),
        "created_at": sub.created_at,
        "filter": format_filter(sub.filter),
        "filter_json": json.loads(sub.filter.to_json()),
    }


def subscriptions_list(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        subs = box.subscriptions(
            host=getattr(args, "host", None), service=getattr(args, "service", None)
        )
    if out.json:
        out.emit([_subscription_json(s) for s in subs])
        return
    from predicates import format_filter

    out.table(
        ["id", "name", "service", "host", "state", "filter"],
        [[s.id, s.name, s.service, s.host, s.state.value, format_filter(s.filter)] for s in subs],
        empty="no subscriptions",
    )


def subscriptions_add(args: argparse.Namespace, out: Terminal) -> None:
    filt = inputs.filter_arg(args.filter)
    with open_box(args) as box:
        inputs.known_host(box, args.host)
        sub = box.subscribe(
            args.service or args.name,
            host=args.host,
            filter=filt,
            name=args.name,
            priority=args.priority,
            ordered=args.ordered,
            on_failure=args.on_failure,
            state=args.state,
        )
    if out.json:
        out.emit(_subscription_json(sub))
    else:
        out.say(f"subscription {sub.id} {sub.name!r}: {sub.service} on {sub.host}")


def subscriptions_remove(args: argparse.Namespace, out: Terminal) -> None:
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


def route_explain(args: argparse.Namespace, out: Terminal) -> None:
    from predicates import format_filter
    from predicates.text import format_predicate, format_value

    given = inputs.properties(args)
    target: uuid.UUID | dict[str, Value]
    if args.target is not None:
        if given:
            raise inputs.UsageError("give a message id or properties, not both")
        if args.target.lstrip().startswith("{"):
            args.properties_json, args.properties = args.target, []
            target = inputs.properties(args)
        else:
            try:
                target = uuid.UUID(args.target)
            except ValueError:
                raise inputs.UsageError(
                    f"{args.target!r} is neither a message id (a UUID) nor a JSON object "
                    "of properties"
                ) from None
    elif given:
        target = given
    else:
        raise inputs.UsageError("give a message id or properties (JSON, -p or --properties-json)")
    with open_box(args) as box:
        only = (
            None if args.subscription is None else box.subscription(inputs.ref(args.subscription))
        )
        found = box.explain(target)
    explained = [e for e in found.subscriptions if only is None or e.subscription.id == only.id]
    if out.json:
        out.emit(
            {
                "message_id": found.message_id,
                "properties": found.properties,
                "routes_to": [s.id for s in found.routes_to],
                "subscriptions": [
                    {
                        "id": e.subscription.id,
                        "name": e.subscription.name,
                        "service": e.subscription.service,
                        "host": e.subscription.host,
                        "state": e.subscription.state,
                        "filter": format_filter(e.subscription.filter),
                        "routes": e.routes,
                        "matched": e.matched,
                        "groups": [
                            {
                                "matched": g.matched,
                                "failed": None
                                if g.failed is None
                                else {
                                    "predicate": format_predicate(g.failed.predicate),
                                    "property": g.failed.predicate.property,
                                    "op": g.failed.predicate.op,
                                    "present": g.failed.present,
                                    "actual": g.failed.actual,
                                    "why": g.failed.why,
                                },
                            }
                            for g in e.filter.groups
                        ],
                    }
                    for e in explained
                ],
            }
        )
        return
    what = f"message {found.message_id}" if found.message_id else "a message"
    props = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(found.properties.items()))
    out.say(f"{what} with {props or 'no promoted properties'}")
    out.say(
        f"routes to {len(found.routes_to)} of {len(found.subscriptions)} subscriptions"
        + (f": {', '.join(s.name for s in found.routes_to)}" if found.routes_to else "")
    )
    out.say()
    rows: list[list[Any]] = []
    for e in explained:
        s = e.subscription
        head = [s.id, s.name, s.service, s.host, s.state.value, "yes" if e.routes else "no"]
        if e.matched and not e.routes:
            rows.append([*head, None, "(its filter matches; the service is unenlisted)", ""])
            continue
        failed = [(i, g.failed) for i, g in enumerate(e.filter.groups, 1) if g.failed]
        if e.matched or not failed:
            matched = next(i for i, g in enumerate(e.filter.groups, 1) if g.matched)
            rows.append([*head, matched, "(matches)", ""])
            continue
        for n, (i, f) in enumerate(failed):
            rows.append(
                [
                    *(head if n == 0 else [None, "", "", "", "", ""]),
                    i,
                    format_predicate(f.predicate),
                    f.why,
                ]
            )
    out.table(
        ["id", "name", "service", "host", "state", "routes", "group", "first failing", "why"],
        rows,
        empty="no subscriptions",
    )


def hosts_list(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        hosts = box.host_stats()
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


def hosts_add(args: argparse.Namespace, out: Terminal) -> None:
    settings: dict[str, Any] = {}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise inputs.UsageError(f"--set {item!r}: expected SETTING=VALUE")
        try:
            settings[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            settings[key.strip()] = raw
    with open_box(args) as box:
        host = box.create_host(args.name, **settings)
    if out.json:
        out.emit({"name": host.name, "settings": host.settings.model_dump()})
    else:
        out.say(f"host {host.name!r} created")


def queues(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        stats = box.queue_stats(inputs.known_host(box, args.host))
    if out.json:
        out.emit(stats)
        return
    out.table(
        ["host", "subscription", "service", "depth", "ready", "held", "leased", "oldest"],
        [
            [
                q.host,
                f"{q.name} ({q.subscription})" if q.name else str(q.subscription),
                q.service,
                q.depth,
                q.ready,
                q.held,
                q.leased,
                age(q.oldest_age_seconds),
            ]
            for q in stats
        ],
        empty="every queue is empty",
    )


def instances(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        found = box.instances(inputs.known_host(box, args.host))
    if out.json:
        out.emit(found)
        return
    out.table(
        ["id", "host", "hostname", "pid", "state", "heartbeat"],
        [[i.id, i.host, i.hostname, i.pid, i.state, i.heartbeat_at.isoformat()] for i in found],
        empty="no host instances",
    )


def _first_line(text: str | None, most: int = 60) -> str:
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""  # a traceback's last line says what failed
    return last if len(last) <= most else last[: most - 1] + "…"


def _entry_json(e: SuspendedEntry, names: dict[int, Any]) -> dict[str, Any]:
    sub = names.get(e.subscription) if e.subscription is not None else None
    return {
        "id": e.id,
        "message_id": e.message_id,
        "reason": e.reason,
        "resumable": e.resumable,
        "host": e.host,
        "subscription": e.subscription,
        "subscription_name": sub.name if sub else None,
        "service": sub.service if sub else None,
        "attempts": e.attempts,
        "suspended_at": e.suspended_at,
        "error": e.error,
        "report": e.report,
    }


def suspended_list(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        query = inputs.suspended_query(box, args)
        entries = box.suspended(**query, limit=args.limit)
        subs = {s.id: s for s in box.subscriptions()}
    if out.json:
        out.emit([_entry_json(e, subs) for e in entries])
        return
    out.table(
        ["id", "reason", "resumable", "host", "subscription", "attempts", "suspended", "error"],
        [
            [
                e.id,
                e.reason,
                "yes" if e.resumable else "no",
                e.host or "-",
                subs[e.subscription].name if e.subscription in subs else e.subscription or "-",
                e.attempts,
                e.suspended_at.isoformat(timespec="seconds"),
                _first_line(e.error),
            ]
            for e in entries
        ],
        empty="no suspended entries",
    )
    if len(entries) == args.limit:
        out.note(f"(the first {args.limit}; --limit shows more)")


def suspended_show(args: argparse.Namespace, out: Terminal) -> None:
    from messagebox.errors import UnknownMessage
    from predicates.text import format_value

    with open_box(args) as box:
        entry = box.suspended_entry(args.id)
        subs = {s.id: s for s in box.subscriptions()}
        try:
            message = box.message_summary(entry.message_id)
        except UnknownMessage:
            message = None
    if out.json:
        out.emit(
            {
                "entry": _entry_json(entry, subs),
                "message": None
                if message is None
                else {
                    "id": message.id,
                    "published_at": message.published_at,
                    "publisher": message.publisher,
                    "promoted": message.promoted,
                    "written": message.written,
                    "body_part": message.body_part,
                    "parts": [{"name": n, "size": s} for n, s in message.part_sizes.items()],
                },
            }
        )
        return
    sub = subs.get(entry.subscription) if entry.subscription is not None else None
    pairs = [
        ("entry", str(entry.id)),
        ("reason", f"{entry.reason} ({'resumable' if entry.resumable else 'not resumable'})"),
        ("host", entry.host or "-"),
        (
            "subscription",
            f"{sub.name} ({sub.id}), service {sub.service}"
            if sub
            else str(entry.subscription or "-"),
        ),
        ("attempts", str(entry.attempts)),
        ("suspended at", entry.suspended_at.isoformat()),
        ("message", str(entry.message_id)),
    ]
    if message is None:
        pairs.append(("", "(no longer in the spool)"))
    else:
        pairs.append(("published", f"{message.published_at.isoformat()} by {message.publisher}"))
        pairs.append(
            (
                "parts",
                "\n".join(
                    f"{n}  {size(s)}" + ("  (body)" if n == message.body_part else "")
                    for n, s in message.part_sizes.items()
                ),
            )
        )
        for label, props in (("promoted", message.promoted), ("written", message.written)):
            pairs.append(
                (label, "\n".join(f"{k} = {format_value(v)}" for k, v in props.items()) or "-")
            )
    pairs.append(("error", entry.error or "-"))
    if entry.report:
        pairs.append(("report", json.dumps(entry.report, indent=2, ensure_ascii=False)))
    out.fields(pairs)


def suspended_act(args: argparse.Namespace, out: Terminal) -> None:
    from messagebox.errors import ValidationError

    action = args.action
    filters = [args.reason, args.host, args.service, args.subscription, args.older_than]
    given = any(f is not None for f in filters)
    if args.ids and (args.all_matching or given):
        raise inputs.UsageError("give entry ids, or --all-matching with filters, not both")
    if not args.ids and not args.all_matching:
        raise inputs.UsageError(
            "name the entries: give their ids, or --all-matching with at least one filter "
            "(--reason, --host, --service, --subscription, --older-than)"
            if not given
            else "filters select entries only with --all-matching (an explicit bulk change)"
        )
    if args.all_matching and not given:
        raise inputs.UsageError(
            "--all-matching needs at least one filter (--reason, --host, --service, "
            "--subscription, --older-than)"
        )
    with open_box(args) as box:
        run = box.resume if action == "resume" else box.terminate
        if args.ids and action == "resume":
            for entry_id in args.ids:  # refused as such (1), rather than as not found (3)
                entry = box.suspended_entry(entry_id)
                if not entry.resumable:
                    raise ValidationError(
                        f"suspended entry {entry_id} is not resumable ({entry.reason}); "
                        "terminate it"
                        + (
                            ", or reroute it"
                            if entry.reason in ("routing-failure", "subscription-removed")
                            else ""
                        )
                        + "; nothing was resumed"
                    )
        if args.ids:
            done = run(*args.ids)
        else:
            query = inputs.suspended_query(box, args)
            with out.progress(f"{action}") as step:
                done = run(**query, batch=BULK_BATCH, progress=step)
    past = {"resume": "resumed", "terminate": "terminated"}[action]
    if out.json:
        out.emit({past: done, "count": len(done)})
    else:
        shown = ", ".join(map(str, done[:20])) + (", …" if len(done) > 20 else "")
        out.say(
            f"{past} {len(done)} entr{'ies' if len(done) != 1 else 'y'}"
            + (f": {shown}" if done else "")
        )


def suspended_reroute(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        moved = box.reroute(*args.ids)
    if out.json:
        out.emit({"rerouted": {str(k): list(v) for k, v in moved.items()}, "count": len(moved)})
    else:
        out.say(f"rerouted {len(moved)} entr{'ies' if len(moved) != 1 else 'y'}")


def cleanup(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        report = box.cleanup(batch=args.batch, progress=out.note if out.show_progress else None)
    if out.json:
        out.emit(report)
        return
    out.say(
        f"deleted {report.messages} messages and {report.parts} parts; "
        f"released {report.released_leases} leases of {report.dead_instances} "
        f"dead instances; purged {report.purged_subscriptions} instance "
        f"subscriptions; trimmed {report.tracking_events} tracked events "
        f"in {report.seconds:.2f} s"
        + (" (skipped: another cleanup is running)" if report.skipped else "")
    )


def stats(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        found = box.stats()
    if out.json:
        out.emit(found)
        return

    def counts(found: dict[str, int]) -> str:
        return ", ".join(f"{k} {n}" for k, n in found.items()) or "-"

    out.fields(
        [
            (
                "messages",
                f"{found.messages} ({found.parts} parts, {size(found.part_bytes)})",
            ),
            ("queued", f"{sum(found.queued.values())} ({counts(found.queued)})"),
            ("suspended", f"{sum(found.suspended.values())} ({counts(found.suspended)})"),
            (
                "subscriptions",
                f"{sum(found.subscriptions.values())} ({counts(found.subscriptions)})",
            ),
            ("hosts", str(found.hosts)),
            ("host instances", str(found.host_instances)),
            ("service instances", counts(found.service_instances)),
        ]
    )


def _tracking_json(settings: Any) -> dict[str, Any]:
    return {
        "enabled": settings.enabled,
        "retention_seconds": settings.retention.total_seconds(),
    }


def _say_tracking(out: Terminal, settings: Any) -> None:
    if out.json:
        out.emit(_tracking_json(settings))
    elif settings.enabled:
        out.say(f"tracking is enabled; events are kept {age(settings.retention.total_seconds())}")
    else:
        out.say(f"tracking is disabled (retention {age(settings.retention.total_seconds())})")


def tracking_status(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        _say_tracking(out, box.tracking())


def tracking_enable(args: argparse.Namespace, out: Terminal) -> None:
    retention = None if args.retention is None else inputs.duration(args.retention, "--retention")
    if retention is not None and retention.total_seconds() <= 0:
        raise inputs.UsageError(f"--retention {args.retention!r}: must be more than zero")
    with open_box(args) as box:
        _say_tracking(out, box.configure_tracking(True, retention=retention))


def tracking_disable(args: argparse.Namespace, out: Terminal) -> None:
    with open_box(args) as box:
        _say_tracking(out, box.configure_tracking(False))


def tracking_events(args: argparse.Namespace, out: Terminal) -> None:

    from messagebox.errors import UnknownMessage
    from messagebox.tracking import EVENTS

    if args.event is not None and args.event not in EVENTS:
        raise inputs.UsageError(f"--event {args.event!r}: one of {', '.join(EVENTS)}")
    if args.since is not None:
        inputs.duration(args.since, "--since")  # a usage error before connecting
    message_id = None if args.message_id is None else inputs.message_id(args.message_id)
    with open_box(args) as box:
        since = None if args.since is None else inputs.ago(args.since, "--since", box.now())
        subscription = None
        if args.subscription is not None:
            sub = inputs.ref(args.subscription)
            subscription = sub if isinstance(sub, int) else box.subscription(sub).id
        inputs.known_host(box, args.host)
        found = box.tracked(
            message_id,
            event=args.event,
            host=args.host,
            subscription=subscription,
            since=since,
            limit=args.limit,
        )
        if message_id is not None and not found:
            try:
                box.message_summary(message_id)
            except UnknownMessage:
                raise UnknownMessage(
                    f"no message {message_id} is stored, and no event of it is tracked"
                ) from None
            if not box.tracking().enabled:
                out.note("tracking is disabled: `messagebox tracking enable` turns it on")
        names = {x.id: x.name for x in box.subscriptions()}
    if out.json:
        out.emit(
            [
                {
                    "at": e.at,
                    "event": e.event,
                    "message_id": str(e.message_id),
                    "subscription": e.subscription,
                    "host": e.host,
                    "entry": e.entry,
                    "detail": e.detail,
                }
                for e in found
            ]
        )
        return
    out.table(
        ["at", "event", "message", "subscription", "host", "entry", "detail"],
        [
            [
                e.at.isoformat(timespec="milliseconds"),
                e.event,
                str(e.message_id),
                names.get(e.subscription, e.subscription) if e.subscription is not None else "-",
                e.host or "-",
                e.entry if e.entry is not None else "-",
                _first_line(e.detail),
            ]
            for e in found
        ],
        empty="no tracked events",
    )
    if message_id is None and len(found) == args.limit:
        out.note(f"(the newest {args.limit}; --limit shows more)")


def metrics(args: argparse.Namespace, out: Terminal) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from messagebox.metrics import StoreCollector

    with open_box(args) as box:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(box))
        text = generate_latest(registry).decode()
    if out.json:
        from prometheus_client.parser import text_string_to_metric_families

        out.emit(
            [
                {"name": sample.name, "labels": sample.labels, "value": sample.value}
                for family in text_string_to_metric_families(text)
                for sample in family.samples
            ]
        )
    else:
        sys.stdout.write(text)


COMMANDS: dict[tuple[str, str], Callable[[argparse.Namespace, Terminal], None]] = {
    ("init", ""): init,
    ("publish", ""): publish,
    ("subscriptions", ""): subscriptions_list,
    ("subscriptions", "list"): subscriptions_list,
    ("subscriptions", "add"): subscriptions_add,
    ("subscriptions", "remove"): subscriptions_remove,
    ("route", "explain"): route_explain,
    ("hosts", ""): hosts_list,
    ("hosts", "list"): hosts_list,
    ("hosts", "add"): hosts_add,
    ("queues", ""): queues,
    ("instances", ""): instances,
    ("suspended", "list"): suspended_list,
    ("suspended", "show"): suspended_show,
    ("suspended", "resume"): suspended_act,
    ("suspended", "terminate"): suspended_act,
    ("suspended", "reroute"): suspended_reroute,
    ("cleanup", ""): cleanup,
    ("stats", ""): stats,
    ("tracking", ""): tracking_status,
    ("tracking", "status"): tracking_status,
    ("tracking", "enable"): tracking_enable,
    ("tracking", "disable"): tracking_disable,
    ("tracking", "events"): tracking_events,
    ("metrics", ""): metrics,
}
"""The function of each (command, action); "" when there is no action."""
