"""``/login`` and ``/logout``: a user logs in by name and password, a service account
by its token; either opens a session kept in the store (:mod:`messagebox.console.auth`).

A failed login counts towards the lock-out of the client's address and, for a user's
name, of that name (:mod:`messagebox.console.lockout`: five within a minute lock it out
for a minute, doubling up to 15 minutes), whether or not such a user exists; the
answer is the same either way, and takes about as long (an unknown user's password is
checked against a dummy hash). At most :data:`HASHING_AT_ONCE` passwords are checked at
once (each takes 64 MiB for a moment); a login that waits
:data:`HASHING_WAIT_SECONDS` for its turn is answered 503. The password is never
logged, stored or shown.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from messagebox.console import auth
from messagebox.errors import UserDisabled
from messagebox.ops.accounts import TOKEN_PREFIX
from messagebox.ops.passwords import MAX_NAME, MAX_PASSWORD, READER, name_problem

if TYPE_CHECKING:
    from messagebox.console.state import Console
    from messagebox.ops.users import User

HASHING_AT_ONCE = auth.HASHING_AT_ONCE
HASHING_WAIT_SECONDS = 10.0
NOT_A_NAME = "(not a user's name)"
"""The lock-out key and log field of a login with a malformed user's name."""


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _safe_next(target: object, root: str) -> str:
    """Where to go after logging in: a path of this console only (not ``//host``, nor
    ``/\\host``, which browsers read as another host, nor one with control characters)."""
    if (
        not isinstance(target, str)
        or not target.startswith("/")
        or target.startswith(("//", "/\\"))
        or len(target) > 4096
        or any(c == "\\" or not c.isprintable() for c in target)
    ):
        return root + "/"
    return target


def _text(value: object, limit: int) -> str:
    """A form field as text, cut to ``limit`` + 1 characters (so "too long" shows)."""
    return value[: limit + 1] if isinstance(value, str) else ""


async def login(request: Request) -> Response:
    """The login form (GET) and logging in (POST: ``user`` and ``password``, or
    ``token``; ``next``)."""
    console = _console(request)
    root = str(request.scope.get("root_path", ""))
    if request.method == "GET":
        return console.render(
            request,
            "login.html",
            title="Log in",
            next=request.query_params.get("next", ""),
            tokens=console.token is not None or console.read_token is not None,
        )
    async with request.form() as form:
        user = _text(form.get("user"), MAX_NAME).strip().lower()
        password = _text(form.get("password"), MAX_PASSWORD)
        token = form.get("token")
        target = form.get("next")
    client = auth.client_of(request)
    refused = auth.refusal(console, client)
    if refused is not None:
        raise refused
    if user and token:
        raise HTTPException(400, "give a user and a password, or a token, not both")
    secret: str | None = None
    if user:
        found = await _user_login(request, console, user, password)
        who, role = found.name, found.role
    else:
        given = token.encode() if isinstance(token, str) else b""
        found_role = auth.checked(request, given, "console-login-failed") if given else None
        if found_role is None:
            if not given:
                console.log_event("console-login-failed", client=client)
            raise HTTPException(403, "wrong token: not logged in")
        role, who = found_role, f"{TOKEN_PREFIX}{found_role}"
        secret = console.read_token if role == READER else console.token
    settings = console.session_settings
    session = await run_in_threadpool(
        lambda: console.box.open_session(who, role, lifetime=settings.lifetime, secret=secret)
    )
    console.log_event("console-login", who=who, role=role, client=client)
    response = RedirectResponse(_safe_next(target, root), status_code=303)
    response.set_cookie(
        auth.COOKIE,
        session,
        max_age=int(settings.lifetime),
        path=root + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def _user_login(request: Request, console: Console, name: str, password: str) -> User:
    """The user ``name`` whose password this is, else 403 (counted), 429 or 503."""
    client = auth.client_of(request)
    key = name if name_problem(name) is None else NOT_A_NAME
    refused = auth.refusal(console, client, key)
    if refused is not None:
        raise refused
    try:
        found = await run_in_threadpool(_authenticate, console, key, password)
    except UserDisabled:
        console.log_event("console-login-refused", user=key, client=client, why="disabled")
        raise HTTPException(
            403, f"user {key} is disabled: ask an admin (`messagebox users enable`)"
        ) from None
    if found is None:
        console.lockout.failed(client)
        console.user_lockout.failed(key)
        console.log_event("console-login-failed", client=client, user=key)
        raise HTTPException(403, "wrong user or password: not logged in")
    console.lockout.succeeded(client)
    return found


def _authenticate(console: Console, name: str, password: str) -> User | None:
    """:meth:`~messagebox.MessageBox.authenticate`, at most :data:`HASHING_AT_ONCE`
    at a time (503 after :data:`HASHING_WAIT_SECONDS` waiting)."""
    if name == NOT_A_NAME or len(password) > MAX_PASSWORD:
        password = ""  # never right: checked against the dummy hash all the same
    if not console.hashing.acquire(timeout=HASHING_WAIT_SECONDS):
        raise HTTPException(503, "too many logins at once: try again in a moment")
    try:
        return console.box.authenticate(name, password)
    finally:
        console.hashing.release()


async def logout(request: Request) -> Response:
    """End the session (POST, with its CSRF token): deleted from the store."""
    console = _console(request)
    found = await run_in_threadpool(auth.caller, request)
    async with request.form() as form:
        csrf = form.get("csrf")
    if found.session is not None:
        if not isinstance(csrf, str) or not hmac.compare_digest(
            csrf.encode(), found.session.csrf.encode()
        ):
            raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
        await run_in_threadpool(console.box.close_session, found.session.token)
        console.log_event("console-logout", who=found.who, client=found.client)
    root = str(request.scope.get("root_path", ""))
    response = RedirectResponse(root + "/login", status_code=303)
    response.delete_cookie(auth.COOKIE, path=root + "/")
    return response
