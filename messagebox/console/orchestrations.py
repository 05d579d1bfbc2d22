"""The console's orchestration pages: the instances (a search box finds one by its
correlation value, ``orders.OrderId=A123``, or goes to it by its id), one instance (its
correlation values, saved state, messages in order with their outcomes, timers,
history), and its termination: a POST that needs an operator, first answered with what
it would do and a confirmation, then (with ``confirm``) done and audited."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from messagebox.cli.inputs import UsageError
from messagebox.cli.orchestrations import correlation_text, find
from messagebox.console import auth
from messagebox.errors import ValidationError
from messagebox.models import ENDED
from messagebox.ops.orchestrations import STATES

if TYPE_CHECKING:
    from messagebox.console.state import Console

FOUND = 200


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _to_instance(request: Request, instance_id: str, query: str = "") -> Response:
    root = str(request.scope.get("root_path", ""))
    path = root + request.app.url_path_for("instance", instance_id=instance_id)
    return RedirectResponse(path + query, status_code=303)


def _assignments(text: str) -> list[str]:
    """``NAME=VALUE`` items separated by blanks (a value may hold blanks: an item starts
    where ``NAME=`` or ``NAME:TYPE=`` does)."""
    return [item.strip() for item in re.split(r"\s+(?=[\w.-]+(?::\w+)?=)", text) if item.strip()]


def instances(request: Request) -> Response:
    """Instances of long-running services: correlation values, state, what each waits
    for, its timers; ``q``: ``NAME=VALUE`` finds by correlation value, an id opens it."""
    c = _console(request)
    service = request.query_params.get("service") or None
    state = request.query_params.get("state") or None
    q = (request.query_params.get("q") or "").strip()
    if state is not None and state not in STATES:
        raise HTTPException(400, f"unknown state {state!r}; one of: {', '.join(STATES)}")
    if q and "=" not in q:
        return _to_instance(request, q)
    if q:
        try:
            rows = find(c.box, _assignments(q), service=service, state=state, limit=FOUND)
        except UsageError as exc:  # a bad NAME=VALUE
            raise ValidationError(
                f"search for an instance id, or NAME=VALUE (NAME:TYPE=VALUE): {exc}"
            ) from exc
    else:
        rows = c.box.service_instances(service=service, state=state, limit=FOUND)
    zombies = c.box.count_suspended(reason="completed-with-discarded-messages")
    return c.render(
        request,
        "instances.html",
        title="Orchestration instances",
        rows=rows,
        service=service,
        state=state,
        states=STATES,
        zombies=zombies,
        q=q,
        limit=FOUND,
        correlation=correlation_text,
    )


def instance(request: Request) -> Response:
    """One instance in full."""
    c = _console(request)
    found = c.box.service_instance(request.path_params["instance_id"])
    done = request.query_params.get("done")
    return c.render(
        request,
        "instance.html",
        title=f"Instance {found.instance.id}",
        d=found,
        i=found.instance,
        data=None
        if found.data is None
        else json.dumps(found.data, indent=2, ensure_ascii=False, sort_keys=True),
        ended=found.instance.state in ENDED,
        names={s.id: s.name for s in c.box.subscriptions()},
        correlation=correlation_text,
        notice="Instance terminated." if done == "terminated" else None,
    )


async def terminate(request: Request) -> Response:
    """Terminate an instance (needs an operator): first what it would do and a
    confirmation; with ``confirm``, done, audited, and back to its page."""
    c = _console(request)
    async with request.form() as form:
        caller = auth.actor(request, form)
        confirmed = form.get("confirm") == "yes"
    instance_id = request.path_params["instance_id"]
    found = await run_in_threadpool(c.box.service_instance, instance_id)
    if found.instance.state in ENDED:
        raise HTTPException(
            409, f"instance {instance_id} has {found.instance.state} already; nothing was changed"
        )
    if not confirmed:
        return c.render(
            request,
            "instance_terminate.html",
            title=f"Terminate instance {instance_id}?",
            i=found.instance,
            correlation=correlation_text,
        )
    done = await run_in_threadpool(c.box.terminate_instance, instance_id)
    target = f"orchestration instance {done.id} ({done.service})"
    count = len(done.entries) + len(done.suspended)
    await run_in_threadpool(c.audit, caller, "orchestrations terminate", target, count)
    return _to_instance(request, instance_id, "?done=terminated")
