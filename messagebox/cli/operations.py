"""The commands that look after the store: ``init``, ``cleanup``, ``stats``, ``check``,
``tracking status|enable|disable|events`` and ``metrics``."""

from __future__ import annotations

import argparse
from typing import Any

from messagebox.cli import inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal, age, last_line, size


def init(args: argparse.Namespace, out: Terminal) -> None:
    """Create the schema at the URL, or upgrade it."""
    from messagebox.storage.schema import SCHEMA_VERSION

    with open_box(args, create=True) as box:
        url = box.url.render_as_string(hide_password=True)
    if out.json:
        out.emit({"url": url, "schema_version": SCHEMA_VERSION})
    else:
        out.say(f"schema version {SCHEMA_VERSION} ready at {url}")


def cleanup(args: argparse.Namespace, out: Terminal) -> None:
    """Run the cleanup job once and report what it deleted, released and trimmed."""
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
        + (f"; {report.expired} expired entries swept" if report.expired else "")
        + (
            f"; tracking keeps the {report.tracked_messages} deleted messages' properties"
            if report.tracked_messages
            else ""
        )
        + (" (skipped: another cleanup is running)" if report.skipped else "")
    )


def check(args: argparse.Namespace, out: Terminal) -> None:
    """The store's inconsistencies (:mod:`messagebox.storage.consistency`); exits with
    ``EXIT_CHANGES`` when there is one."""
    from messagebox.cli.config import Changes

    with open_box(args) as box:
        problems = box.check()
    if out.json:
        out.emit(problems)
    elif problems:
        out.say("\n".join(str(p) for p in problems))
    else:
        out.say("consistent: references equal entries, parts and messages complete")
    if problems:
        raise Changes


def stats(args: argparse.Namespace, out: Terminal) -> None:
    """Counts over the whole store."""
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
    """The tracking settings as JSON."""
    return {
        "enabled": settings.enabled,
        "retention_seconds": settings.retention.total_seconds(),
    }


def _say_tracking(out: Terminal, settings: Any) -> None:
    """Show the tracking settings: enabled or not, and the retention."""
    if out.json:
        out.emit(_tracking_json(settings))
    elif settings.enabled:
        out.say(f"tracking is enabled; events are kept {age(settings.retention.total_seconds())}")
    else:
        out.say(f"tracking is disabled (retention {age(settings.retention.total_seconds())})")


def tracking_status(args: argparse.Namespace, out: Terminal) -> None:
    """Show whether tracking is enabled, and its retention."""
    with open_box(args) as box:
        _say_tracking(out, box.tracking())


def tracking_enable(args: argparse.Namespace, out: Terminal) -> None:
    """Enable tracking, with ``--retention`` when given."""
    retention = None if args.retention is None else inputs.duration(args.retention, "--retention")
    if retention is not None and retention.total_seconds() <= 0:
        raise inputs.UsageError(f"--retention {args.retention!r}: must be more than zero")
    with open_box(args) as box:
        _say_tracking(out, box.configure_tracking(True, retention=retention))


def tracking_disable(args: argparse.Namespace, out: Terminal) -> None:
    """Disable tracking."""
    with open_box(args) as box:
        _say_tracking(out, box.configure_tracking(False))


def tracking_events(args: argparse.Namespace, out: Terminal) -> None:
    """A message's tracked events, or the newest ones, as the options filter them."""
    from messagebox.errors import UnknownMessage
    from messagebox.storage.tracking import EVENTS

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
                last_line(e.detail),
            ]
            for e in found
        ],
        empty="no tracked events",
    )
    if message_id is None and len(found) == args.limit:
        out.note(f"(the newest {args.limit}; --limit shows more)")


def metrics(args: argparse.Namespace, out: Terminal) -> None:
    """The store's gauges in the Prometheus text format (as samples with ``--json``)."""
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
        out.stdout.write(text)
