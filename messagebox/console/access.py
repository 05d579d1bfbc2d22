"""Which role each route of the console needs, enforced before the route runs.

:data:`RULES` names every route (``tests/integration/test_console_roles.py`` fails for
a route without one; at run time a route missing from it needs an admin):

- ``public``: the login form, logging out and the stylesheet;
- ``api``: the management API, which checks its own token (:mod:`.api`);
- ``reader``: every page that only reads, ``/metrics`` among them, and a message's
  part contents;
- ``operator``: resume, terminate and reroute of suspended entries, one or in bulk;
  terminating an orchestration instance; starting, stopping and unenlisting a service;
  delivering now or cancelling scheduled entries;
- ``admin``: a subscription's filter, a host's settings, removing a host.

:class:`Access` (ASGI middleware) finds the request's caller (:func:`.auth.caller`, in
a thread: it reads the store) and its route's rule, then:

- a caller with the role (or more) goes on;
- the console is *open* when it has no read token and the store has no user: there an
  anonymous caller reads (every ``reader`` route but part contents, which need a
  secret: :meth:`.state.Console.shows_parts`), and an action goes on to its route, which
  takes the token from its form (:func:`.auth.actor`);
- otherwise an anonymous browser is sent to log in (a ``/metrics`` scrape is answered
  401), and a caller without the role is refused, 403, naming both roles.

A wrong bearer token is refused (403) and a locked-out address gets 429, on every route
but the public ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from messagebox.console import auth
from messagebox.ops.passwords import ADMIN, OPERATOR, READER

PUBLIC = "public"
API = "api"

RULES: dict[str, str] = {
    "login": PUBLIC,
    "logout": PUBLIC,
    "static": PUBLIC,
    "api_cli": API,
    "api_status": API,
    "overview": READER,
    "subscriptions": READER,
    "suspended": READER,
    "failures": READER,
    "failure_group": READER,
    "audit": READER,
    "versions": READER,
    "version": READER,
    "suspended_entry": READER,
    "message": READER,
    "part": READER,
    "explain": READER,
    "queue": READER,
    "search": READER,
    "instances": READER,
    "instance": READER,
    "tracking": READER,
    "metrics": READER,
    "resume": OPERATOR,
    "terminate": OPERATOR,
    "bulk": OPERATOR,
    "terminate_instance": OPERATOR,
    "service_state": OPERATOR,
    "scheduled": OPERATOR,
    "set_filter": ADMIN,
    "host_settings": ADMIN,
    "remove_host": ADMIN,
}
"""The role each route (by name) needs: ``public``, ``api`` or a role."""

SCRAPES = ("metrics",)
"""Routes a scraper reads: refused 401 (``WWW-Authenticate: Bearer``), never sent to log in."""


def rule_of(routes: Sequence[BaseRoute], scope: Scope) -> tuple[str | None, str]:
    """The name of the route ``scope`` goes to (None: none) and the role it needs (a
    path of no route needs a reader, so that it says nothing to strangers)."""
    for route in routes:
        matched, _ = route.matches(scope)
        if matched != Match.NONE:
            name = getattr(route, "name", None)
            return name, RULES.get(name or "", ADMIN)
    return None, READER


class Access:
    """ASGI middleware: every request's caller against its route's rule (see above)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        name, rule = rule_of(self.routes, scope)
        scope[auth.RULE] = rule
        if rule == API or name == "static":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            who = await run_in_threadpool(auth.caller, request)
        except HTTPException as exc:  # a wrong bearer token; an address locked out
            scope[auth.CALLER] = auth.Caller(None, "anonymous", auth.client_of(request))
            if rule == PUBLIC:
                await self.app(scope, receive, send)
                return
            await self._refuse(request, name, exc)(scope, receive, send)
            return
        if rule == PUBLIC or who.at_least(rule):
            await self.app(scope, receive, send)
            return
        if who.role is None and await run_in_threadpool(auth.open_to_all, request):
            # an open console: anonymous reads; an action takes the token from its form
            await self.app(scope, receive, send)
            return
        if who.role is None:
            refused = _LOGIN_NEEDED
        else:
            why = auth.refused_role(who, rule) + _NOTHING.get(request.method, "")
            refused = HTTPException(403, why)
        await self._refuse(request, name, refused)(scope, receive, send)

    @staticmethod
    def _refuse(request: Request, name: str | None, refused: HTTPException) -> Response:
        """The answer to a refused request: a scrape's in plain text; a browser that
        is not logged in is sent to log in; any other, an error page."""
        if name in SCRAPES:
            return PlainTextResponse(
                f"{refused.detail}\n", refused.status_code, headers=refused.headers
            )
        if refused is _LOGIN_NEEDED:
            root = str(request.scope.get("root_path", ""))
            query = request.scope.get("query_string", b"").decode("latin-1")
            target = quote(request.scope["path"] + (f"?{query}" if query else ""), safe="/")
            return RedirectResponse(f"{root}/login?next={target}", status_code=303)
        from messagebox.console.pages import http_error

        return http_error(request, refused)


_NOTHING = {"POST": "; nothing was changed"}
_LOGIN_NEEDED = HTTPException(
    401,
    "this console needs a login: send the read token (or the console token) as a bearer "
    "token (Authorization: Bearer …)",
    headers={"WWW-Authenticate": 'Bearer realm="messagebox"'},
)
