"""Opening the MessageBox a command works on, and recording the command in the audit
log when it changed something."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

AUDITED = frozenset(
    {
        ("init", ""),
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
        ("cleanup", ""),
        ("tracking", "enable"),
        ("tracking", "disable"),
    }
)
"""Commands that change the store (publishing aside): each run that succeeds is audited."""


@contextmanager
def open_box(args: argparse.Namespace, *, create: bool = False) -> Iterator[MessageBox]:
    """The MessageBox at the command's URL; only ``init`` creates one. A command that
    a running process serves uses that process's MessageBox (``args.served_box``), left
    open. A command in :data:`AUDITED` that ends without an error is audited, with the
    number of entries it changed when it says (``args.audit_count``)."""
    from messagebox.engine import MessageBox
    from messagebox.errors import NoSchema

    served: MessageBox | None = getattr(args, "served_box", None)
    if served is not None:
        yield served
        _audit(served, args)
        return
    try:
        box = MessageBox(args.url, create=create)
    except NoSchema as exc:
        raise NoSchema(f"{exc}; `messagebox init` creates it (or upgrades it)") from exc
    with box:
        yield box
        _audit(box, args)


def _audit(box: MessageBox, args: argparse.Namespace) -> None:
    from messagebox import audit

    action = getattr(args, "action", None) or ""
    if (args.command, action) not in AUDITED or getattr(args, "dry_run", False):
        return
    served_for = getattr(args, "served_for", None)
    argv = getattr(args, "argv", None)
    box.audit(
        f"{args.command} {action}".strip(),
        who=served_for or audit.local_user(),
        role="token" if served_for else "local",
        via=audit.SERVED if served_for else audit.CLI,
        count=getattr(args, "audit_count", None),
        detail=None if argv is None else " ".join(argv),
    )
