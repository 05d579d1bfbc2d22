"""The console's incident pages: failure groups, bulk actions on suspended entries (a
selection, a group, or every entry matching a filter; resume, terminate or reroute)
with a count and a confirmation, and the audit log.

A bulk action is two posts: the first shows what it would change (how many entries, of
which reasons) and asks to confirm; the second, with ``confirm``, does it on the entries
that still match, records it in the audit log and says how many changed. Both need an
operator (:func:`messagebox.console.auth.operator`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from messagebox.console import auth
from messagebox.console.pages import refresh_seconds
from messagebox.models import REROUTABLE, SUSPENDED_REASONS

if TYPE_CHECKING:
    from messagebox.console.state import Console
    from messagebox.engine import MessageBox
    from messagebox.models import SuspendedEntry

ACTIONS = ("resume", "terminate", "reroute")
PAST = {"resume": "resumed", "terminate": "terminated", "reroute": "rerouted"}
MAX_SELECTION = 100_000
AUDIT_ROWS = 200
ID_CHUNK = 1000


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def failures(request: Request) -> Response:
    """Suspended entries grouped by how they failed, largest group first."""
    c = _console(request)
    groups = c.box.failure_groups()
    return c.render(
        request,
        "failures.html",
        title="Failure groups",
        groups=groups,
        reroutable=REROUTABLE,
        notice=_notice(request),
        refresh=refresh_seconds(request, default=False),
        live=True,
    )


def audit_log(request: Request) -> Response:
    """The newest recorded operator actions."""
    c = _console(request)
    return c.render(
        request, "audit.html", title="Audit log", rows=c.box.audit_log(AUDIT_ROWS), limit=AUDIT_ROWS
    )


def _notice(request: Request) -> str | None:
    done, n = request.query_params.get("done"), request.query_params.get("n", "")
    if done in PAST.values() and n.isascii() and n.isdigit():
        return f"{n} entr{'y' if n == '1' else 'ies'} {done}."
    return None


class _Selection:
    """The entries a bulk form names: ``id`` values, a failure ``group``, or ``all``
    entries matching ``reason`` and ``host``."""

    def __init__(self, form: FormData) -> None:
        self.ids = [_int(v) for v in form.getlist("id") if isinstance(v, str)]
        group = form.get("group")
        self.group = group if isinstance(group, str) and group else None
        self.all = form.get("all") == "1"
        reason, host = form.get("reason"), form.get("host")
        self.reason = reason if isinstance(reason, str) and reason else None
        self.host = host if isinstance(host, str) and host else None
        if self.reason is not None and self.reason not in SUSPENDED_REASONS:
            raise HTTPException(400, f"unknown reason {self.reason!r}")
        chosen = sum((bool(self.ids), self.group is not None, self.all))
        if chosen != 1:
            raise HTTPException(
                400,
                "choose the entries: tick some, or pick a failure group, or all matching the "
                "filter; nothing was changed",
            )

    def hidden(self) -> list[tuple[str, str]]:
        """The form fields that name this selection again."""
        fields = [("id", str(i)) for i in self.ids]
        if self.group:
            fields.append(("group", self.group))
        if self.all:
            fields.append(("all", "1"))
            fields += [(k, v) for k, v in (("reason", self.reason), ("host", self.host)) if v]
        return fields

    def describe(self) -> str:
        if self.ids:
            return f"{len(self.ids)} selected"
        if self.group:
            return f"failure group {self.group}"
        shown = ", ".join(
            f"{k} {v}" for k, v in (("reason", self.reason), ("host", self.host)) if v
        )
        return f"all matching {shown or 'no filter'}"

    def entries(self, box: MessageBox) -> list[SuspendedEntry]:
        """The suspended entries selected now."""
        if self.all:
            return box.suspended(reason=self.reason, host=self.host, limit=MAX_SELECTION)
        ids = self.ids
        if self.group:
            found = [g for g in box.failure_groups() if g.id == self.group]
            ids = found[0].entry_ids if found else []
        entries: list[SuspendedEntry] = []
        for start in range(0, len(ids), ID_CHUNK):  # a parameter each: a bounded list
            entries += box.suspended(ids=ids[start : start + ID_CHUNK], limit=ID_CHUNK)
        return entries


def _int(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) >= 2**63:
        raise HTTPException(400, f"{text!r} is not a suspended entry id")
    return int(text)


def _applicable(action: str, entries: list[SuspendedEntry]) -> list[SuspendedEntry]:
    if action == "resume":
        return [e for e in entries if e.resumable]
    if action == "reroute":
        return [e for e in entries if e.reason in REROUTABLE]
    return entries


def _run(box: MessageBox, action: str, ids: list[int]) -> int:
    if not ids:
        return 0
    if action == "resume":
        return len(box.resume(*ids))
    if action == "terminate":
        return len(box.terminate(*ids))
    return len(box.reroute(*ids))


async def bulk(request: Request) -> Response:
    """Resume, terminate or reroute a selection of suspended entries: first a count and a
    confirmation, then (with ``confirm``) the action, audited."""
    c = _console(request)
    async with request.form() as form:
        caller = auth.operator(request, form)
        action = form.get("action")
        if action not in ACTIONS:
            raise HTTPException(400, f"unknown action {action!r}; one of: {', '.join(ACTIONS)}")
        selection = _Selection(form)
        confirmed = form.get("confirm") == "yes"
        back = form.get("back")
    assert isinstance(action, str)
    entries = await run_in_threadpool(selection.entries, c.box)
    targets = _applicable(action, entries)
    if not confirmed:
        return c.render(
            request,
            "confirm.html",
            title=f"{action.capitalize()} suspended entries?",
            action=action,
            selection=selection.describe(),
            fields=selection.hidden(),
            count=len(targets),
            skipped=len(entries) - len(targets),
            reasons=Counter(e.reason for e in targets),
            sample=targets[:20],
            back=back if isinstance(back, str) and back.startswith("/") else None,
        )
    done = await run_in_threadpool(_run, c.box, action, [e.id for e in targets])
    await run_in_threadpool(c.audit, caller, f"{action} (bulk)", selection.describe(), done)
    target = back if isinstance(back, str) and back.startswith("/") and "//" not in back else None
    root = str(request.scope.get("root_path", ""))
    path = target or root + request.app.url_path_for("failures")
    sep = "&" if "?" in path else "?"
    return RedirectResponse(f"{path}{sep}done={PAST[action]}&n={done}", status_code=303)
