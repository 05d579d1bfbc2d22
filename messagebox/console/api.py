"""The management API of a process that serves a store (:mod:`messagebox.cli.remote`):
``POST /api/v1/cli`` runs a command line command on this process's store, ``GET
/api/v1/status`` says what the process serves (its pid, its store and, for a DuckDB
store, the database file's resolved path, ``database``, and its ``database_id``). Both
need ``Authorization: Bearer`` with the API token, compared in constant time; a wrong
one counts towards the console's lock-out of its address
(:mod:`messagebox.console.lockout`: 429 while locked out). JSON in, JSON out; every
command run is logged (``event: "cli-served"``: the command, its exit code, the
caller's address).

A command's answer is sent when it ends; until then a space is sent every
:data:`KEEPALIVE_SECONDS` (JSON allows leading white space), so that the command line
can tell a long command from a process that stopped answering.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from messagebox.console import auth
from messagebox.console.served import ServedRequest, failed_answer, parse_request, serve

if TYPE_CHECKING:
    from messagebox.console.paths import ServedPaths
    from messagebox.engine import MessageBox

log = logging.getLogger("messagebox.console")

KEEPALIVE_SECONDS = 5.0
MAX_REQUEST_BYTES = 512 << 20
"""The largest command a serving process takes: the files the command line sends (at
most 256 MiB each, ``messagebox.cli.remote.SENT_FILE_BYTES``) in base64."""
"""While a command runs, a space is sent this often."""


def _authorised(request: Request) -> Response | None:
    """None when the request carries the API token; else the refusal."""
    token: str | None = request.app.state.api_token
    if token is None:
        return JSONResponse({"error": "this process serves no management API"}, 404)
    given = auth.bearer(request)
    if not given:
        return JSONResponse({"error": "an Authorization: Bearer token is needed"}, 401)
    expected = token.encode()
    try:
        right = auth.counted(
            request,
            given,
            lambda g: "api" if hmac.compare_digest(g, expected) else None,
            "api-token-failed",
        )
    except HTTPException as exc:  # locked out
        return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)
    if right is None:
        return JSONResponse({"error": "wrong token"}, 403)
    return None


async def cli(request: Request) -> Response:
    """Run one command sent by the command line (:func:`messagebox.console.served.serve`)."""
    refused = _authorised(request)
    if refused is not None:
        return refused
    raw = await _body(request)
    if raw is None:
        return JSONResponse({"error": f"a request is at most {MAX_REQUEST_BYTES} bytes"}, 413)
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        sent = parse_request(body)
    except RecursionError:
        return JSONResponse({"error": "malformed request: nested too deeply"}, 400)
    except ValueError as exc:
        return JSONResponse({"error": f"malformed request: {exc}"}, 400)
    client = request.client.host if request.client else None
    state = request.app.state

    def run() -> dict[str, Any]:
        return _run(state.console.box, sent, client, state.serve_paths)

    return StreamingResponse(
        _kept_alive(run),
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def _body(request: Request) -> bytes | None:
    """The request's body, or None past :data:`MAX_REQUEST_BYTES` (read no further)."""
    declared = request.headers.get("content-length", "0")
    if not declared.isdigit() or int(declared) > MAX_REQUEST_BYTES:
        return None
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_REQUEST_BYTES:
                return None
            chunks.append(chunk)
    except ClientDisconnect:  # the caller went before it sent it all: nothing to run
        return b""
    return b"".join(chunks)


def _run(
    box: MessageBox, sent: ServedRequest, client: str | None, paths: ServedPaths
) -> dict[str, Any]:
    """Serve the command and log it (here: the caller may have gone meanwhile)."""
    try:
        answer = serve(box, sent, client, paths)
    except Exception as exc:
        log.exception("a served command failed", extra={"event": "cli-served-failed"})
        answer = failed_answer(exc)
    log.info(
        "served `messagebox %s`: exit %d",
        answer["command"],
        answer["exit"],
        extra={
            "event": "cli-served",
            "command": answer["command"],
            "argv": sent.argv,
            "exit": answer["exit"],
            "client": client,
        },
    )
    return answer


async def _kept_alive(run: Callable[[], dict[str, Any]]) -> AsyncIterator[bytes]:
    """``run()``'s answer as JSON, in a thread, with a space every
    :data:`KEEPALIVE_SECONDS` until it is ready."""
    task = asyncio.ensure_future(run_in_threadpool(run))
    while not task.done():
        await asyncio.wait({task}, timeout=KEEPALIVE_SECONDS)
        if not task.done():
            yield b" "
    yield json.dumps(task.result()).encode()


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
        **request.app.state.store_identity,
        **(describe() if describe is not None else {}),
    }
    return JSONResponse(data, headers={"Cache-Control": "no-store"})


ROUTES = [
    Route("/api/v1/cli", cli, methods=["POST"], name="api_cli"),
    Route("/api/v1/status", status, name="api_status"),
]
