"""What a connection's backend can do, for the modules below the dialects (arrays,
clock, ids, leases) that hold a connection but not its
:class:`~messagebox.storage.dialects.Dialect`.

Each dialect registers its :class:`Capabilities` when its class is defined; code asks
``capabilities.of(conn).<capability>``, never for a backend's name."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa


@dataclass(frozen=True, slots=True)
class Capabilities:
    """A backend's answers to the questions hot statements ask."""

    arrays_as_text: bool = False
    """An array parameter is sent as one text literal and compared with ``= ANY``
    (PostgreSQL); else as a list, tested with ``list_contains`` (DuckDB)."""
    times_as_epoch: bool = False
    """Hot statements fetch times as microseconds since the epoch (cheaper than a time
    with a zone where the driver converts each value slowly)."""
    uuids_as_bytes: bool = False
    """Hot statements fetch UUIDs as their 16 bytes."""
    counts_host_by_index: bool = False
    """Counting one host's queue reads its own index entries (else one scan counts every
    host's at once, cheaper than filtering)."""


_BY_BACKEND: dict[str, Capabilities] = {}


def register(backend: str, capabilities: Capabilities) -> None:
    """Say what connections whose SQLAlchemy dialect is named ``backend`` can do."""
    _BY_BACKEND[backend] = capabilities


def of(conn: sa.Connection) -> Capabilities:
    """What ``conn``'s backend can do (a backend no dialect registered can do none of it)."""
    return _BY_BACKEND.get(conn.dialect.name, _NONE)


_NONE = Capabilities()
