"""Bulk changes ask first: ``suspended resume|terminate --all-matching``, ``failures
resume|terminate`` and ``orchestrations terminate`` change every entry a filter, a
failure group or an orchestration instance holds, so at a terminal the command line
asks before it starts (:func:`ask`), and without one (a script,
a pipe: ``echo n | messagebox …``) it refuses unless ``--yes`` says the change is meant
(:func:`require_yes`). ``--dry-run`` changes nothing and asks nothing. A command sent to
a serving process is asked about here, at the terminal, and goes with ``--yes``."""

from __future__ import annotations

import argparse
import sys

from messagebox.cli.inputs import UsageError

WHAT = {
    "resume": "puts every {what} back on its queue, to be delivered again",
    "terminate": "deletes every {what}, with no way back",
}


def bulk_action(args: argparse.Namespace) -> str | None:
    """The bulk change a command makes (``resume``, ``terminate``), or None."""
    action = getattr(args, "action", None)
    if action not in WHAT or getattr(args, "dry_run", False):
        return None
    if args.command == "failures" or (args.command == "suspended" and args.all_matching):
        return str(action)
    if args.command == "orchestrations" and action == "terminate":
        return "terminate"
    return None


def _what(args: argparse.Namespace) -> str:
    if args.command == "failures":
        return f"entry of failure group {args.group}"
    if args.command == "orchestrations":
        return f"queued message and suspended entry of orchestration instance {args.id}"
    return "suspended entry matching the filters"


def ask(args: argparse.Namespace) -> bool | None:
    """At a terminal, before a bulk change without ``--yes``: ask, and say whether the
    answer is yes (then ``args.yes`` is set). None when there is nothing to ask."""
    action = bulk_action(args)
    if action is None or args.yes or not sys.stdin.isatty():
        return None
    listed = " (--dry-run lists them)" if hasattr(args, "dry_run") else ""
    print(
        f"This {WHAT[action].format(what=_what(args))}{listed}. {action.capitalize()} them? [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    args.yes = sys.stdin.readline().strip().lower() in ("y", "yes")
    return bool(args.yes)


def require_yes(args: argparse.Namespace) -> None:
    """Refuse a bulk change that was neither confirmed at a terminal nor given ``--yes``."""
    action = bulk_action(args)
    if action is not None and not args.yes:
        past = "resumed" if action == "resume" else "terminated"
        listed = " (--dry-run lists them)" if hasattr(args, "dry_run") else ""
        raise UsageError(
            f"this {WHAT[action].format(what=_what(args))}; without a terminal to ask at, "
            f"give --yes to {action} them{listed}; nothing was {past}"
        )
