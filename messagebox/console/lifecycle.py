"""The console's lifecycle actions: a subscription's filter edited in place, a service
started, stopped or unenlisted, an empty host removed or its settings changed, a
subscription's scheduled entries delivered now or cancelled. Each is a POST that needs
the role :mod:`messagebox.console.access` names (an operator for services and scheduled
entries, an admin for a filter and a host), checked with its CSRF token or token
(:func:`messagebox.console.auth.actor`) before anything changes, and recorded in the
audit log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from messagebox.console import auth
from messagebox.errors import FilterValidationError, ValidationError
from messagebox.models import SERVICE_ACTIONS, setting_values

if TYPE_CHECKING:
    from messagebox.console.state import Console


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _back(request: Request, route: str, notice: str) -> Response:
    from urllib.parse import quote

    root = str(request.scope.get("root_path", ""))
    path = root + request.app.url_path_for(route)
    return RedirectResponse(f"{path}?changed={quote(notice)}", status_code=303)


async def set_filter(request: Request) -> Response:
    """A subscription's new filter, in its text or JSON form."""
    c = _console(request)
    async with request.form() as form:
        caller = auth.actor(request, form)
        text = form.get("filter")
    if not isinstance(text, str) or not text.strip():
        raise HTTPException(400, "give the new filter (its text form); nothing was changed")
    from messagebox.predicates import format_filter, parse_filter

    ref = request.path_params["sub"]
    sub_ref: int | str = int(ref) if ref.isascii() and ref.isdigit() else ref
    try:
        filt = parse_filter(text.strip())
    except (FilterValidationError, ValueError) as exc:
        raise ValidationError(f"the filter: {exc}; nothing was changed") from exc
    sub = await run_in_threadpool(c.box.set_filter, sub_ref, filt)
    shown = format_filter(sub.filter)
    await run_in_threadpool(c.audit, caller, "subscriptions set-filter", f"{sub.name}: {shown}", 1)
    return _back(request, "subscriptions", f"{sub.name}: filter is now {shown}")


async def service_state(request: Request) -> Response:
    """Start, stop or unenlist every subscription of a service."""
    c = _console(request)
    async with request.form() as form:
        caller = auth.actor(request, form)
        service = form.get("service")
    action = request.path_params["action"]
    if action not in SERVICE_ACTIONS:
        raise HTTPException(404, f"no service action {action!r}")
    if not isinstance(service, str) or not service:
        raise HTTPException(400, "name the service (the form field service)")
    state = SERVICE_ACTIONS[action]
    n = await run_in_threadpool(c.box.set_service_state, service, state)
    await run_in_threadpool(c.audit, caller, f"services {action}", service, n)
    return _back(request, "subscriptions", f"service {service} {state.value}")


def _setting_lines(text: str) -> dict[str, object]:
    """``SETTING=VALUE`` lines (each value read as JSON, else as text); blank lines skip."""
    try:
        return setting_values(line for line in text.splitlines() if line.strip())
    except ValueError as exc:
        raise ValidationError(f"settings: {exc}") from None


async def host_settings(request: Request) -> Response:
    """Change some of a host's settings (``SETTING=VALUE`` lines); running instances
    keep theirs until restarted. Bad settings change nothing (400, naming them)."""
    c = _console(request)
    async with request.form() as form:
        caller = auth.actor(request, form)
        name = form.get("host")
        text = form.get("settings")
    if not isinstance(name, str) or not name or not isinstance(text, str):
        raise HTTPException(400, "name the host and give SETTING=VALUE lines")
    current = {h.name: h for h in await run_in_threadpool(c.box.hosts)}.get(name)
    if current is None:
        raise HTTPException(404, f"no host named {name!r}")
    old = current.settings.model_dump()
    changes = {k: v for k, v in _setting_lines(text).items() if old.get(k, object()) != v}
    if not changes:
        return _back(request, "overview", f"host {name}: no setting changed")
    await run_in_threadpool(lambda: c.box.configure_host(name, **changes))
    shown = ", ".join(f"{k}={v}" for k, v in changes.items())
    await run_in_threadpool(c.audit, caller, "hosts set", f"{name}: {shown}", None)
    return _back(
        request, "overview", f"host {name}: {shown} (running instances keep theirs until restarted)"
    )


async def remove_host(request: Request) -> Response:
    """Remove a host nothing refers to (else 409, saying what is left)."""
    c = _console(request)
    async with request.form() as form:
        caller = auth.actor(request, form)
        name = form.get("host")
    if not isinstance(name, str) or not name:
        raise HTTPException(400, "name the host (the form field host)")
    await run_in_threadpool(c.box.remove_host, name)
    await run_in_threadpool(c.audit, caller, "hosts remove", name, None)
    return _back(request, "overview", f"host {name} removed")


SCHEDULED_ACTIONS = {"deliver-now": "delivered now", "cancel": "cancelled"}
"""The actions on a subscription's scheduled entries, and what each says it did."""


async def scheduled(request: Request) -> Response:
    """Deliver now, or cancel, every scheduled entry of a subscription (the form field
    ``subscription``: its id), or one entry (the form field ``entry``)."""
    c = _console(request)
    async with request.form() as form:
        caller = auth.actor(request, form)
        sub = form.get("subscription")
        entry = form.get("entry")
    action = request.path_params["action"]
    if action not in SCHEDULED_ACTIONS:
        raise HTTPException(404, f"no action {action!r} on scheduled entries")
    ids: list[int] = []
    ref: int | None = None
    if isinstance(entry, str) and entry.isascii() and entry.isdigit():
        ids = [int(entry)]
    elif isinstance(sub, str) and sub.isascii() and sub.isdigit():
        ref = int(sub)
    else:
        raise HTTPException(400, "name the subscription (its id) or the entry; nothing was changed")
    run = c.box.deliver_now if action == "deliver-now" else c.box.cancel_scheduled
    done = await run_in_threadpool(lambda: run(*ids, subscription=ref))
    target = f"queue entry {ids[0]}" if ids else f"subscription {ref}"
    await run_in_threadpool(c.audit, caller, f"scheduled {action}", target, len(done))
    return _back(
        request, "overview", f"{target}: {len(done)} scheduled entries {SCHEDULED_ACTIONS[action]}"
    )
