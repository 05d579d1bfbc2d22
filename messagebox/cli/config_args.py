"""The arguments of the routing-as-code commands (:mod:`messagebox.cli.config`)."""

from __future__ import annotations

from typing import Any


def config_parser(sub: Any, command: Any, positive: Any) -> None:
    """Routing as code: export, plan, apply, versions, rollback, lint."""
    export = command(
        sub,
        "export",
        "print the live hosts and subscriptions as a routing file (TOML)",
        description="Print the live configuration as a routing file: hosts with the "
        "settings that differ from the defaults, services' states, subscriptions (not the "
        "instance subscriptions orchestrations make at run time). `apply` of it on an "
        "empty store makes the same configuration.",
    )
    export.add_argument(
        "--schema", action="store_true", help="print the file's JSON Schema instead"
    )
    window_help = "the stored messages to route again: published in the last AGE (default 24h)"
    plan = command(
        sub,
        "plan",
        "what applying a routing file would change, and which messages would move",
        description="Compare a routing file with what is live (subscriptions added, "
        "removed, changed, with filter diffs; host settings) and route the messages "
        "stored in the window under both: per subscription the messages it would gain "
        "and lose, with samples, and the messages that would become or stop being "
        "routing failures; what lint finds (errors, on lines starting with '!', make "
        "`apply` refuse the file unless --force; warnings). Changes nothing. Exit code 4 "
        "when there is a change, 0 when there is none.",
    )
    plan.add_argument("file", metavar="FILE", help="the routing file")
    plan.add_argument("--window", default="24h", help=window_help)
    plan.add_argument("--no-traffic", action="store_true", help="only the difference, no routing")
    plan.add_argument(
        "--spark",
        action="store_true",
        help="route the window on Spark (default: only for more than a million messages)",
    )
    _apply(sub, command)
    versions = command(sub, "versions", "applied routing versions, newest first")
    versions.add_argument(
        "number", nargs="?", type=positive, metavar="N", help="print version N's file"
    )
    versions.add_argument(
        "--limit", type=positive, default=50, help="at most this many (default 50)"
    )
    rollback = command(
        sub, "rollback", "apply an earlier version's routing file again (a new version)"
    )
    rollback.add_argument("number", type=positive, metavar="N", help="the version to go back to")
    lint = command(
        sub,
        "lint",
        "find groups that never match, redundant groups, duplicates, dead subscriptions",
        description="Check a routing file's subscriptions (the live ones without FILE): "
        "groups that can never match, groups another group of the same filter covers, "
        "subscriptions of one service that match the same messages, property names none "
        "of the newest stored messages carries (with the nearest one they do); with "
        "--window, also subscriptions that matched none of the messages stored in it. "
        "Exit code 4 when there is a finding.",
    )
    lint.add_argument("file", nargs="?", metavar="FILE", help="the routing file")
    lint.add_argument("--window", help="also check against the messages stored in the last AGE")


def _apply(sub: Any, command: Any) -> None:
    """``apply FILE [--dry-run] [--allow-empty] [--force]``."""
    apply = command(
        sub,
        "apply",
        "make a routing file the live configuration, in one transaction, as a new version",
        description="Apply a routing file in one transaction: a publish routes by the old "
        "subscriptions or by the new ones, never a mix. A filter, priority, ordered, "
        "on_failure or state changes in place (the subscription keeps its id and waiting "
        "entries); a change of service, host, kind or correlation replaces it. What the "
        "file does not name is removed. Recorded as a new version (`versions`). Lint "
        "runs first: a subscription the file adds or whose filter it changes with a group "
        "or filter that can never match, or a property none of the newest stored "
        "messages carries, is refused unless --force; other findings are warnings. A "
        "file that declares nothing, or no subscription while some are live (what an "
        "export that failed leaves), is refused unless --allow-empty.",
    )
    apply.add_argument("file", metavar="FILE", help="the routing file")
    apply.add_argument(
        "--dry-run",
        action="store_true",
        help="print the changes and what lint finds, apply nothing (exit code 4 when there "
        "is a change, as `plan`)",
    )
    apply.add_argument(
        "--force",
        action="store_true",
        help="apply it even if lint finds errors (a property publishers do not send yet)",
    )
    apply.add_argument(
        "--allow-empty",
        action="store_true",
        help="apply it even if it declares nothing, or no subscription while some are live",
    )
