"""The console's routing versions: every applied configuration (``messagebox apply``,
``box.apply``), newest first, and one version's changes (filter diffs, settings) with
its routing file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from messagebox.errors import NotFound

if TYPE_CHECKING:
    from messagebox.console.state import Console

ROWS = 200


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


async def versions(request: Request) -> Response:
    """The applied versions, newest first."""
    c = _console(request)
    rows = await run_in_threadpool(c.box.versions, ROWS)
    return c.render(
        request,
        "versions.html",
        title="Routing versions",
        rows=[(v, v.summary) for v in rows],
        limit=ROWS,
    )


async def version(request: Request) -> Response:
    """One version: what it changed, field by field, and its routing file."""
    c = _console(request)
    raw = request.path_params["number"]
    if not raw.isascii() or not raw.isdigit():
        raise HTTPException(404, f"no routing version {raw!r}")
    try:
        found = await run_in_threadpool(c.box.routing_version, int(raw))
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    changes = [
        {**s, "diff": [(f, s["before"][f], s["after"][f]) for f in s.get("fields", [])]}
        for s in found.changes.get("subscriptions", [])
    ]
    return c.render(
        request,
        "version.html",
        title=f"Routing version {found.version}",
        v=found,
        hosts=found.changes.get("hosts", []),
        subscriptions=changes,
    )
