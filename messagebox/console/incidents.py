"""The console's incident pages: the suspended entries (filtered by reason, host, error
text and failure group), failure groups and each group's page with its entries, bulk
actions on suspended entries (a selection, a group, or every entry matching a filter;
resume, terminate or reroute) with a count and a confirmation, and the audit log.

A bulk action is two posts: the first shows what it would change (how many entries, of
which reasons) and asks to confirm; the second, with ``confirm``, does it on the entries
that still match, records it in the audit log and says how many changed. Both need an
operator (:func:`messagebox.console.auth.actor`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import parse_qsl, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from messagebox.console import auth, pages
from messagebox.console.pages import refresh_seconds
from messagebox.errors import UnknownFailureGroup
from messagebox.models import REROUTABLE, SUSPENDED_REASONS
from messagebox.ops.failures import SCAN

if TYPE_CHECKING:
    from messagebox.console.state import Console
    from messagebox.engine import MessageBox
    from messagebox.models import SuspendedEntry

ACTIONS = ("resume", "terminate", "reroute")
PAST = {"resume": "resumed", "terminate": "terminated", "reroute": "rerouted"}
MAX_SELECTION = 100_000
AUDIT_ROWS = 200
ID_CHUNK = 1000
BATCH = 1000
"""Entries per transaction of a bulk resume or terminate by filter."""
MAX_ERROR_TEXT = 200
_GROUP_ID = re.compile(r"[0-9a-f]{16}")


class Filters(TypedDict, total=False):
    """The suspended list's filters, as :meth:`~messagebox.MessageBox.suspended` takes
    them."""

    reason: str
    host: str
    error: str
    group: str


FILTER_NAMES = ("reason", "host", "error", "group")


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def failures(request: Request) -> Response:
    """Suspended entries grouped by how they failed, largest group first."""
    c = _console(request)
    groups = c.box.failure_groups(SCAN)
    return c.render(
        request,
        "failures.html",
        title="Failure groups",
        groups=groups,
        scanned=sum(g.count for g in groups),
        scan=SCAN,
        notice=_notice(request),
        refresh=refresh_seconds(request, default=False),
        live=True,
    )


def failure_group(request: Request) -> Response:
    """One failure group: what its entries have in common, its actions, its entries (a
    page at a time, newest first)."""
    c = _console(request)
    group_id = _group(request.path_params["group_id"])
    page = _page(request)
    try:
        group = c.box.failure_group(group_id, SCAN)
    except UnknownFailureGroup:
        if _notice(request) is None:  # not just emptied by an action here
            raise
        group = None
    ids = group.entry_ids if group else []
    shown = ids[(page - 1) * pages.LIST_LIMIT : page * pages.LIST_LIMIT]
    return c.render(
        request,
        "failure_group.html",
        title=f"Failure group {group_id}",
        group=group,
        entries=c.box.suspended(ids=shown, limit=len(shown), newest_first=True) if shown else [],
        names={s.id: s for s in c.box.subscriptions()},
        page=page,
        pages=max(1, -(-len(ids) // pages.LIST_LIMIT)),
        notice=_notice(request),
    )


def suspended(request: Request) -> Response:
    """Suspended entries, newest first (``order=oldest``: oldest first), a page of
    :data:`~messagebox.console.pages.LIST_LIMIT` at a time, optionally of one reason,
    host or failure group, or whose error contains a text."""
    c = _console(request)
    filters = _filters(c.box, request.query_params)
    newest = request.query_params.get("order", "newest") != "oldest"
    page = _page(request)
    entries = c.box.suspended(
        **filters,
        limit=pages.LIST_LIMIT,
        offset=(page - 1) * pages.LIST_LIMIT,
        newest_first=newest,
    )
    total = c.box.count_suspended(**filters)
    done = request.query_params.get("done")
    entry = request.query_params.get("entry", "")
    return c.render(
        request,
        "suspended.html",
        title="Suspended",
        entries=entries,
        names={s.id: s for s in c.box.subscriptions()},
        reasons=SUSPENDED_REASONS,
        hosts=[h.name for h in c.box.hosts()],
        reason=filters.get("reason"),
        host=filters.get("host"),
        error=filters.get("error"),
        group=filters.get("group"),
        limit=pages.LIST_LIMIT,
        notice=f"Entry {entry} {done}."
        if done in ("resumed", "terminated") and entry.isascii() and entry.isdigit()
        else _notice(request),
        page=page,
        pages=max(1, -(-total // pages.LIST_LIMIT)),
        total=total,
        order="newest" if newest else "oldest",
        reroutable=REROUTABLE,
        refresh=refresh_seconds(request, default=False),
        live=True,
    )


def _filters(box: MessageBox, given: Any) -> Filters:
    """The suspended-list filters of a query string or a form, checked: a reason that is
    none (400), an unknown host (404), a malformed group id (400)."""
    found = Filters()
    for key in FILTER_NAMES:
        value = given.get(key)
        if isinstance(value, str) and value.strip():
            found[key] = value.strip()  # type: ignore[literal-required]
    if "reason" in found and found["reason"] not in SUSPENDED_REASONS:
        raise HTTPException(
            400, f"unknown reason {found['reason']!r}; one of: {', '.join(SUSPENDED_REASONS)}"
        )
    if "host" in found:
        box.host(found["host"])  # an unknown host is a 404, not an empty list
    if "group" in found:
        found["group"] = _group(found["group"])
    if len(found.get("error", "")) > MAX_ERROR_TEXT:
        raise HTTPException(400, f"the error text is longer than {MAX_ERROR_TEXT} characters")
    return found


def _group(text: str) -> str:
    if not _GROUP_ID.fullmatch(text):
        raise HTTPException(400, f"{text!r} is not a failure group id (16 hex digits)")
    return text


def _page(request: Request) -> int:
    text = request.query_params.get("page", "1")
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 10**6:
        raise HTTPException(400, f"page {text!r} is not a page number")
    return int(text)


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
    entries matching ``reason``, ``host``, ``error`` and ``group``."""

    def __init__(self, box: MessageBox, form: FormData) -> None:
        self.ids = [_int(v) for v in form.getlist("id") if isinstance(v, str)]
        self.filters = _filters(box, form)
        self.all = form.get("all") == "1" or (set(self.filters) == {"group"} and not self.ids)
        if bool(self.ids) == self.all or (self.ids and self.filters):
            raise HTTPException(
                400,
                "choose the entries: tick some, or pick a failure group, or all matching the "
                "filter; nothing was changed",
            )

    def hidden(self) -> list[tuple[str, str]]:
        """The form fields that name this selection again."""
        fields = [("id", str(i)) for i in self.ids]
        if self.all:
            fields.append(("all", "1"))
        return fields + [(k, str(v)) for k, v in self.filters.items()]

    def describe(self) -> str:
        if self.ids:
            return f"{len(self.ids)} selected"
        if set(self.filters) == {"group"}:
            return f"failure group {self.filters['group']}"
        shown = ", ".join(
            f"{k} {v!r}" if k == "error" else f"{k} {v}" for k, v in self.filters.items()
        )
        return f"all matching {shown or 'no filter'}"

    def entries(self, box: MessageBox) -> list[SuspendedEntry]:
        """The suspended entries selected now."""
        if self.all:
            return box.suspended(**self.filters, limit=MAX_SELECTION)
        entries: list[SuspendedEntry] = []
        for start in range(0, len(self.ids), ID_CHUNK):  # a parameter each: a bounded list
            entries += box.suspended(ids=self.ids[start : start + ID_CHUNK], limit=ID_CHUNK)
        return entries

    def run(self, box: MessageBox, action: str, targets: list[SuspendedEntry]) -> int:
        """Do ``action``: by id on the ``targets`` confirmed, or (filtered, not reroute)
        on the entries matching now, in batches."""
        if action == "reroute" or not self.filters:
            return _run(box, action, [e.id for e in targets])
        act = box.resume if action == "resume" else box.terminate
        return len(act(**self.filters, batch=BATCH))


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
        caller = auth.actor(request, form)
        action = form.get("action")
        if action not in ACTIONS:
            raise HTTPException(400, f"unknown action {action!r}; one of: {', '.join(ACTIONS)}")
        selection = await run_in_threadpool(_Selection, c.box, form)
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
    done = await run_in_threadpool(selection.run, c.box, action, targets)
    await run_in_threadpool(c.audit, caller, f"{action} (bulk)", selection.describe(), done)
    target = back if isinstance(back, str) and back.startswith("/") and "//" not in back else None
    root = str(request.scope.get("root_path", ""))
    path = target or root + request.app.url_path_for("failures")
    where, _, query = path.partition("?")
    kept = [(k, v) for k, v in parse_qsl(query) if k not in ("done", "n", "entry")]
    query = urlencode([*kept, ("done", PAST[action]), ("n", str(done))])
    return RedirectResponse(f"{where}?{query}", status_code=303)
