"""Opening the MessageBox a command works on, and recording the command in the audit
log when it changed something."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

AUDITED = frozenset(
    {
        ("init", ""),
        ("apply", ""),
        ("rollback", ""),
        ("subscriptions", "add"),
        ("subscriptions", "remove"),
        ("subscriptions", "set-filter"),
        ("services", "start"),
        ("services", "stop"),
        ("services", "unenlist"),
        ("hosts", "add"),
        ("hosts", "set"),
        ("hosts", "remove"),
        ("suspended", "resume"),
        ("suspended", "terminate"),
        ("suspended", "reroute"),
        ("suspended", "resubmit"),
        ("failures", "resume"),
        ("failures", "terminate"),
        ("scheduled", "deliver-now"),
        ("scheduled", "cancel"),
        ("orchestrations", "terminate"),
        ("cleanup", ""),
        ("tracking", "enable"),
        ("tracking", "disable"),
        ("users", "add"),
        ("users", "set-role"),
        ("users", "disable"),
        ("users", "enable"),
        ("users", "remove"),
        ("users", "reset-password"),
    }
)
"""Commands that change the store (publishing aside): each run that succeeds is audited."""


def url_problem(url: str) -> str | None:
    """Why ``url`` names no store a command can use (None: it can): empty, not a URL,
    an unknown backend, a DuckDB URL with a host (``duckdb://file.duckdb``). An
    ``http(s)://`` URL names a process serving a store."""
    if not url.strip():
        return (
            "--url is empty: give a database URL (duckdb:///relative.duckdb, "
            "duckdb:////absolute/path.duckdb, postgresql+psycopg://user@host/db)"
        )
    if url.startswith(("http://", "https://")):
        return None
    from messagebox.errors import ValidationError
    from messagebox.storage.dialects import parse_url

    try:
        parse_url(url)
    except ValidationError as exc:
        return str(exc)
    return None


@contextmanager
def open_box(args: argparse.Namespace, *, create: bool = False) -> Iterator[MessageBox]:
    """The MessageBox at the command's URL; only ``init`` creates one. A command that
    a running process serves uses that process's MessageBox (``args.served_box``), left
    open. A command in :data:`AUDITED` is audited when it ends (with the number of
    entries it changed and what it acted on when it says, ``args.audit_count`` and
    ``args.audit_target``), and when it fails, with the
    error: a bulk change commits batch by batch, so a failure may follow changes. It
    names who ran it: the user and machine (or the token holder of a served command),
    or the name given with ``--as``, then with who ran it in the detail."""
    from messagebox.engine import MessageBox
    from messagebox.errors import NoSchema

    served: MessageBox | None = getattr(args, "served_box", None)
    if served is not None:
        with _audited(served, args):
            yield served
        return
    try:
        box = MessageBox(args.url, create=create)
    except NoSchema as exc:
        raise NoSchema(f"{exc}; `messagebox init` creates it (or upgrades it)") from exc
    with box, _audited(box, args):
        yield box


@contextmanager
def _audited(box: MessageBox, args: argparse.Namespace) -> Iterator[None]:
    """Audit the command after it ends: done, or failed part-way (a bulk change commits
    batch by batch, so a failure may follow changes), with the error."""
    try:
        yield
    except BaseException as exc:
        with suppress(Exception):  # the command's own error is the one to report
            _audit(box, args, failed=f"{type(exc).__name__}: {exc}")
        raise
    _audit(box, args)


def _audit(box: MessageBox, args: argparse.Namespace, failed: str | None = None) -> None:
    from messagebox.storage import audit

    action = getattr(args, "action", None) or ""
    if (args.command, action) not in AUDITED or getattr(args, "dry_run", False):
        return
    served_for = getattr(args, "served_for", None)
    argv = getattr(args, "argv", None)
    detail = None if argv is None else " ".join(argv)
    if failed is not None:
        detail = f"{detail or ''} — failed: {failed}"
    named = getattr(args, "as_user", None)  # `users … --as WHO`: who, by who ran it
    if named:
        detail = f"{detail or ''} — run by {served_for or audit.local_user()}"
    box.audit(
        f"{args.command} {action}".strip() + (" (failed)" if failed else ""),
        who=named or served_for or audit.local_user(),
        role="token" if served_for else "local",
        via=audit.SERVED if served_for else audit.CLI,
        target=getattr(args, "audit_target", None),
        count=getattr(args, "audit_count", None),
        detail=detail,
    )
