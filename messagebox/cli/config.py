"""Routing as code on the command line: ``export``, ``plan``, ``apply``, ``versions``,
``rollback`` and ``lint`` (docs/howto-routing-as-code.md). ``plan`` (and ``apply
--dry-run``) and ``lint`` exit with :data:`EXIT_CHANGES` when there is a change or a
finding."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from messagebox.cli import inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal

if TYPE_CHECKING:
    from messagebox.config.routing_file import RoutingConfig

EXIT_CHANGES = 4
"""``plan``, ``apply --dry-run``: the file differs from what is live; ``lint``: there
are findings; ``check``: the store is inconsistent."""

SPARK_ABOVE = 1_000_000
"""``plan`` routes a window of more messages than this on Spark, when it is installed."""


class Changes(Exception):
    """Raised after a command printed its results, to exit with :data:`EXIT_CHANGES`."""


def _config(args: argparse.Namespace) -> tuple[RoutingConfig, str]:
    from messagebox.config.routing_file import RoutingFileError, load

    text = inputs.read_arg("@" + args.file, "routing file")
    try:
        return load(text, args.file), text
    except RoutingFileError as exc:
        raise inputs.UsageError(str(exc)) from None


def export(args: argparse.Namespace, out: Terminal) -> None:
    """The live configuration as a routing file (or the file's JSON Schema)."""
    if args.schema:
        from messagebox.config.routing_file import json_schema

        out.say(json.dumps(json_schema(), indent=2))
        return
    with open_box(args) as box:
        config = box.export_config()
    if out.json:
        from messagebox.config.routing_file import as_mapping

        out.emit(as_mapping(config))
    else:
        out.stdout.write(config.text())


def _router(args: argparse.Namespace, total: int, out: Terminal) -> Any:
    """Spark's router when asked (``--spark``), or for a window of more than
    :data:`SPARK_ABOVE` messages (``total``) when Spark is installed."""
    spark = args.spark
    if not spark:
        try:
            import pyspark  # noqa: F401
        except ImportError:
            return None
        spark = total > SPARK_ABOVE
    if not spark:
        return None
    from messagebox.pipelines.spark import session
    from messagebox.pipelines.whatif import spark_router

    out.note("routing the window on Spark")
    return spark_router(session("local[*]", "messagebox-plan"))


def plan(args: argparse.Namespace, out: Terminal) -> None:
    """The difference with what is live, and its effect on the window's traffic."""
    config, _ = _config(args)
    window = None if args.no_traffic else inputs.duration(args.window, "--window")
    with open_box(args) as box:
        total = None if window is None else box.window_count(window)
        router = None if total is None else _router(args, total, out)
        with out.progress("routing the window's messages") as step:
            result = box.plan(
                config, window=window, router=router, progress=lambda n: step(n, total)
            )
    if out.json:
        out.emit(result.as_json())
    else:
        for line in result.describe():
            out.say(line)
    if result.changed:
        raise Changes


def apply(args: argparse.Namespace, out: Terminal) -> None:
    """Apply a routing file in one transaction, refused when lint finds errors unless
    ``--force`` (``--dry-run``: only the plan, and its exit code)."""
    config, text = _config(args)
    with open_box(args) as box:
        if args.dry_run:
            result = box.plan(config, window=None)
            lines, data, changed = result.describe(), result.as_json(), result.changed
        else:
            who = getattr(args, "served_for", None)
            applied = box.apply(text, who=who, allow_empty=args.allow_empty, force=args.force)
            said = (
                f"applied as version {applied.version}"
                if applied.version
                else "nothing to apply: no version recorded"
            )
            lines, changed = [*applied.diff.describe(), said], False
            data = {
                "version": applied.version,
                "changes": applied.diff.as_json(),
                "lint": applied.lint.as_json(),
            }
            args.audit_count = len(applied.diff.subscriptions) + len(applied.diff.hosts)
            for finding in applied.lint.errors:
                out.note(f"warning: applied with --force: {finding}")
            for finding in applied.lint.warnings:
                out.note(f"warning: {finding}")
    if out.json:
        out.emit(data)
    else:
        for line in lines:
            out.say(line)
    if changed:
        raise Changes


def versions(args: argparse.Namespace, out: Terminal) -> None:
    """The applied versions, newest first; with a number, that version's file."""
    with open_box(args) as box:
        if args.number is not None:
            one = box.routing_version(args.number)
            if out.json:
                out.emit(one)
            else:
                out.stdout.write(one.content or "")
            return
        found = box.versions(args.limit)
    if out.json:
        out.emit(found)
        return
    rows: list[list[str | int | float | None]] = [
        [
            v.version,
            v.applied_at.isoformat(timespec="seconds"),
            v.who,
            v.digest[:12],
            v.summary + (f" (rollback to {v.rollback_of})" if v.rollback_of else ""),
        ]
        for v in found
    ]
    out.table(["version", "applied", "by", "digest", "changes"], rows, "no version applied yet")


def rollback(args: argparse.Namespace, out: Terminal) -> None:
    """Apply an earlier version's file again."""
    with open_box(args) as box:
        applied = box.rollback(args.number, who=getattr(args, "served_for", None))
        args.audit_count = len(applied.diff.subscriptions) + len(applied.diff.hosts)
    if out.json:
        out.emit({"version": applied.version, "changes": applied.diff.as_json()})
        return
    for line in applied.diff.describe():
        out.say(line)
    out.say(
        f"version {args.number} applied again as version {applied.version}"
        if applied.version
        else f"version {args.number} is what is live: nothing to apply"
    )


def lint(args: argparse.Namespace, out: Terminal) -> None:
    """Findings about a routing file's subscriptions (the live ones without a file)."""
    config = _config(args)[0] if args.file else None
    window = inputs.duration(args.window, "--window") if args.window else None
    with open_box(args) as box:
        total = None if window is None else box.window_count(window)
        with out.progress("reading the window's messages") as step:
            found = box.lint(config, window=window, progress=lambda n: step(n, total))
    if out.json:
        out.emit([f.as_json() for f in found])
    elif not found:
        out.note("no finding")
    for finding in [] if out.json else found:
        out.say(str(finding))
    if found:
        raise Changes
