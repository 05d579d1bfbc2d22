"""Named users and console sessions on :class:`~messagebox.engine.MessageBox`
(docs/operations.md: Users and roles): users with a role (``reader``, ``operator``,
``admin``) and a password kept as an Argon2id hash (:mod:`messagebox.ops.passwords`), and
the console's sessions, kept in the store (:mod:`messagebox.ops.users`) so that they outlive
the console's process. A session is named by a random token that only the browser
keeps; the store has its SHA-256."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from messagebox.errors import UserDisabled, ValidationError
from messagebox.ops import passwords
from messagebox.ops.users import StoredSession, User, UserStore

TOKEN_PREFIX = "token:"
"""A service account's name: ``token:admin`` (the console token), ``token:reader``."""
_SESSION_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,64}")

MIN_SESSION_SECONDS = 60.0
MAX_SESSION_SECONDS = 30 * 24 * 3600.0


def session_digest(token: str) -> str:
    """What the store keeps of a session's token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def binding(token: str, secret: str) -> str:
    """What ties a session opened with a console secret to that secret: an HMAC of the
    secret keyed by the session's token (the store learns nothing of the secret)."""
    return hmac.new(token.encode(), secret.encode(), hashlib.sha256).hexdigest()


def bound_to(session: StoredSession, token: str, secret: str | None) -> bool:
    """Whether a session (of ``token``) was opened with ``secret``."""
    return (
        secret is not None
        and session.bound is not None
        and hmac.compare_digest(session.bound, binding(token, secret))
    )


class Accounts:
    """The user and session methods of a MessageBox."""

    user_store: UserStore

    def add_user(self, name: str, role: str, password: str) -> User:
        """Add a user of the console with this role (``reader``, ``operator``,
        ``admin``) and password (refused when weak:
        :func:`~messagebox.ops.passwords.check_password`; kept as an Argon2id hash). A name
        taken already raises :class:`~messagebox.errors.AlreadyExists`."""
        passwords.check_name(name)
        passwords.check_role(role)
        passwords.check_password(password, name)
        return self.user_store.add(name, role, passwords.hash_password(password))

    def users(self) -> list[User]:
        """Every user, by name (never with a password or its hash)."""
        return self.user_store.all()

    def user(self, name: str) -> User:
        """One user (:class:`~messagebox.errors.UnknownUser` when there is none)."""
        return self.user_store.get(name)

    def has_users(self) -> bool:
        """Whether the store has any user."""
        return self.user_store.any()

    def set_user_role(self, name: str, role: str) -> User:
        """Give a user another role; its open sessions have it from their next request."""
        return self.user_store.set_role(name, passwords.check_role(role))

    def set_user_disabled(self, name: str, disabled: bool = True) -> User:
        """Disable a user (its sessions end at once, and it cannot log in) or enable it
        again (``disabled=False``)."""
        return self.user_store.set_disabled(name, disabled)

    def remove_user(self, name: str) -> None:
        """Remove a user; its sessions end at once."""
        self.user_store.remove(name)

    def set_user_password(self, name: str, password: str) -> User:
        """Give a user a new password (checked as :meth:`add_user` checks one); its
        sessions end at once."""
        passwords.check_password(password, name)
        return self.user_store.set_password_hash(
            name, passwords.hash_password(password), end_sessions=True
        )

    def authenticate(self, name: str, password: str) -> User | None:
        """The user ``name`` when ``password`` is its password; None when either is
        wrong (the same for an unknown user, in about the same time);
        :class:`~messagebox.errors.UserDisabled` when the password is right but the
        user is disabled. A hash made with older parameters is made again."""
        found = None
        if passwords.name_problem(name) is None and len(password) <= passwords.MAX_PASSWORD:
            found = self.user_store.credentials(name)
        if not passwords.verify(None if found is None else found[1], password):
            return None
        assert found is not None
        user, stored = found
        if user.disabled:
            raise UserDisabled(f"user {name!r} is disabled")
        if passwords.needs_rehash(stored):
            self.user_store.set_password_hash(
                name, passwords.hash_password(password), end_sessions=False
            )
        return user

    def open_session(
        self, who: str, role: str, *, lifetime: float, secret: str | None = None
    ) -> str:
        """Open a console session for a user (or a service account, ``token:ROLE``,
        logged in with ``secret``: :func:`bound_to` tells whether a session was)
        lasting at most ``lifetime`` seconds; returns its token (for the cookie: the
        store keeps only its digest)."""
        passwords.check_role(role)
        if not MIN_SESSION_SECONDS <= lifetime <= MAX_SESSION_SECONDS:
            raise ValidationError(
                f"a session lasts from {MIN_SESSION_SECONDS:,.0f} to "
                f"{MAX_SESSION_SECONDS:,.0f} seconds, not {lifetime!r}"
            )
        token = secrets.token_urlsafe(32)
        bound = None if secret is None else binding(token, secret)
        self.user_store.open_session(session_digest(token), who, role, lifetime, bound)
        return token

    def find_session(self, token: str, *, idle: float) -> StoredSession | None:
        """The open session of ``token`` (None when there is none, it expired, was not
        used for ``idle`` seconds, or its user is gone or disabled), with its user's
        role now."""
        if not _SESSION_TOKEN.fullmatch(token):
            return None
        return self.user_store.find_session(session_digest(token), idle)

    def close_session(self, token: str) -> None:
        """End the session of ``token`` (nothing when there is none)."""
        if _SESSION_TOKEN.fullmatch(token):
            self.user_store.close_session(session_digest(token))

    def close_sessions(self, who: str) -> int:
        """End every session of a user (or ``token:ROLE``); how many there were."""
        return self.user_store.close_sessions(who)

    def open_sessions(self) -> dict[str, int]:
        """How many unexpired sessions each user (and ``token:ROLE``) has."""
        return self.user_store.sessions()
