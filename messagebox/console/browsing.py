"""The console's pages for looking around: a host's queue (peek at ready, held, blocked
and leased entries, with what holds them, changing nothing) and search (a message id,
or a promoted property's value). Orchestration instances:
:mod:`messagebox.console.orchestrations`."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from messagebox.browse import QUEUE_STATES
from messagebox.errors import ValidationError
from messagebox.properties import parse_assignment

if TYPE_CHECKING:
    from messagebox.console.state import Console

PEEK = 200
FOUND = 100


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def queue(request: Request) -> Response:
    """The first entries of a host's queue, in claim order."""
    c = _console(request)
    host = request.query_params.get("host") or ""
    state = request.query_params.get("state") or None
    if not host:
        raise HTTPException(400, "name the host: /queue?host=NAME")
    if state is not None and state not in QUEUE_STATES:
        raise HTTPException(400, f"unknown state {state!r}; one of: {', '.join(QUEUE_STATES)}")
    entries = c.box.peek_queue(host, state=state, limit=PEEK)
    return c.render(
        request,
        "queue.html",
        title=f"Queue of {host}",
        host=host,
        state=state,
        states=QUEUE_STATES,
        entries=entries,
        names={s.id: s for s in c.box.subscriptions(host=host)},
        limit=PEEK,
        held_keys=c.box.held_keys(host, limit=PEEK),
    )


def search(request: Request) -> Response:
    """A message id goes to its page; ``NAME=VALUE`` (typed as on the command line,
    ``NAME:TYPE=VALUE``) lists the stored messages whose promoted property has it."""
    c = _console(request)
    q = (request.query_params.get("q") or "").strip()
    found = None
    if q:
        try:
            msg_id = uuid.UUID(q)
        except ValueError:
            msg_id = None
        if msg_id is not None:
            root = str(request.scope.get("root_path", ""))
            path = root + request.app.url_path_for("message", message_id=str(msg_id))
            return RedirectResponse(path, status_code=303)
        try:
            name, value = parse_assignment(q)
        except (ValueError, TypeError) as exc:
            raise ValidationError(
                f"search for a message id, or NAME=VALUE (NAME:TYPE=VALUE): {exc}"
            ) from exc
        found = c.box.find_messages(name, value, limit=FOUND)
    return c.render(request, "search.html", title="Search", q=q, found=found, limit=FOUND)


async def part(request: Request) -> Response:
    """A stored message's part, as stored (a download): for whoever may see contents
    (:meth:`Console.shows_parts`: a logged-in caller, a token, or a console without one)."""
    c = _console(request)
    try:
        message_id = uuid.UUID(request.path_params["message_id"])
    except ValueError:
        raise HTTPException(400, "not a message id (a UUID)") from None
    if request.method == "POST":
        async with request.form() as form:
            name = form.get("name")
            allowed = c.shows_parts(request, form)
    else:
        name = request.query_params.get("name")
        allowed = c.shows_parts(request)
    if not allowed:
        raise HTTPException(
            403, "the contents of a message's parts need the console token (or a login)"
        )
    summary = c.box.message_summary(message_id)
    part_name = name if isinstance(name, str) and name else summary.body_part
    if part_name not in summary.part_sizes:
        raise HTTPException(404, f"message {message_id} has no part {part_name!r}")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in part_name)[:60]
    return StreamingResponse(
        c.box.iter_part(message_id, part_name),
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": f'attachment; filename="{message_id}-{safe}.bin"',
            "Content-Length": str(summary.part_sizes[part_name]),
            "Cache-Control": "no-store",
        },
    )
