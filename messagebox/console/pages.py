"""The console's pages: one function per route, each reading the public
:class:`~messagebox.MessageBox` API and rendering a template.

GET pages only read. The two actions (resume, terminate a suspended entry) are POSTs
that need an operator (a user's session, or the console's token); every refusal (no
token configured, a wrong or missing token, a reader, a malformed or unknown id, an
entry that cannot be resumed) is checked before anything changes, and answered with an
error page that names the culprit.

A message's page shows the contents of its parts only to a logged-in caller or with a
token (an ``Authorization: Bearer`` header, or its form posted with the token field);
otherwise the page shows their names and sizes. A console without a token or a user
has no login to ask for, and shows them to every reader, as its other pages.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from messagebox.cli.terminal import age, size
from messagebox.console import auth, charts
from messagebox.console.state import Console
from messagebox.errors import (
    Conflict,
    MessageBoxError,
    NotFound,
    UnknownMessage,
    ValidationError,
)
from messagebox.models import REROUTABLE
from messagebox.order_keys import describe
from messagebox.predicates import format_filter
from messagebox.predicates.text import format_predicate, format_value
from messagebox.properties import (
    Value,
    parse_assignment,
    properties_from_json,
)

if TYPE_CHECKING:
    from messagebox.engine import MessageBox
    from messagebox.models import Subscription

log = logging.getLogger("messagebox.console")

PREVIEW_BYTES = 4096
"""A part's preview shows at most this many bytes of it."""
HEX_PREVIEW_BYTES = 256
"""A binary part's preview shows this many bytes in hex."""
CHART_EVENTS = ("published", "routed", "delivered", "failed", "suspended", "expired")
REFRESH_SECONDS = 10
"""The overview reloads itself this often (``?refresh=off`` stops it); the failures and
suspended pages do with ``?refresh=on``."""
LIST_LIMIT = 500
"""Suspended entries (and tracked events) listed at most."""


def refresh_seconds(request: Request, *, default: bool = True) -> int | None:
    """How often the page reloads itself (None: not): ``?refresh=off`` or ``on``, else
    ``default`` (off on pages with forms to fill in: a reload would lose what was ticked
    or typed)."""
    wanted = request.query_params.get("refresh")
    on = default if wanted not in ("on", "off") else wanted == "on"
    return REFRESH_SECONDS if on else None


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


# --- template filters ---


def _iso(value: datetime) -> str:
    return value.isoformat(timespec="seconds")


def _iso_ms(value: datetime) -> str:
    """To the millisecond: tracked events of one message often share a second."""
    return value.isoformat(timespec="milliseconds")


def _last_line(text: str | None, most: int = 100) -> str:
    """A traceback's last line (what failed), shortened."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= most else last[: most - 1] + "…"


def _window(seconds: float) -> str:
    """A throughput window for people: ``minute``, ``hour``, else its length."""
    return {60.0: "minute", 3600.0: "hour", 86400.0: "day"}.get(seconds) or age(seconds)


def _type_name(value: Value) -> str:
    return type(value).__name__


FILTERS: dict[str, Any] = {
    "age": age,
    "size": size,
    "iso": _iso,
    "iso_ms": _iso_ms,
    "filter_text": format_filter,
    "value": format_value,
    "type_name": _type_name,
    "window": _window,
    "predicate": format_predicate,
    "last_line": _last_line,
    "order_key": describe,
}
"""Filters the templates use (formatting shared with the CLI)."""


# --- input ---


def _entry_id(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise HTTPException(400, f"{text!r} is not a suspended entry id (an integer)")
    if int(text) >= 2**63:  # past any stored id (a 64-bit column)
        raise HTTPException(404, f"no suspended entry {text}")
    return int(text)


def _message_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise HTTPException(400, f"{text!r} is not a message id (a UUID)") from None


def _properties_json(text: str) -> dict[str, Value]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"the properties are not JSON: {exc}") from exc
    try:
        return properties_from_json(data)
    except ValueError as exc:
        raise ValidationError(f"properties: {exc}") from exc


def _assignments(text: str) -> dict[str, Value]:
    found: dict[str, Value] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            name, value = parse_assignment(line.strip())
        except (ValueError, TypeError) as exc:
            raise ValidationError(f"properties line {n}: {exc}") from exc
        if name in found:
            raise ValidationError(f"properties line {n}: property {name!r} is given twice")
        found[name] = value
    return found


def explain_target(target: str, properties: str) -> uuid.UUID | dict[str, Value] | None:
    """What ``route explain`` takes: a message id or a JSON object of properties
    (``target``), or ``NAME[:TYPE]=VALUE`` lines (``properties``); None when neither."""
    target = target.strip()
    given = _assignments(properties)
    if target and given:
        raise ValidationError("give a message id or properties, not both")
    if given:
        return given
    if not target:
        return None
    if target.startswith("{"):
        return _properties_json(target)
    try:
        return uuid.UUID(target)
    except ValueError:
        raise ValidationError(
            f"{target!r} is neither a message id (a UUID) nor a JSON object of properties"
        ) from None


# --- errors ---


def error_page(request: Request, status: int, message: str) -> Response:
    """An error page: the status, and the message naming the culprit."""
    return _console(request).render(
        request, "error.html", status=status, title=HTTPStatus(status).phrase, message=message
    )


def http_error(request: Request, exc: Exception) -> Response:
    """An HTTP error (ours, or the router's 404 and 405) as a page."""
    assert isinstance(exc, HTTPException)
    message = exc.detail
    if exc.status_code == 404 and message == "Not Found":
        message = f"no page at {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed at {request.url.path}"
    page = error_page(request, exc.status_code, message)
    page.headers.update(exc.headers or {})  # a lock-out's Retry-After
    return page


def messagebox_error(request: Request, exc: Exception) -> Response:
    """A MessageBox error as a page: not found 404, refused input 400, conflict 409."""
    assert isinstance(exc, MessageBoxError)
    if isinstance(exc, NotFound):
        status = 404
    elif isinstance(exc, ValidationError):
        status = 400
    elif isinstance(exc, Conflict):
        status = 409
    else:
        status = 500
    return error_page(request, status, str(exc))


# --- pages ---


def overview(request: Request) -> Response:
    """Hosts and their instances, queues, counts and throughput."""
    c = _console(request)
    box = c.box
    hosts = box.host_stats()
    dead_after = {h.name: h.settings.dead_after_seconds for h in hosts}
    ages = box.heartbeat_ages()
    instances = [
        (i, ages.get(i.id), ages.get(i.id, 0.0) > dead_after.get(i.host, float("inf")))
        for i in box.instances()
    ]
    window = _chart_window(request)
    return c.render(
        request,
        "overview.html",
        title="Overview",
        refresh=refresh_seconds(request),
        live=True,
        window=window,
        windows=charts.WINDOWS.values(),
        charts=charts.overview(box.rates(window.minutes), window, CHART_EVENTS),
        stats=box.stats(),
        hosts=hosts,
        instances=instances,
        queues=box.queue_stats(),
        held_keys=box.held_keys(limit=100),
        tracking=box.tracking(),
        throughput=box.throughput(),
        notice=(request.query_params.get("changed") or "")[:300] or None,
    )


def _chart_window(request: Request) -> charts.Window:
    """The charts' window, ``?window=1h`` (the default), ``6h`` or ``24h``."""
    name = request.query_params.get("window") or "1h"
    if name not in charts.WINDOWS:
        raise HTTPException(400, f"window {name[:20]!r} is not one of {', '.join(charts.WINDOWS)}")
    return charts.WINDOWS[name]


def subscriptions(request: Request) -> Response:
    """Every subscription with its filter in the text form."""
    c = _console(request)
    changed = request.query_params.get("changed")
    return c.render(
        request,
        "subscriptions.html",
        title="Subscriptions",
        subscriptions=c.box.subscriptions(),
        notice=changed[:300] if changed else None,
    )


def suspended_entry(request: Request) -> Response:
    """One suspended entry: its error, report, and its message's context and parts."""
    c = _console(request)
    entry = c.box.suspended_entry(_entry_id(request.path_params["entry_id"]))
    try:
        summary = c.box.message_summary(entry.message_id)
    except UnknownMessage:
        summary = None
    subs = {s.id: s for s in c.box.subscriptions()}
    return c.render(
        request,
        "suspended_entry.html",
        title=f"Suspended entry {entry.id}",
        entry=entry,
        subscription=subs.get(entry.subscription) if entry.subscription is not None else None,
        summary=summary,
        report=None
        if entry.report is None
        else json.dumps(entry.report, indent=2, ensure_ascii=False, default=str),
    )


@dataclass(frozen=True)
class Preview:
    """The start of a part: as text when it is UTF-8, else as hex."""

    name: str
    size: int
    body: bool
    text: str | None
    hex: str | None
    truncated: bool


def _preview(box: MessageBox, message_id: uuid.UUID, name: str, n: int, body: bool) -> Preview:
    head = next(iter(box.iter_part(message_id, name)), b"")[:PREVIEW_BYTES]
    truncated = n > len(head)
    text: str | None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # cut inside a character, or not text
        cut = truncated and exc.start > len(head) - 4
        text = head[: exc.start].decode("utf-8") if cut else None
    if text is not None and "\x00" in text:
        text = None
    shown = head[:HEX_PREVIEW_BYTES]
    return Preview(
        name=name,
        size=n,
        body=body,
        text=text,
        hex=None
        if text is not None
        else "\n".join(shown[i : i + 16].hex(" ") for i in range(0, len(shown), 16)),
        truncated=truncated if text is not None else n > len(shown),
    )


async def message(request: Request) -> Response:
    """A stored message: context properties, its parts' names and sizes and, with the
    token (or on a console without one), a bounded preview of each."""
    c = _console(request)
    message_id = _message_id(request.path_params["message_id"])
    if request.method == "POST":
        async with request.form() as form:
            shown = c.shows_parts(request, form)
    else:
        shown = c.shows_parts(request)
    return await run_in_threadpool(_message_page, c, request, message_id, shown)


def _message_page(c: Console, request: Request, message_id: uuid.UUID, shown: bool) -> Response:
    summary = c.box.message_summary(message_id)
    previews = [
        _preview(c.box, message_id, name, n, name == summary.body_part)
        for name, n in summary.part_sizes.items()
        if shown
    ]
    return c.render(
        request,
        "message.html",
        title=f"Message {message_id}",
        summary=summary,
        shown=shown,
        previews=previews,
        entries=c.box.suspended(message_id=message_id, limit=LIST_LIMIT),
        preview_bytes=PREVIEW_BYTES,
        history=c.box.tracked(message_id, limit=LIST_LIMIT),
        names={s.id: s.name for s in c.box.subscriptions()},
    )


def tracking(request: Request) -> Response:
    """Tracked events, oldest first: one message's history, or the newest matching."""
    from messagebox.storage.tracking import EVENTS

    c = _console(request)
    params = request.query_params
    message_text = (params.get("message") or "").strip()
    message_id = _message_id(message_text) if message_text else None
    event = params.get("event") or None
    if event is not None and event not in EVENTS:
        raise HTTPException(400, f"unknown event {event!r}; one of: {', '.join(EVENTS)}")
    host = params.get("host") or None
    if host is not None:
        c.box.host(host)  # an unknown host is a 404, not an empty list
    events = c.box.tracked(message_id, event=event, host=host, limit=LIST_LIMIT)
    return c.render(
        request,
        "tracking.html",
        title="Tracking" if message_id is None else f"History of {message_id}",
        settings=c.box.tracking(),
        events=events,
        names={s.id: s.name for s in c.box.subscriptions()},
        event_kinds=EVENTS,
        hosts=[h.name for h in c.box.hosts()],
        event=event,
        host=host,
        message=message_text,
        limit=LIST_LIMIT,
    )


def metrics(request: Request) -> Response:
    """The Prometheus exposition: this process's counters and the store's gauges."""
    from messagebox.metrics import exposition

    body, content_type = exposition(_console(request).box)
    return Response(body, media_type=content_type, headers={"Cache-Control": "no-store"})


@dataclass(frozen=True)
class Verdict:
    """One subscription against the explained message."""

    subscription: Subscription
    routes: bool
    summary: str
    failed: list[tuple[int, str, str]]
    """Per failing group: (group number, its first failing predicate, why it fails)."""


def explain(request: Request) -> Response:
    """The explain form; with a message id or properties, each subscription's verdict."""
    c = _console(request)
    target_text = request.query_params.get("target", "")
    properties_text = request.query_params.get("properties", "")
    form = {"target": target_text, "properties": properties_text}
    try:
        target = explain_target(target_text, properties_text)
        found = None if target is None else c.box.explain(target)
    except (ValidationError, NotFound) as exc:
        return c.render(
            request,
            "explain.html",
            status=404 if isinstance(exc, NotFound) else 400,
            title="Explain",
            form=form,
            error=str(exc),
            found=None,
            verdicts=[],
        )
    verdicts = []
    for e in found.subscriptions if found else ():
        failed = [
            (i, format_predicate(g.failed.predicate), g.failed.why)
            for i, g in enumerate(e.filter.groups, 1)
            if g.failed is not None
        ]
        if e.matched and not e.routes:
            summary = f"its filter matches, but the service is {e.subscription.state.value}"
        elif e.matched:
            group = next(i for i, g in enumerate(e.filter.groups, 1) if g.matched)
            summary = f"matches (group {group})"
        else:
            summary = "no group matches"
        verdicts.append(Verdict(e.subscription, e.routes, summary, [] if e.matched else failed))
    return c.render(
        request,
        "explain.html",
        title="Explain",
        form=form,
        error=None,
        found=found,
        verdicts=verdicts,
    )


# --- actions ---


def _resume(box: MessageBox, entry_id: int) -> None:
    entry = box.suspended_entry(entry_id)
    if not entry.resumable:
        raise HTTPException(
            409,
            f"suspended entry {entry_id} is not resumable ({entry.reason}); terminate it"
            + (", or reroute it" if entry.reason in REROUTABLE else "")
            + "; nothing was changed",
        )
    box.resume(entry_id)


def _terminate(box: MessageBox, entry_id: int) -> None:
    box.suspended_entry(entry_id)  # unknown: 404
    box.terminate(entry_id)


async def _act(request: Request, action: str) -> Response:
    c = _console(request)
    async with request.form() as form:
        caller = auth.actor(request, form)
    entry_id = _entry_id(request.path_params["entry_id"])
    run = _resume if action == "resume" else _terminate
    await run_in_threadpool(run, c.box, entry_id)
    await run_in_threadpool(c.audit, caller, action, f"suspended entry {entry_id}", 1)
    done = "resumed" if action == "resume" else "terminated"
    path = str(request.scope.get("root_path", "")) + request.app.url_path_for("suspended")
    return RedirectResponse(f"{path}?done={done}&entry={entry_id}", status_code=303)


async def resume(request: Request) -> Response:
    """Put a resumable suspended entry back on its queue (needs an operator)."""
    return await _act(request, "resume")


async def terminate(request: Request) -> Response:
    """Delete a suspended entry and release its message (needs an operator)."""
    return await _act(request, "terminate")
