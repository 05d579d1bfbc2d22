"""Named users' names, roles and passwords, checked; passwords hashed with Argon2id
(argon2-cffi, its default parameters: RFC 9106's low-memory profile) and never kept,
logged or shown in clear.

A name is 1 to :data:`MAX_NAME` characters: lowercase letters, digits and ``. _ @ -``,
starting with a letter or a digit (so it can never be a service account's
``token:admin``). A password is :data:`MIN_PASSWORD` to :data:`MAX_PASSWORD`
characters without control characters, not the user's name, and not one character or a
well-known password repeated. A role is one of :data:`ROLES`, each one allowed what the
one before it is, and more.
"""

from __future__ import annotations

import re
import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from messagebox.errors import ValidationError
from messagebox.suggest import did_you_mean

READER = "reader"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (READER, OPERATOR, ADMIN)
"""The roles, least allowed first: a reader reads; an operator also acts on entries,
instances and services; an admin also changes hosts, routing and users."""

MAX_NAME = 64
MIN_PASSWORD = 10
MAX_PASSWORD = 1024
_NAME = re.compile(r"[a-z0-9][a-z0-9._@-]*")
_WELL_KNOWN = frozenset(
    {"password", "passwort", "qwerty", "qwertyuiop", "letmein", "welcome", "changeme",
     "admin", "administrator", "messagebox", "secret", "iloveyou", "abc", "abcdef"}
)  # fmt: skip
"""Passwords (lowercase, their digits and punctuation dropped) too common to take."""

HASHER = PasswordHasher()
_DUMMY: list[str] = []
_DUMMY_LOCK = threading.Lock()


def at_least(role: str | None, needed: str) -> bool:
    """Whether ``role`` is allowed what ``needed`` is (None, no role: nothing)."""
    return role in ROLES and ROLES.index(role) >= ROLES.index(needed)


def check_role(role: str) -> str:
    """``role``, when it is one of :data:`ROLES` (else ValidationError, with a guess)."""
    if role not in ROLES:
        shown = role if len(role) <= MAX_NAME else role[:MAX_NAME] + "…"
        raise ValidationError(
            f"no role {shown!r}{did_you_mean(role, ROLES)} (one of: {', '.join(ROLES)})"
        )
    return role


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a user's name (None: it can)."""
    if not name:
        return "a user's name must not be empty"
    if len(name) > MAX_NAME:
        return f"a user's name is at most {MAX_NAME} characters (this one has {len(name):,})"
    if not _NAME.fullmatch(name):
        lower = name.lower()
        guess = f"; did you mean {lower!r}?" if _NAME.fullmatch(lower) else ""
        return (
            f"{_shown(name)} is not a user's name: lowercase letters, digits and . _ @ -, "
            f"starting with a letter or a digit{guess}"
        )
    return None


def check_name(name: str) -> str:
    """``name``, when it can be a user's name (else ValidationError saying why)."""
    problem = name_problem(name)
    if problem is not None:
        raise ValidationError(problem)
    return name


def check_password(password: str, name: str) -> None:
    """Refuse (ValidationError, saying why, never quoting it) a password too short or
    long, with control characters, the user's name, or too easily guessed."""
    if not password:
        raise ValidationError("the password must not be empty")
    if len(password) < MIN_PASSWORD:
        raise ValidationError(f"the password is too short: at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise ValidationError(f"the password is too long: at most {MAX_PASSWORD} characters")
    if any(not c.isprintable() for c in password):
        raise ValidationError("the password must not contain control characters (or newlines)")
    lower = password.lower()
    if name and name.lower() in lower:
        raise ValidationError("the password must not contain the user's name")
    letters = re.sub(r"[^a-z]", "", lower)
    if len(set(password)) < 4 or (letters in _WELL_KNOWN and len(letters) >= len(password) // 2):
        raise ValidationError(
            "the password is too easily guessed (a common word, or too few different "
            "characters): choose a longer or less common one"
        )


def hash_password(password: str) -> str:
    """The Argon2id hash of ``password`` (salted: a new one each time)."""
    return HASHER.hash(password)


def verify(stored: str | None, password: str) -> bool:
    """Whether ``password`` is the one ``stored`` hashes. With no hash (an unknown user)
    a dummy hash is checked, so that the answer takes as long either way."""
    if stored is None:
        _verify(_dummy(), password)
        return False
    return _verify(stored, password)


def needs_rehash(stored: str) -> bool:
    """Whether ``stored`` was made with other parameters than :data:`HASHER`'s."""
    try:
        return HASHER.check_needs_rehash(stored)
    except (InvalidHashError, ValueError):
        return True


def _verify(stored: str, password: str) -> bool:
    try:
        return HASHER.verify(stored, password)
    except (VerificationError, InvalidHashError, ValueError):
        return False


def _dummy() -> str:
    with _DUMMY_LOCK:
        if not _DUMMY:
            _DUMMY.append(HASHER.hash("not anyone's password"))
        return _DUMMY[0]


def _shown(name: str) -> str:
    """``name`` quoted for a message: control characters escaped, at most 64 shown."""
    return repr(name[:MAX_NAME] + ("…" if len(name) > MAX_NAME else ""))
