"""The console's web application: :func:`create_app`, its routes and its navigation.

Every route is in :data:`ROUTES` and every nav bar entry in :data:`NAV`; a new page is
a function in :mod:`messagebox.console.pages`, a template extending ``base.html``, one
line in each list. Errors are HTML pages: an unknown id is 404, malformed input 400,
an action without the right token 403, each naming the culprit. Before any route, every
request's ``Host`` header is checked (:mod:`messagebox.console.hostcheck`): another
host is a plain-text 400.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from messagebox.cli.remote import duckdb_file, store_identity
from messagebox.console import (
    access,
    api,
    auth,
    browsing,
    incidents,
    lifecycle,
    login,
    orchestrations,
    pages,
    state,
    versions,
)
from messagebox.console.clients import ClientAddress, TrustedProxies
from messagebox.console.hostcheck import AllowedHosts, HostCheck
from messagebox.console.paths import ServedPaths
from messagebox.errors import MessageBoxError
from messagebox.models import REROUTABLE, RESUMABLE

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

log = logging.getLogger("messagebox.console")

ROUTES: list[BaseRoute] = [
    Route("/", pages.overview, name="overview"),
    Route("/login", login.login, methods=["GET", "POST"], name="login"),
    Route("/logout", login.logout, methods=["POST"], name="logout"),
    Route("/subscriptions", pages.subscriptions, name="subscriptions"),
    Route("/subscriptions/{sub}/filter", lifecycle.set_filter, methods=["POST"], name="set_filter"),
    Route(
        "/services/{action}",
        lifecycle.service_state,
        methods=["POST"],
        name="service_state",
    ),
    Route("/hosts/remove", lifecycle.remove_host, methods=["POST"], name="remove_host"),
    Route("/hosts/settings", lifecycle.host_settings, methods=["POST"], name="host_settings"),
    Route("/scheduled/{action}", lifecycle.scheduled, methods=["POST"], name="scheduled"),
    Route("/suspended", incidents.suspended, name="suspended"),
    Route("/suspended/bulk", incidents.bulk, methods=["POST"], name="bulk"),
    Route("/failures", incidents.failures, name="failures"),
    Route("/failures/{group_id}", incidents.failure_group, name="failure_group"),
    Route("/audit", incidents.audit_log, name="audit"),
    Route("/versions", versions.versions, name="versions"),
    Route("/versions/{number}", versions.version, name="version"),
    Route("/suspended/{entry_id}", pages.suspended_entry, name="suspended_entry"),
    Route("/suspended/{entry_id}/resume", pages.resume, methods=["POST"], name="resume"),
    Route("/suspended/{entry_id}/terminate", pages.terminate, methods=["POST"], name="terminate"),
    Route("/messages/{message_id}", pages.message, methods=["GET", "POST"], name="message"),
    Route("/messages/{message_id}/part", browsing.part, methods=["GET", "POST"], name="part"),
    Route("/explain", pages.explain, name="explain"),
    Route("/queue", browsing.queue, name="queue"),
    Route("/search", browsing.search, name="search"),
    Route("/instances", orchestrations.instances, name="instances"),
    Route("/instances/{instance_id}", orchestrations.instance, name="instance"),
    Route(
        "/instances/{instance_id}/terminate",
        orchestrations.terminate,
        methods=["POST"],
        name="terminate_instance",
    ),
    Route("/tracking", pages.tracking, name="tracking"),
    Route("/metrics", pages.metrics, name="metrics"),
    *api.ROUTES,
    Mount("/static", StaticFiles(packages=[("messagebox.console", "static")]), name="static"),
]
"""Every route of the console; each needs the role :data:`.access.RULES` names."""

NAV: list[tuple[str, str]] = [
    ("overview", "Overview"),
    ("subscriptions", "Subscriptions"),
    ("suspended", "Suspended"),
    ("failures", "Failures"),
    ("instances", "Instances"),
    ("search", "Search"),
    ("explain", "Explain"),
    ("tracking", "Tracking"),
    ("versions", "Versions"),
    ("audit", "Audit"),
]
"""The nav bar: (route name, label), in order."""


@jinja2.pass_context
def _query_with(context: Any, /, **changes: str) -> str:
    """This page's query string with ``changes`` made (``?a=1&refresh=on``)."""
    request: Request = context["request"]
    params = dict(request.query_params)
    params.update(changes)
    return "?" + urlencode(params)


@jinja2.pass_context
def _path(context: Any, name: str, /, **params: Any) -> str:
    """The path of a named route (relative to the host, so right behind a proxy)."""
    request: Request = context["request"]
    return str(request.scope.get("root_path", "")) + str(request.app.url_path_for(name, **params))


def templates() -> Jinja2Templates:
    """The page templates (every value escaped), with the console's filters."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("messagebox.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["nav"] = NAV
    env.globals["reroutable"] = REROUTABLE
    env.globals["resumable"] = RESUMABLE
    env.globals["path"] = _path
    env.globals["query_with"] = _query_with
    env.filters.update(pages.FILTERS)
    return Jinja2Templates(env=env)


SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'none'; frame-ancestors 'none'; form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
"""Sent with every response: no scripts, no framing, forms post only here."""


class _SecurityHeaders:
    """ASGI middleware: adds :data:`SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(
    box: MessageBox,
    *,
    token: str | None = None,
    bind: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
    api_token: str | None = None,
    describe: Callable[[], dict[str, Any]] | None = None,
    read_token: str | None = None,
    trusted_proxies: Iterable[str] = (),
    serve_paths: Iterable[str | Path] = (),
    sessions: auth.SessionSettings | None = None,
) -> Starlette:
    """The console over ``box``. Read-only unless ``token`` is given: then resume and
    terminate take it as the form field ``token`` or an ``Authorization: Bearer`` header,
    and so does a message's page before it shows the contents of its parts.

    It answers only to requests whose ``Host`` is ``bind`` (the address it is served
    on), with a loopback address also ``localhost``, ``127.0.0.1`` and ``[::1]``, or one
    of ``allowed_hosts`` (``NAME`` or ``NAME:PORT``; a ValueError names a malformed one).
    Bound to every address (``0.0.0.0``, ``::``) without ``allowed_hosts`` it answers to
    any, and logs a warning that the check is off.

    ``token`` is also the service account ``token:admin``'s login secret,
    ``read_token`` ``token:reader``'s (then every page needs a login); the store's users
    log in by name and password (with any user every page needs a login). Each route
    needs a role (:mod:`messagebox.console.access`); ``sessions`` says how long a login
    lasts (:class:`~messagebox.console.auth.SessionSettings`; its defaults by default).

    With ``api_token`` it also serves the management API (:mod:`messagebox.console.api`)
    to requests carrying that token; ``describe`` adds to its status. A ``spark``
    command it serves reads and writes in the store's own folder (a DuckDB store's) and
    in ``serve_paths`` only (:mod:`messagebox.console.paths`).

    A request's address (for the lock-out of failed secrets and the audit log) is its
    socket peer's; ``trusted_proxies`` (addresses or networks, a ValueError names a
    malformed one) are believed about the client they forward
    (:mod:`messagebox.console.clients`)."""
    if token is not None and not token:
        raise ValueError("the console token must not be empty (None disables actions)")
    if read_token is not None and (not read_token or read_token == token):
        raise ValueError("the read token must be neither empty nor the console token")
    allowed = AllowedHosts.of(bind, allowed_hosts)
    proxies = TrustedProxies.of(trusted_proxies)
    if not allowed.checked:
        log.warning(
            "the console is bound to %s with no allowed host names, so it does not check "
            "the Host header: a DNS-rebinding page could read it through a browser that "
            "reaches it; name the hosts it is reached by with --allowed-host",
            bind,
            extra={"event": "console-host-check-off"},
        )
    app = Starlette(
        routes=ROUTES,
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(ClientAddress, proxies=proxies),
            Middleware(HostCheck, allowed=allowed),
            Middleware(access.Access, routes=ROUTES),
        ],
        exception_handlers={
            HTTPException: pages.http_error,
            MessageBoxError: pages.messagebox_error,
        },
    )
    app.state.console = state.Console(
        box=box,
        token=token,
        templates=templates(),
        read_token=read_token,
        session_settings=sessions or auth.SessionSettings(),
    )
    app.state.api_token = api_token
    app.state.describe = describe
    database = duckdb_file(box.store.url.render_as_string(hide_password=True))
    app.state.serve_paths = ServedPaths.of(database, serve_paths)
    app.state.store_identity = {} if database is None else store_identity(database)
    return app
