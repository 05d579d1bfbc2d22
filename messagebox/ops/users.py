"""The storage side of named users and their console sessions (``mb_user``,
``mb_session``): what :class:`~messagebox.ops.accounts.Accounts` checks and hashes, this
stores and reads, each call one transaction.

A session row is found by the SHA-256 of its token (the token itself is only ever in
the browser's cookie). It lasts until its ``expires_at`` (set when it opens) and while
it is used: a session not seen for the idle time its reader gives is over. A user's
session takes the user's role as the user row says *now* (a role change applies on the
next request), and ends with the user: disabling, removing or giving a new password
deletes the user's sessions. Times are the database's.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.errors import AlreadyExists, Conflict, UnknownUser
from messagebox.storage import schema
from messagebox.storage.store import Store
from messagebox.suggest import did_you_mean

TOUCH_SECONDS = 30.0
"""A session's ``last_seen`` is written when it is older than this (not on every
request): the idle time-out is kept to within as much."""
MAX_SESSIONS = 100
"""Open sessions one user (or token) keeps at most: opening another ends the oldest."""
SWEEP_IDLE_SECONDS = 24 * 3600.0
"""Sessions idle this long are deleted whatever their reader's idle time (its bound)."""


@dataclass(frozen=True)
class User:
    """A named user of the console (never with the password's hash)."""

    name: str
    role: str
    created_at: datetime
    disabled: bool


@dataclass(frozen=True)
class StoredSession:
    """An open session: who (a user's name, or ``token:ROLE``), with which role now."""

    who: str
    role: str
    created_at: datetime
    expires_at: datetime
    last_seen: datetime
    bound: str | None
    """A token's session: what binds it to the token (see ``mb_session``)."""


def _user(row: Any) -> User:
    return User(row.name, row.role, row.created_at, bool(row.disabled))


class UserStore:
    """Users and sessions in one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def add(self, name: str, role: str, password_hash: str) -> User:
        u = schema.user
        with self._store.transaction() as conn:
            if conn.execute(sa.select(u.c.name).where(u.c.name == name)).first() is not None:
                raise AlreadyExists(f"a user named {name!r} exists already")
            conn.execute(
                u.insert().values(
                    name=name,
                    role=role,
                    password_hash=password_hash,
                    created_at=sa.func.now(),
                    disabled=False,
                )
            )
            return self._get(conn, name)

    def all(self) -> list[User]:
        u = schema.user
        with self._store.transaction() as conn:
            rows = conn.execute(
                sa.select(u.c.name, u.c.role, u.c.created_at, u.c.disabled).order_by(u.c.name)
            )
            return [_user(r) for r in rows]

    def any(self) -> bool:
        """Whether the store has any user (enabled or not)."""
        with self._store.transaction() as conn:
            return conn.execute(sa.select(schema.user.c.name).limit(1)).first() is not None

    def get(self, name: str) -> User:
        with self._store.transaction() as conn:
            return self._get(conn, name)

    def credentials(self, name: str) -> tuple[User, str] | None:
        """A user and its password's hash (None: no such user)."""
        u = schema.user
        with self._store.transaction() as conn:
            row = conn.execute(
                sa.select(
                    u.c.name, u.c.role, u.c.created_at, u.c.disabled, u.c.password_hash
                ).where(u.c.name == name)
            ).first()
        return None if row is None else (_user(row), row.password_hash)

    def set_role(self, name: str, role: str) -> User:
        return self._change(name, role=role)

    def set_disabled(self, name: str, disabled: bool) -> User:
        return self._change(name, disabled=disabled, end_sessions=disabled)

    def set_password_hash(self, name: str, password_hash: str, *, end_sessions: bool) -> User:
        return self._change(name, password_hash=password_hash, end_sessions=end_sessions)

    def remove(self, name: str) -> None:
        with self._store.transaction() as conn:
            self._get(conn, name)
            conn.execute(schema.user.delete().where(schema.user.c.name == name))
            conn.execute(schema.session.delete().where(schema.session.c.who == name))

    def _change(self, name: str, *, end_sessions: bool = False, **values: object) -> User:
        u = schema.user
        with self._store.transaction() as conn:
            self._get(conn, name)
            conn.execute(u.update().where(u.c.name == name).values(**values))
            if end_sessions:
                conn.execute(schema.session.delete().where(schema.session.c.who == name))
            return self._get(conn, name)

    def _get(self, conn: sa.Connection, name: str) -> User:
        u = schema.user
        row = conn.execute(
            sa.select(u.c.name, u.c.role, u.c.created_at, u.c.disabled).where(u.c.name == name)
        ).first()
        if row is None:
            known = conn.execute(sa.select(u.c.name)).scalars().all()
            raise UnknownUser(
                f"no user named {name!r}{did_you_mean(name, known)} (`messagebox users list` "
                "shows them)"
            )
        return _user(row)

    # --- sessions ---

    def open_session(
        self, digest: str, who: str, role: str, lifetime: float, bound: str | None
    ) -> None:
        """Store a new session (and forget the expired ones, and the oldest of ``who``'s
        past :data:`MAX_SESSIONS`)."""
        s = schema.session
        now_plus = self._store.dialect.now_plus
        with suppress(Conflict), self._store.transaction() as conn:  # best effort
            conn.execute(
                s.delete().where(
                    (s.c.expires_at <= sa.func.now())
                    | (s.c.last_seen <= now_plus(-SWEEP_IDLE_SECONDS))
                )
            )
        with self._store.transaction() as conn:
            conn.execute(
                s.insert().values(
                    id=digest,
                    who=who,
                    role=role,
                    created_at=sa.func.now(),
                    expires_at=now_plus(float(lifetime)),
                    last_seen=sa.func.now(),
                    bound=bound,
                )
            )
            newest = (
                sa.select(s.c.id)
                .where(s.c.who == who)
                .order_by(s.c.created_at.desc(), s.c.id)
                .limit(MAX_SESSIONS)
            )
            conn.execute(s.delete().where(s.c.who == who, s.c.id.not_in(newest)))

    def find_session(self, digest: str, idle: float) -> StoredSession | None:
        """The session open under ``digest``: not past its expiry, used within ``idle``
        seconds, of a user that exists and is enabled (None otherwise). Marks it seen."""
        s, u = schema.session, schema.user
        now_plus = self._store.dialect.now_plus
        with self._store.transaction() as conn:
            row = conn.execute(
                sa.select(
                    s.c.who,
                    sa.func.coalesce(u.c.role, s.c.role).label("role"),
                    s.c.created_at,
                    s.c.expires_at,
                    s.c.last_seen,
                    s.c.bound,
                    u.c.name.label("user"),
                    u.c.disabled,
                    (s.c.last_seen < now_plus(-TOUCH_SECONDS)).label("stale"),
                )
                .select_from(s.outerjoin(u, u.c.name == s.c.who))
                .where(
                    s.c.id == digest,
                    s.c.expires_at > sa.func.now(),
                    s.c.last_seen > now_plus(-float(idle)),
                )
            ).first()
        if row is None:
            return None
        # the user's sessions were deleted with it; one left by a race is deleted here
        gone = not row.who.startswith("token:") and (row.user is None or row.disabled)
        if gone or row.stale:
            # (two requests of a session at once: one of them marks it, on DuckDB the
            # other's write conflicts and is dropped)
            with suppress(Conflict), self._store.transaction() as conn:
                if gone:
                    conn.execute(s.delete().where(s.c.id == digest))
                else:
                    conn.execute(s.update().where(s.c.id == digest).values(last_seen=sa.func.now()))
        if gone:
            return None
        return StoredSession(
            row.who, row.role, row.created_at, row.expires_at, row.last_seen, row.bound
        )

    def close_session(self, digest: str) -> None:
        with self._store.transaction() as conn:
            conn.execute(schema.session.delete().where(schema.session.c.id == digest))

    def close_sessions(self, who: str) -> int:
        """End every session of ``who``; how many there were."""
        with self._store.transaction() as conn:
            done = conn.execute(schema.session.delete().where(schema.session.c.who == who))
            return int(done.rowcount or 0)

    def sessions(self) -> dict[str, int]:
        """Open (unexpired) sessions per user or token."""
        s = schema.session
        with self._store.transaction() as conn:
            rows = conn.execute(
                sa.select(s.c.who, sa.func.count())
                .where(s.c.expires_at > sa.func.now())
                .group_by(s.c.who)
            )
            return {who: int(n) for who, n in rows}
