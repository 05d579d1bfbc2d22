"""Who is asking: the console's login, sessions, roles and CSRF protection.

The console's token is the operator's login secret; an optional read token
(``MESSAGEBOX_CONSOLE_READ_TOKEN``) is a reader's. ``/login`` takes a name (for the audit
log) and a secret, and opens a session: a random id in an ``HttpOnly``, ``SameSite=
Strict`` cookie, kept in this process's memory for :data:`SESSION_SECONDS` (a restart
logs everyone out). Every form an operator posts from a session carries the session's
CSRF token, checked before anything changes. Scripts skip the login: an
``Authorization: Bearer`` header (or the form field ``token``, as before) is checked on
each request and needs no CSRF token (a browser never sends either by itself).

Roles: an *operator* (the console token) reads and acts; a *reader* (the read token)
reads, the contents of message parts too. With a read token configured every page needs
a login; without one the pages are open to whoever reaches the console (bound to
loopback by default) and only actions and part contents need the token.

Every secret is checked by :func:`checked`, in constant time, and counted: a wrong one
towards the lock-out of its address (:mod:`messagebox.console.lockout`; the address is
the socket peer's unless trusted proxies are configured: :mod:`messagebox.console.clients`).
"""

from __future__ import annotations

import hmac
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from messagebox.console.lockout import Lockout, Policy

if TYPE_CHECKING:
    from messagebox.console.state import Console

OPERATOR = "operator"
READER = "reader"
COOKIE = "mb_session"
SESSION_SECONDS = 8 * 3600
MAX_NAME = 80
LOGIN_ATTEMPTS = 5
"""Failed secrets from one address within :data:`LOGIN_WINDOW` that lock it out."""
LOGIN_WINDOW = 60.0
"""Seconds: the span failures count in, and the first lock's length (each next one
doubles, up to :attr:`Policy.cap <messagebox.console.lockout.Policy.cap>`)."""


def _policy() -> Policy:
    return Policy(attempts=LOGIN_ATTEMPTS, window=LOGIN_WINDOW)


@dataclass
class Session:
    id: str
    role: str
    who: str
    csrf: str
    expires: float


class Sessions:
    """Open sessions, by id, in this process's memory; failed secrets by address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Session] = {}
        self.lockout = Lockout(_policy)

    def open(self, role: str, who: str) -> Session:
        session = Session(
            secrets.token_urlsafe(32),
            role,
            who,
            secrets.token_urlsafe(32),
            time.monotonic() + SESSION_SECONDS,
        )
        with self._lock:
            now = time.monotonic()
            self._open = {k: s for k, s in self._open.items() if s.expires > now}
            self._open[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            session = self._open.get(session_id)
            if session is not None and session.expires <= time.monotonic():
                del self._open[session_id]
                return None
        return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._open.pop(session_id or "", None)


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: a role (None: nobody logged in) and a name."""

    role: str | None
    who: str
    session: Session | None = None

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR


def _client(request: Request) -> str:
    return request.client.host if request.client else "an unknown address"


def refusal(console: Console, client: str) -> HTTPException | None:
    """The 429 (with ``Retry-After``) for ``client`` while it is locked out, else None."""
    wait = math.ceil(console.sessions.lockout.wait(client))
    if not wait:
        return None
    return HTTPException(
        429,
        f"too many failed logins and tokens from {client}: try again in {wait} s",
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
    client = _client(request)
    refused = refusal(console, client)
    if refused is not None:
        raise refused
    found = verdicts[event, given] = judge(given)
    if found is None:
        console.sessions.lockout.failed(client)
        console.log_event(event, client=client, path=request.url.path)
    else:
        console.sessions.lockout.succeeded(client)
    return found


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def role_of(console: Console, given: bytes) -> str | None:
    """The role a secret logs in as (None: it is neither secret)."""
    if console.token is not None and hmac.compare_digest(given, console.token.encode()):
        return OPERATOR
    if console.read_token is not None and hmac.compare_digest(given, console.read_token.encode()):
        return READER
    return None


def bearer(request: Request) -> bytes:
    """An ``Authorization: Bearer`` header's token (empty when none)."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    # header values arrive as latin-1: back to the bytes sent
    return credentials.strip().encode("latin-1") if scheme.lower() == "bearer" else b""


def caller(request: Request) -> Caller:
    """Who the request is from, by its session cookie or bearer token (a wrong bearer
    token is refused, 403)."""
    console = _console(request)
    session = console.sessions.get(request.cookies.get(COOKIE))
    if session is not None:
        return Caller(session.role, session.who, session)
    given = bearer(request)
    if given:
        role = checked(request, given)
        if role is None:
            raise HTTPException(403, "wrong token")
        return Caller(role, f"token holder at {_client(request)}")
    return Caller(None, f"anonymous at {_client(request)}")


def operator(request: Request, form: FormData) -> Caller:
    """The operator posting ``form``: from a session (its CSRF token checked), else the
    form's ``token`` field or a bearer header. Refused (403) otherwise, before anything
    changes."""
    console = _console(request)
    if console.token is None:
        raise HTTPException(
            403,
            "actions are disabled: this console was started without a token "
            "(MESSAGEBOX_CONSOLE_TOKEN or --token-file); nothing was changed",
        )
    field = form.get("token")
    given = field.encode() if isinstance(field, str) else b""
    if given or bearer(request):
        if not given:
            given = bearer(request)
        if checked(request, given) != OPERATOR:
            raise HTTPException(403, "wrong token; nothing was changed")
        return Caller(OPERATOR, f"token holder at {_client(request)}")
    session = console.sessions.get(request.cookies.get(COOKIE))
    if session is None:
        raise HTTPException(
            403,
            "this action needs the console token (log in, or the token field, or an "
            "Authorization: Bearer header); nothing was changed",
        )
    csrf = form.get("csrf")
    if not isinstance(csrf, str) or not hmac.compare_digest(csrf.encode(), session.csrf.encode()):
        raise HTTPException(
            403, "the form's CSRF token is missing or stale: reload the page; nothing was changed"
        )
    if session.role != OPERATOR:
        raise HTTPException(403, f"{session.who} is logged in as a reader; nothing was changed")
    return Caller(OPERATOR, session.who, session)


def _safe_next(target: str | None, root: str) -> str:
    """Where to go after logging in: a path of this console only."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return root + "/"
    return target


async def login(request: Request) -> Response:
    """The login form (GET) and logging in (POST: name, token, next)."""
    console = _console(request)
    root = str(request.scope.get("root_path", ""))
    if request.method == "GET":
        return console.render(
            request, "login.html", title="Log in", next=request.query_params.get("next", "")
        )
    async with request.form() as form:
        token = form.get("token")
        name = form.get("name")
        target = form.get("next")
    client = _client(request)
    given = token.encode() if isinstance(token, str) else b""
    refused = refusal(console, client)
    if refused is not None:
        raise refused
    role = checked(request, given, "console-login-failed") if given else None
    if role is None:
        if not given:
            console.log_event("console-login-failed", client=client)
        raise HTTPException(403, "wrong token: not logged in")
    who = name.strip()[:MAX_NAME] if isinstance(name, str) and name.strip() else role
    session = console.sessions.open(role, f"{who} at {client}")
    console.log_event("console-login", who=session.who, role=role)
    response = RedirectResponse(
        _safe_next(target if isinstance(target, str) else None, root), status_code=303
    )
    response.set_cookie(
        COOKIE,
        session.id,
        max_age=SESSION_SECONDS,
        path=root + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(request: Request) -> Response:
    """End the session (POST, with its CSRF token)."""
    console = _console(request)
    session = console.sessions.get(request.cookies.get(COOKIE))
    async with request.form() as form:
        csrf = form.get("csrf")
    if session is not None:
        if not isinstance(csrf, str) or not hmac.compare_digest(
            csrf.encode(), session.csrf.encode()
        ):
            raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
        console.sessions.close(session.id)
    root = str(request.scope.get("root_path", ""))
    response = RedirectResponse(root + "/login", status_code=303)
    response.delete_cookie(COOKIE, path=root + "/")
    return response


class LoginRequired:
    """ASGI middleware: with a read token configured, every page but the login form, the
    static files and the API (which checks its own token) needs a session or a bearer
    token; a browser is sent to log in. ``/metrics`` is a scrape, not a page: it is
    answered 401 (``WWW-Authenticate: Bearer``) without a token and 403 with a wrong
    one, never sent to the login form (Prometheus sends the read token with
    ``authorization: {credentials: …}``)."""

    OPEN = ("/login", "/static/", "/api/")
    SCRAPES = ("/metrics",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        root = str(scope.get("root_path", ""))
        path: str = scope["path"]
        if _console(request).read_token is None or path.startswith(
            tuple(root + p for p in self.OPEN)
        ):
            await self.app(scope, receive, send)
            return
        try:
            refused = None if caller(request).role is not None else _SCRAPE_REFUSED
        except HTTPException as exc:  # a wrong bearer token; an address locked out
            refused = exc
        if refused is None:
            await self.app(scope, receive, send)
            return
        if path in tuple(root + p for p in self.SCRAPES):
            answer = PlainTextResponse(
                f"{refused.detail}\n", refused.status_code, headers=refused.headers
            )
            await answer(scope, receive, send)
            return
        query = scope.get("query_string", b"").decode()
        target = quote(path + (f"?{query}" if query else ""), safe="/")
        response = RedirectResponse(f"{root}/login?next={target}", status_code=303)
        await response(scope, receive, send)


_SCRAPE_REFUSED = HTTPException(
    401,
    "this console has a read token: send it as a bearer token (Authorization: Bearer …)",
    headers={"WWW-Authenticate": 'Bearer realm="messagebox"'},
)
