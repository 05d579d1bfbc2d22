"""The commands on messages and their entries: ``publish``, ``queues``, ``instances``
and ``suspended list|show|resume|terminate|reroute``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from contextlib import ExitStack
from datetime import datetime
from typing import TYPE_CHECKING, Any

from messagebox.cli import confirm, inputs, time_args
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal, age, jsonable, last_line, size
from messagebox.models import REROUTABLE

if TYPE_CHECKING:
    from messagebox.engine import MessageBox
    from messagebox.message import MessageSummary
    from messagebox.models import SuspendedEntry

BULK_BATCH = 1000
"""Entries per transaction of a bulk resume or terminate."""

DRY_RUN_LIMIT = 100_000
"""At most this many entries are listed by ``--dry-run``."""
FILTERS = "--reason, --host, --service, --subscription, --older-than, --error, --group"


def publish(args: argparse.Namespace, out: Terminal) -> None:
    """Publish each file (or standard input) as one message, in batches of ``--batch``;
    show where each routed."""
    from messagebox.errors import MessageBoxError
    from messagebox.message import Message

    promoted = inputs.properties(args)
    written = inputs.assignments(args.written, "--written")
    times: dict[str, Any] = {
        "deliver_at": time_args.instant(args.deliver_at, "--deliver-at"),
        "expires_at": time_args.instant(args.expires_at, "--expires-at"),
        "ttl": time_args.seconds(args.ttl, "--ttl"),
    }
    delay = time_args.seconds(args.delay, "--delay")
    files = _files_to_publish(args)
    # refuses bad properties and times before any I/O
    Message(b"", promoted=promoted, written=written, **times)
    stdin = inputs.stdin_bytes(out) if "-" in files else b""
    results: list[tuple[str, Any]] = []
    with open_box(args) as box, out.progress("publishing") as step:
        for note in _type_traps(box, promoted, inputs.inferred(args.properties)):
            out.note(note)
        for start in range(0, len(files), args.batch):
            chunk = files[start : start + args.batch]
            with ExitStack() as files_open:  # parts are read as they are stored
                batch = [
                    Message(
                        stdin if name == "-" else files_open.enter_context(inputs.open_file(name)),
                        promoted=promoted,
                        written=written,
                        **times,
                    )
                    for name in chunk
                ]
                try:
                    routed = box.publish(batch, policy=args.policy, delay=delay)
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


def _files_to_publish(args: argparse.Namespace) -> list[str]:
    """The files named (``-`` for standard input, the default); a usage error for ``-``
    twice, or a name that is not a readable file."""
    files = list(args.files) or ["-"]
    if files.count("-") > 1:
        raise inputs.UsageError("standard input ('-') can be published once")
    for name in files:
        if name != "-":
            inputs.check_file(name)
    return files


def queues(args: argparse.Namespace, out: Terminal) -> None:
    """Each subscription's queue: its depth by state (ready, held: the service is
    stopped, blocked: behind a suspended entry of their instance, leased) and its oldest
    entry's age."""
    if args.held_keys:
        held_keys(args, out)
        return
    with open_box(args) as box:
        stats = box.queue_stats(inputs.known_host(box, args.host))
    if out.json:
        out.emit(stats)
        return
    out.table(
        [
            "host",
            "subscription",
            "service",
            "depth",
            "ready",
            "held",
            "blocked",
            "leased",
            "scheduled",
            "oldest",
        ],
        [
            [
                q.host,
                f"{q.name} ({q.subscription})" if q.name else str(q.subscription),
                q.service,
                q.depth,
                q.ready,
                q.held,
                q.blocked,
                q.leased,
                scheduled_text(q.scheduled, q.next_due_at),
                age(q.oldest_age_seconds),
            ]
            for q in stats
        ],
        empty="every queue is empty",
    )


def held_keys(args: argparse.Namespace, out: Terminal) -> None:
    """The keys suspended entries hold (``queues --held-keys``), oldest first."""
    with open_box(args) as box:
        held = box.held_keys(inputs.known_host(box, args.host))
    if out.json:
        out.emit([{**dataclasses.asdict(h), "shown": h.shown} for h in held])
        return
    out.table(
        ["host", "subscription", "key", "held by", "reason", "since", "waiting", "error"],
        [
            [
                h.host or "-",
                f"{h.name} ({h.subscription})" if h.name else str(h.subscription),
                h.shown,
                f"suspended entry {h.entry}",
                h.reason,
                h.suspended_at.isoformat(timespec="seconds"),
                h.waiting,
                h.error or "-",
            ]
            for h in held
        ],
        empty="no key is held",
    )


def scheduled_text(n: int, next_due: datetime | None) -> str:
    """``3 (next at 2024-05-01T10:00:00+00:00)``, or ``0``."""
    return f"{n} (next at {next_due.isoformat(timespec='seconds')})" if n and next_due else str(n)


def instances(args: argparse.Namespace, out: Terminal) -> None:
    """The registered host instances and their heartbeats. One whose last heartbeat is
    older than its host's ``dead_after_seconds`` is shown as presumed dead: it stays
    registered until a live instance of its host releases its leases."""
    with open_box(args) as box:
        found = box.instances(inputs.known_host(box, args.host))
        ages = box.heartbeat_ages()
        dead_after = {h.name: h.settings.dead_after_seconds for h in box.hosts()}
    rows = []
    for i in found:
        heard = ages.get(i.id)
        dead = heard is not None and heard > dead_after.get(i.host, float("inf"))
        rows.append((i, heard, dead))
    if out.json:
        out.emit(
            [
                {**jsonable(i), "heartbeat_age_seconds": heard, "presumed_dead": dead}
                for i, heard, dead in rows
            ]
        )
        return
    out.table(
        ["id", "host", "hostname", "pid", "state", "heartbeat", "heartbeat age"],
        [
            [
                i.id,
                i.host,
                i.hostname,
                i.pid,
                "presumed dead" if dead else i.state,
                i.heartbeat_at.isoformat(),
                "-" if heard is None else age(heard),
            ]
            for i, heard, dead in rows
        ],
        empty="no host instances",
    )


def message_show(args: argparse.Namespace, out: Terminal) -> None:
    """A stored message's part (its body unless ``--part``), written as it is to standard
    output a fragment at a time; with ``--json``, its context and part sizes instead."""
    from messagebox.errors import UnknownMessage

    msg_id = inputs.message_id(args.id)
    with open_box(args) as box:
        summary = box.message_summary(msg_id)
        if out.json:
            out.emit(_message_json(summary))
            return
        part = args.part or summary.body_part
        if part not in summary.part_sizes:
            raise UnknownMessage(
                f"message {msg_id} has no part {part!r} (it has: {', '.join(summary.part_sizes)})"
            )
        stream = out.binary()
        for chunk in box.iter_part(msg_id, part):
            stream.write(chunk)
        stream.flush()


def _message_json(m: MessageSummary) -> dict[str, Any]:
    """A stored message's context and part sizes as JSON."""
    return {
        "id": m.id,
        "published_at": m.published_at,
        "publisher": m.publisher,
        "promoted": m.promoted,
        "written": m.written,
        "body_part": m.body_part,
        "parts": [{"name": n, "size": s} for n, s in m.part_sizes.items()],
    }


def entry_json(e: SuspendedEntry, names: dict[int, Any]) -> dict[str, Any]:
    """A suspended entry as JSON, with its subscription's name and service."""
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
    """The suspended entries the filters select, up to ``--limit``."""
    with open_box(args) as box:
        query = inputs.suspended_query(box, args)
        entries = box.suspended(**query, limit=args.limit)
        subs = {s.id: s for s in box.subscriptions()}
    if out.json:
        out.emit([entry_json(e, subs) for e in entries])
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
                last_line(e.error),
            ]
            for e in entries
        ],
        empty="no suspended entries",
    )
    if len(entries) == args.limit:
        out.note(f"(the first {args.limit}; --limit shows more)")


def suspended_show(args: argparse.Namespace, out: Terminal) -> None:
    """One suspended entry: its error and report, its message's parts and properties."""
    from messagebox.errors import UnknownMessage
    from messagebox.predicates.text import format_value

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
                "entry": entry_json(entry, subs),
                "message": None if message is None else _message_json(message),
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
    """Resume or terminate suspended entries: the ids given (all or none), or with
    ``--all-matching`` those the filters select, in batches of :data:`BULK_BATCH`."""
    from messagebox.errors import ValidationError

    action = args.action
    filters = [args.reason, args.host, args.service, args.subscription, args.older_than]
    given = any(f is not None for f in [*filters, args.error, args.group])
    if args.ids and (args.all_matching or given):
        raise inputs.UsageError("give entry ids, or --all-matching with filters, not both")
    if not args.ids and not args.all_matching:
        raise inputs.UsageError(
            "name the entries: give their ids, or --all-matching with at least one filter "
            f"({FILTERS})"
            if not given
            else "filters select entries only with --all-matching (an explicit bulk change)"
        )
    if args.all_matching and not given:
        raise inputs.UsageError(f"--all-matching needs at least one filter ({FILTERS})")
    confirm.require_yes(args)
    expiry = _resume_expiry(args) if action == "resume" else {}
    with open_box(args) as box:
        run = box.resume if action == "resume" else box.terminate
        if args.ids and action == "resume":
            for entry_id in args.ids:  # refused as such (1), rather than as not found (3)
                entry = box.suspended_entry(entry_id)
                if not entry.resumable:
                    raise ValidationError(
                        f"suspended entry {entry_id} is not resumable ({entry.reason}); "
                        "terminate it"
                        + (", or reroute it" if entry.reason in REROUTABLE else "")
                        + "; nothing was resumed"
                    )
        if args.dry_run:
            done = _would_act(box, args, out)
        elif args.ids:
            done = run(*args.ids, **expiry)
        else:
            query = inputs.suspended_query(box, args)
            with out.progress(f"{action}") as step:
                done = run(**query, batch=BULK_BATCH, progress=step, **expiry)
        args.audit_count = len(done)
    past = {"resume": "resumed", "terminate": "terminated"}[action]
    if args.dry_run:
        past = f"would {action}"
    if out.json:
        out.emit({past.replace(" ", "_"): done, "count": len(done)})
        return
    shown = ", ".join(map(str, done[:20])) + (", …" if len(done) > 20 else "")
    out.say(
        f"{past} {len(done)} entr{'ies' if len(done) != 1 else 'y'}"
        + (f": {shown}" if done else "")
    )
    if action == "resume" and not done and args.reason in REROUTABLE:
        out.note(
            f"entries suspended as {args.reason} have no destination to resume to: "
            "`messagebox suspended reroute` routes them again"
        )


_TYPE_NAMES = {"STR": "str", "NUM": "int", "BOOL": "bool", "DATETIME": "datetime"}
"""A type ``-p NAME:TYPE=VALUE`` takes, for each comparison family (by name)."""


def _type_traps(box: MessageBox, promoted: dict[str, Any], guessed: dict[str, str]) -> list[str]:
    """Warnings for ``-p`` values whose guessed type no subscription compares the
    property with (``orders.Zip=12345`` is an int; ``orders.Zip == "12345"`` compares a
    string and never matches it)."""
    from messagebox.config.typecheck import compared as compared_values
    from messagebox.properties import family

    if not guessed:
        return []
    compared: dict[str, set[str]] = {}
    for sub in box.subscriptions():
        if sub.state == "unenlisted":  # routes nothing
            continue
        for name, v in compared_values(sub.filter):
            if name in guessed:
                compared.setdefault(name, set()).add(family(v).name)
    notes = []
    for name, raw in guessed.items():
        families = compared.get(name)
        if not families or family(promoted[name]).name in families:
            continue
        wanted = sorted(_TYPE_NAMES[f] for f in families)
        notes.append(
            f"warning: -p {name}={raw} is read as {type(promoted[name]).__name__}, but the "
            f"subscriptions that test {name} compare it with {' or '.join(wanted)} values, "
            f"which never match it; to publish it as {wanted[0]}: -p {name}:{wanted[0]}={raw}"
        )
    return notes


def _resume_expiry(args: argparse.Namespace) -> dict[str, Any]:
    """``suspended resume``'s ``--ttl`` or ``--expires-at``, as ``resume`` takes them."""
    if args.ttl is not None and args.expires_at is not None:
        raise inputs.UsageError("give --ttl or --expires-at, not both")
    return {
        "ttl": time_args.seconds(args.ttl, "--ttl"),
        "expires_at": time_args.instant(args.expires_at, "--expires-at"),
    }


def _would_act(box: MessageBox, args: argparse.Namespace, out: Terminal) -> list[int]:
    """The entries ``suspended resume|terminate`` would act on (for ``--dry-run``)."""
    if args.ids:
        entries = [box.suspended_entry(i) for i in args.ids]
    else:
        entries = box.suspended(**inputs.suspended_query(box, args), limit=DRY_RUN_LIMIT)
        if len(entries) >= DRY_RUN_LIMIT:
            out.note(f"(looked at the oldest {DRY_RUN_LIMIT:,} matching entries: there are more)")
    return [e.id for e in entries if args.action != "resume" or e.resumable]


def suspended_reroute(args: argparse.Namespace, out: Terminal) -> None:
    """Route the entries given again (every reroutable one when none is given)."""
    with open_box(args) as box:
        moved = box.reroute(*args.ids)
        args.audit_count = len(moved)
    if out.json:
        out.emit({"rerouted": {str(k): list(v) for k, v in moved.items()}, "count": len(moved)})
    else:
        out.say(f"rerouted {len(moved)} entr{'ies' if len(moved) != 1 else 'y'}")
