"""The audit log: every operator action — who, what, when, through which door (the
console, the command line, a command served by a running process), on how many entries
— kept in the store (``mb_audit``), read newest first. The console records its actions
when they succeed; the command line records its commands when they end, done or failed
(with the error), since a bulk change commits batch by batch."""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from messagebox.storage import schema

CONSOLE = "console"
CLI = "cli"
SERVED = "served"
"""A command the command line sent to the process that holds the store."""


@dataclass(frozen=True)
class AuditEntry:
    """One recorded action."""

    at: datetime
    who: str
    role: str
    via: str
    action: str
    target: str | None
    count: int | None
    detail: str | None


def local_user() -> str:
    """``user@machine`` of this process (who runs a command line command)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def record(
    conn: sa.Connection,
    *,
    who: str,
    role: str,
    via: str,
    action: str,
    target: str | None = None,
    count: int | None = None,
    detail: str | None = None,
) -> None:
    conn.execute(
        schema.audit.insert().values(
            acted_at=sa.func.now(),
            who=who[:200],
            role=role,
            via=via,
            action=action,
            target=None if target is None else target[:500],
            entries=count,
            detail=None if detail is None else detail[:2000],
        )
    )


def read(conn: sa.Connection, limit: int) -> list[AuditEntry]:
    a = schema.audit
    rows = conn.execute(sa.select(a).order_by(a.c.acted_at.desc()).limit(limit))
    return [
        AuditEntry(r.acted_at, r.who, r.role, r.via, r.action, r.target, r.entries, r.detail)
        for r in rows
    ]
