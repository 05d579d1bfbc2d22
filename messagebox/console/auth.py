"""Who is asking: the console's callers, their roles, and the secrets they show.

A caller is a **user** logged in at ``/login`` by name and password (a role: reader,
operator or admin, as the store says on each request), a **service account** — the
console token, ``token:admin``, or the read token (``MESSAGEBOX_CONSOLE_READ_TOKEN``),
``token:reader`` — or nobody (anonymous). A login opens a session kept in the store
(:meth:`~messagebox.MessageBox.open_session`): its random token goes in an ``HttpOnly``,
``SameSite=Strict`` cookie (``Secure`` over https) and the store keeps its SHA-256, so a
restart of the console logs no one out. A session ends at logout, after the console's
idle time or its lifetime (:class:`SessionSettings`), and at once when its user is
disabled, removed or given a new password; a token's session when that token changes.

Every form posted from a session carries the session's CSRF token (an HMAC of the
session's token: nothing more to keep), checked before anything changes. Scripts skip
the login: an ``Authorization: Bearer`` header with a token (or the form field
``token``, as before) is checked on each request and needs no CSRF token (a browser
never sends either by itself).

Every secret is checked by :func:`checked`, in constant time, and counted: a wrong one
towards the lock-out of its address (:mod:`messagebox.console.lockout`; the address is
the socket peer's unless trusted proxies are configured: :mod:`messagebox.console.clients`).
Which role each route needs is :mod:`messagebox.console.access`'s.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

from messagebox.console.lockout import Policy
from messagebox.ops.accounts import (
    MAX_SESSION_SECONDS,
    MIN_SESSION_SECONDS,
    TOKEN_PREFIX,
    bound_to,
)
from messagebox.ops.passwords import ADMIN, OPERATOR, READER, at_least

if TYPE_CHECKING:
    from messagebox.console.state import Console

COOKIE = "mb_session"
LOGIN_ATTEMPTS = 5
"""Failed secrets from one address (or for one user) within :data:`LOGIN_WINDOW` that
lock it out."""
LOGIN_WINDOW = 60.0
"""Seconds: the span failures count in, and the first lock's length (each next one
doubles, up to :attr:`Policy.cap <messagebox.console.lockout.Policy.cap>`)."""
CALLER = "messagebox.caller"
"""The request scope's key of its :class:`Caller`, found once per request."""
RULE = "messagebox.rule"
"""The request scope's key of the role its route needs (:mod:`.access`)."""
USERS = "messagebox.users"
"""The request scope's key of whether the store has users (asked for anonymous callers)."""

HASHING_AT_ONCE = 2
"""Passwords checked at once (:mod:`.login`): each takes 64 MiB for a moment."""
IDLE_SECONDS = 3600.0
LIFETIME_SECONDS = 8 * 3600.0
MIN_IDLE_SECONDS = 300.0
MAX_IDLE_SECONDS = 24 * 3600.0


def policy() -> Policy:
    """The lock-out of addresses: :data:`LOGIN_ATTEMPTS` within :data:`LOGIN_WINDOW`."""
    return Policy(attempts=LOGIN_ATTEMPTS, window=LOGIN_WINDOW)


def user_policy() -> Policy:
    """The lock-out of a user's name: as an address's, with no global budget."""
    return Policy(attempts=LOGIN_ATTEMPTS, window=LOGIN_WINDOW, budget=1 << 62)


@dataclass(frozen=True)
class SessionSettings:
    """How long a console session lasts: ``idle`` seconds unused (5 minutes to 24
    hours; default 1 hour), ``lifetime`` seconds at most (1 minute to 30 days, not
    shorter than ``idle``; default 8 hours). A ValueError names a value out of bounds."""

    idle: float = IDLE_SECONDS
    lifetime: float = LIFETIME_SECONDS

    def __post_init__(self) -> None:
        if not MIN_IDLE_SECONDS <= self.idle <= MAX_IDLE_SECONDS:
            raise ValueError(
                f"a session's idle time is from {span(MIN_IDLE_SECONDS)} to "
                f"{span(MAX_IDLE_SECONDS)}, not {span(self.idle)}"
            )
        if not MIN_SESSION_SECONDS <= self.lifetime <= MAX_SESSION_SECONDS:
            raise ValueError(
                f"a session's lifetime is from {span(MIN_SESSION_SECONDS)} to "
                f"{span(MAX_SESSION_SECONDS)}, not {span(self.lifetime)}"
            )
        if self.lifetime < self.idle:
            raise ValueError(
                f"a session's lifetime ({span(self.lifetime)}) is shorter than its idle "
                f"time ({span(self.idle)})"
            )


def span(seconds: float) -> str:
    """``seconds`` in the largest whole unit: ``30 days``, ``5 minutes``, ``1.5 s``."""
    if not math.isfinite(seconds) or seconds <= 0 or seconds != int(seconds):
        return f"{seconds:g} s"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            n = int(seconds // size)
            return f"{n:,} {unit}{'s' if n != 1 else ''}"
    return f"{int(seconds):,} s"


@dataclass(frozen=True)
class Session:
    """The caller's session: its token (the cookie's, in this request's memory only) and
    the CSRF token its forms carry."""

    token: str
    csrf: str


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: a role (None: nobody logged in), a name (a user's,
    ``token:ROLE`` or ``anonymous``) and the client's address."""

    role: str | None
    who: str
    client: str = "an unknown address"
    session: Session | None = None

    def at_least(self, needed: str) -> bool:
        """Whether the caller is allowed what ``needed`` is."""
        return at_least(self.role, needed)

    @property
    def operator(self) -> bool:
        """Whether the caller may act on entries, instances and services."""
        return self.at_least(OPERATOR)

    @property
    def admin(self) -> bool:
        """Whether the caller may change hosts and routing."""
        return self.at_least(ADMIN)


def csrf_of(token: str) -> str:
    """The CSRF token of the session with this token."""
    return hmac.new(token.encode(), b"messagebox csrf", hashlib.sha256).hexdigest()


def client_of(request: Request) -> str:
    return request.client.host if request.client else "an unknown address"


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def refusal(console: Console, client: str, user: str | None = None) -> HTTPException | None:
    """The 429 (with ``Retry-After``) while ``client`` (or the ``user`` named) is locked
    out, else None."""
    wait = math.ceil(console.lockout.wait(client))
    whom = client
    if not wait and user is not None:
        wait, whom = math.ceil(console.user_lockout.wait(user)), f"user {user}"
    if not wait:
        return None
    return HTTPException(
        429,
        f"too many failed logins and tokens from {whom}: try again in {wait} s",
        headers={"Retry-After": str(wait)},
    )


def checked(request: Request, given: bytes, event: str = "console-token-failed") -> str | None:
    """The role ``given`` logs in as (None: it is neither secret), counted for the
    caller's address: refused (429) while that address is locked out, a wrong secret a
    failure (logged as ``event``). A secret is counted once per request however often
    it is checked."""
    console = _console(request)
    return counted(request, given, lambda g: role_of(console, g), event)


def counted(
    request: Request, given: bytes, judge: Callable[[bytes], str | None], event: str
) -> str | None:
    """``judge(given)`` (what the secret is: None for nothing), as :func:`checked`
    counts it."""
    console = _console(request)
    verdicts: dict[tuple[str, bytes], str | None] = request.scope.setdefault(
        "messagebox.secrets", {}
    )
    if (event, given) in verdicts:
        return verdicts[event, given]
    client = client_of(request)
    refused = refusal(console, client)
    if refused is not None:
        raise refused
    found = verdicts[event, given] = judge(given)
    if found is None:
        console.lockout.failed(client)
        console.log_event(event, client=client, path=request.url.path)
    else:
        console.lockout.succeeded(client)
    return found


def role_of(console: Console, given: bytes) -> str | None:
    """The role a secret logs in as (None: it is neither secret)."""
    if console.token is not None and hmac.compare_digest(given, console.token.encode()):
        return ADMIN
    if console.read_token is not None and hmac.compare_digest(given, console.read_token.encode()):
        return READER
    return None


def bearer(request: Request) -> bytes:
    """An ``Authorization: Bearer`` header's token (empty when none)."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    # header values arrive as latin-1: back to the bytes sent
    return credentials.strip().encode("latin-1") if scheme.lower() == "bearer" else b""


def token_caller(request: Request, role: str) -> Caller:
    """The service account of a console secret: ``token:admin``, ``token:reader``."""
    return Caller(role, f"{TOKEN_PREFIX}{role}", client_of(request))


def caller(request: Request) -> Caller:
    """Who the request is from, found once per request (and kept in its scope): by its
    session cookie, else its bearer token (a wrong one is refused, 403), else
    anonymous. Reads the store: :mod:`.access` finds it, in a thread, before any route."""
    found: Caller | None = request.scope.get(CALLER)
    if found is None:
        found = request.scope[CALLER] = _find(request)
    return found


def open_to_all(request: Request) -> bool:
    """Whether anonymous callers read this console: it has no read token and the store
    no user (asked once per request). Reads the store."""
    console = _console(request)
    if console.read_token is not None:
        return False
    users: bool | None = request.scope.get(USERS)
    if users is None:
        users = request.scope[USERS] = console.box.has_users()
    return not users


def _find(request: Request) -> Caller:
    console = _console(request)
    cookie = request.cookies.get(COOKIE)
    if cookie:
        found = session_caller(console, cookie, client_of(request))
        if found is not None:
            return found
    given = bearer(request)
    if given:
        role = checked(request, given)
        if role is None:
            changed = "; nothing was changed" if request.method == "POST" else ""
            raise HTTPException(403, f"wrong token{changed}")
        return token_caller(request, role)
    return Caller(None, "anonymous", client_of(request))


def session_caller(console: Console, token: str, client: str) -> Caller | None:
    """The caller of an open session (None: it is not one, or no longer): a user's with
    the user's role now; a console secret's only while the console has that secret."""
    stored = console.box.find_session(token, idle=console.session_settings.idle)
    if stored is None:
        return None
    if stored.who.startswith(TOKEN_PREFIX):
        secret = console.read_token if stored.role == READER else console.token
        if not bound_to(stored, token, secret):
            console.box.close_session(token)
            return None
    return Caller(stored.role, stored.who, client, Session(token, csrf_of(token)))


def actor(request: Request, form: FormData) -> Caller:
    """The caller posting ``form``, allowed what its route needs (:mod:`.access`): from
    a session (its CSRF token checked), else the form's ``token`` field or a bearer
    header. Refused (403) otherwise, before anything changes."""
    console = _console(request)
    needed: str = request.scope.get(RULE, OPERATOR)
    field = form.get("token")
    given = field.encode() if isinstance(field, str) else b""
    if given or bearer(request):
        if console.token is None and console.read_token is None:
            raise HTTPException(403, _DISABLED)
        role = checked(request, given or bearer(request))
        if role is None:
            raise HTTPException(403, "wrong token; nothing was changed")
        found = token_caller(request, role)
    else:
        found = caller(request)
        if found.session is None:
            if console.token is None:
                raise HTTPException(403, _DISABLED)
            raise HTTPException(
                403,
                "this action needs the console token (the token field, or an "
                f"Authorization: Bearer header) or a login as {_a(needed)}; nothing was changed",
            )
        csrf = form.get("csrf")
        if not isinstance(csrf, str) or not hmac.compare_digest(
            csrf.encode(), found.session.csrf.encode()
        ):
            raise HTTPException(
                403,
                "the form's CSRF token is missing or stale: reload the page; nothing was changed",
            )
    if not found.at_least(needed):
        raise HTTPException(403, refused_role(found, needed) + "; nothing was changed")
    return found


def refused_role(who: Caller, needed: str) -> str:
    """Why ``who`` may not do what needs ``needed``."""
    return f"{who.who} is {_a(who.role or 'anonymous')}: this needs {_a(needed)}"


def _a(role: str) -> str:
    return f"{'an' if role[0] in 'aeiou' else 'a'} {role}"


_DISABLED = (
    "actions are disabled: this console was started without a token "
    "(MESSAGEBOX_CONSOLE_TOKEN or --token-file); log in as a user with a role that "
    "allows it (`messagebox users add`); nothing was changed"
)
