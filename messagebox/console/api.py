"""The management API of a process that serves a store (:mod:`messagebox.cli.remote`):
``POST /api/v1/cli`` runs a command line command on this process's store, ``GET
/api/v1/status`` says what the process serves. Both need ``Authorization: Bearer``
with the API token; JSON in, JSON out; every command run is logged (``event:
"cli-served"``: the command, its exit code, the caller's address).
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

log = logging.getLogger("messagebox.console")


def _authorised(request: Request) -> Response | None:
    """None when the request carries the API token; else the refusal."""
    token: str | None = request.app.state.api_token
    if token is None:
        return JSONResponse({"error": "this process serves no management API"}, 404)
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return JSONResponse({"error": "an Authorization: Bearer token is needed"}, 401)
    if not hmac.compare_digest(given.encode(), token.encode()):
        return JSONResponse({"error": "wrong token"}, 403)
    return None


async def cli(request: Request) -> Response:
    """Run one command sent by the command line (:func:`messagebox.cli.remote.serve`)."""
    from messagebox.cli.remote import serve

    refused = _authorised(request)
    if refused is not None:
        return refused
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        client = request.client.host if request.client else None
        answer = await run_in_threadpool(serve, request.app.state.console.box, body, client)
    except ValueError as exc:
        return JSONResponse({"error": f"malformed request: {exc}"}, 400)
    log.info(
        "served `messagebox %s`: exit %d",
        answer["command"],
        answer["exit"],
        extra={
            "event": "cli-served",
            "command": answer["command"],
            "argv": body.get("argv"),
            "exit": answer["exit"],
            "client": client,
        },
    )
    return JSONResponse(answer, headers={"Cache-Control": "no-store"})


async def status(request: Request) -> Response:
    """What this process serves: its pid, store and host instances."""
    refused = _authorised(request)
    if refused is not None:
        return refused
    describe: Callable[[], dict[str, Any]] | None = request.app.state.describe
    box = request.app.state.console.box
    data = {
        "pid": os.getpid(),
        "store": box.store.url.render_as_string(hide_password=True),
        **(describe() if describe is not None else {}),
    }
    return JSONResponse(data, headers={"Cache-Control": "no-store"})


ROUTES = [
    Route("/api/v1/cli", cli, methods=["POST"], name="api_cli"),
    Route("/api/v1/status", status, name="api_status"),
]
