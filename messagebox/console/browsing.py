"""The console's pages for looking around: a host's queue (peek at ready, held, blocked
and leased entries, with what holds them, changing nothing) and search (a message id,
or a filter over the promoted properties: :mod:`messagebox.ops.search`). Orchestration
instances: :mod:`messagebox.console.orchestrations`."""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from messagebox.errors import ValidationError
from messagebox.ops.browse import QUEUE_STATES
from messagebox.predicates import Filter
from messagebox.properties import parse_assignment

if TYPE_CHECKING:
    from messagebox.console.state import Console
    from messagebox.ops.search import SearchResult

PEEK = 200


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


_ASSIGNMENT = re.compile(r"\s*[A-Za-z0-9_.-]+(?::[a-z]+)?\s*=(?!=)")
"""``NAME=VALUE`` or ``NAME:TYPE=VALUE`` (not ``==``): an equality typed as on the
command line."""


def search_filter(q: str) -> Filter | None:
    """The filter of a search box: its text (the filter language), or ``NAME=VALUE`` (as
    on the command line: an equality); None for none. Refused: ValidationError."""
    from messagebox.ops.search import MAX_FILTER_CHARS
    from messagebox.predicates import P, parse_filter

    if not q:
        return None
    if len(q) > MAX_FILTER_CHARS:
        raise ValidationError(
            f"the filter is {len(q):,} characters long; a search takes at most {MAX_FILTER_CHARS:,}"
        )
    if _ASSIGNMENT.match(q):
        try:
            name, value = parse_assignment(q)
        except (ValueError, TypeError) as exc:
            raise ValidationError(f"NAME=VALUE (NAME:TYPE=VALUE): {exc}") from exc
        return Filter.of(P(name) == value)
    return parse_filter(q)


def search(request: Request) -> Response:
    """A message id goes to its page; a filter (``orders.Total > 5000 and orders.Region
    == "EU"``, or ``NAME=VALUE`` typed as on the command line) lists the messages that
    match in the window, newest first, with their state; a cursor goes on."""
    from messagebox.ops.search import LIMIT, when

    c = _console(request)
    params = request.query_params
    form = {k: (params.get(k) or "").strip() for k in ("q", "since", "until", "limit", "after")}
    form["since"] = form["since"] or "24h"
    q = form["q"]
    try:
        msg_id = uuid.UUID(q) if q else None
    except ValueError:
        msg_id = None
    if msg_id is not None:
        root = str(request.scope.get("root_path", ""))
        path = root + request.app.url_path_for("message", message_id=str(msg_id))
        return RedirectResponse(path, status_code=303)
    if not any(form[k] for k in ("q", "until", "limit", "after")) and "since" not in params:
        return _search_page(c, request, form, None, None, 200)
    try:
        filt = search_filter(q)
        limit = _limit(form["limit"]) if form["limit"] else LIMIT
        found = c.box.search(
            filt,
            since=when(form["since"], "since"),
            until=when(form["until"], "until") if form["until"] else None,
            limit=limit,
            after=form["after"] or None,
        )
    except ValidationError as exc:
        return _search_page(c, request, form, None, str(exc), 400)
    return _search_page(c, request, form, found, None, 200)


def _limit(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 7:
        raise ValidationError(f"limit {text[:20]!r} is not a whole number")
    return int(text)


def _search_page(
    c: Console,
    request: Request,
    form: dict[str, str],
    found: SearchResult | None,
    error: str | None,
    status: int,
) -> Response:
    names: list[str] = []
    if found is not None and form["q"]:
        names = sorted(search_filter(form["q"]).properties)  # type: ignore[union-attr]
    return c.render(
        request,
        "search.html",
        status=status,
        title="Search",
        form=form,
        found=found,
        names=names,
        error=error,
    )


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
