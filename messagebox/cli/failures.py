"""The ``failures`` commands: suspended entries grouped by how they failed
(:mod:`messagebox.ops.failures`), one group with its newest entries, and a group resumed or
terminated whole. A group is named by its id, a hash of what its entries share: the same
in every process until the code raising it changes."""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from messagebox.cli import confirm, inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal, last_line

if TYPE_CHECKING:
    from messagebox.ops.failures import FailureGroup

BULK_BATCH = 1000
"""Entries per transaction of a group's resume or terminate."""
_GROUP_ID = re.compile(r"[0-9a-f]{16}")


def failures_parser(sub: Any, command: Any, positive: Any) -> None:
    """``failures list|show|resume|terminate``."""
    failures = command(sub, "failures", "suspended entries grouped by how they failed")
    failures_sub = failures.add_subparsers(dest="action", metavar="ACTION")
    command(
        failures_sub,
        "list",
        "failure groups, largest first",
        description="Suspended entries grouped by reason, service, exception type and where "
        "it was raised (the handler's innermost frames, without line numbers); an error "
        "without a traceback by its message, ids and numbers masked. Largest group first; "
        "the newest 100,000 entries are grouped.",
    )
    show = command(failures_sub, "show", "a failure group: what it is, its newest entries")
    show.add_argument("group", metavar="ID", help="the group's id (`failures list`)")
    show.add_argument(
        "--limit", type=positive, default=20, help="entries shown, newest first (default 20)"
    )
    for action, text in (
        ("resume", "put every resumable entry of a failure group back on its queue"),
        ("terminate", "delete every entry of a failure group and release its messages"),
    ):
        act = command(failures_sub, action, text)
        act.add_argument("group", metavar="ID", help="the group's id (`failures list`)")
        act.add_argument(
            "--dry-run", action="store_true", help=f"only list the entries it would {action}"
        )
        act.add_argument(
            "--yes",
            action="store_true",
            help="do not ask to confirm (needed without a terminal)",
        )


def _group_id(text: str) -> str:
    if not _GROUP_ID.fullmatch(text):
        raise inputs.UsageError(f"{text!r} is not a failure group id (16 hex digits)")
    return text


def _where(g: FailureGroup) -> str:
    """Where a group's failures were raised: its innermost frame."""
    return f"{g.where[-1].file} in {g.where[-1].function}" if g.where else "-"


def _stamp(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat(timespec="seconds")


def _group_json(g: FailureGroup) -> dict[str, Any]:
    return {
        "id": g.id,
        "count": g.count,
        "reason": g.reason,
        "service": g.service,
        "exception": g.exception,
        "message": g.message,
        "where": [{"file": f.file, "function": f.function, "code": f.code} for f in g.where],
        "example": g.example,
        "example_entry": g.example_entry,
        "hosts": sorted(g.hosts),
        "first": g.first,
        "last": g.last,
    }


def failures_list(args: argparse.Namespace, out: Terminal) -> None:
    """Failure groups, largest first."""
    with open_box(args) as box:
        groups = box.failure_groups()
    if out.json:
        out.emit([_group_json(g) for g in groups])
        return
    out.table(
        ["group", "entries", "reason", "service", "exception", "raised at", "message"],
        [
            [
                g.id,
                g.count,
                g.reason,
                g.service or "-",
                g.exception or "-",
                _where(g),
                last_line(g.message, 80),
            ]
            for g in groups
        ],
        empty="no suspended entries",
    )


def failures_show(args: argparse.Namespace, out: Terminal) -> None:
    """One failure group: what its entries share, an example, its newest entries."""
    from messagebox.cli.messages import entry_json

    group_id = _group_id(args.group)
    with open_box(args) as box:
        g = box.failure_group(group_id)
        shown = g.entry_ids[: args.limit]
        entries = box.suspended(ids=shown, limit=len(shown), newest_first=True)
        subs = {s.id: s for s in box.subscriptions()}
    if out.json:
        out.emit({**_group_json(g), "entries": [entry_json(e, subs) for e in entries]})
        return
    out.fields(
        [
            ("group", g.id),
            ("entries", str(g.count)),
            ("reason", g.reason),
            ("service", g.service or "-"),
            ("exception", g.exception or "-"),
            ("message", g.message or "-"),
            ("raised at", "\n".join(map(str, reversed(g.where))) or "- (no traceback)"),
            ("example", f"{g.example or '-'} (entry {g.example_entry}, the newest)"),
            ("hosts", ", ".join(sorted(g.hosts)) or "-"),
            ("first, last", f"{_stamp(g.first)}, {_stamp(g.last)}"),
        ]
    )
    out.say()
    out.table(
        ["id", "resumable", "host", "attempts", "suspended", "error"],
        [
            [
                e.id,
                "yes" if e.resumable else "no",
                e.host or "-",
                e.attempts,
                e.suspended_at.isoformat(timespec="seconds"),
                last_line(e.error),
            ]
            for e in entries
        ],
        empty="no suspended entries",
    )
    if g.count > len(entries):
        out.note(f"(the newest {len(entries)} of {g.count}; --limit shows more)")


def failures_act(args: argparse.Namespace, out: Terminal) -> None:
    """Resume or terminate every entry of a failure group (asked first: ``--yes``)."""
    from messagebox.ops.failures import SCAN

    group_id = _group_id(args.group)
    confirm.require_yes(args)
    action = args.action
    with open_box(args) as box:
        if args.dry_run:
            entries = box.suspended(group=group_id, limit=SCAN)
            done = [e.id for e in entries if action != "resume" or e.resumable]
        else:  # an unknown group is not found (exit code 3)
            run = box.resume if action == "resume" else box.terminate
            with out.progress(action) as step:
                done = run(group=group_id, batch=BULK_BATCH, progress=step)
            args.audit_count = len(done)
    past = f"would {action}" if args.dry_run else {"resume": "resumed"}.get(action, "terminated")
    if out.json:
        out.emit({past.replace(" ", "_"): done, "count": len(done)})
        return
    shown = ", ".join(map(str, done[:20])) + (", …" if len(done) > 20 else "")
    out.say(
        f"{past} {len(done)} entr{'ies' if len(done) != 1 else 'y'}"
        + (f": {shown}" if done else "")
    )
