"""What every console page needs: :class:`Console`, kept in the application's state."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from messagebox.audit import CONSOLE
from messagebox.console import auth

if TYPE_CHECKING:
    from starlette.templating import Jinja2Templates

    from messagebox.engine import MessageBox

log = logging.getLogger("messagebox.console")


@dataclass(frozen=True)
class Console:
    """What every page needs: the MessageBox, the secrets, the sessions, the templates."""

    box: MessageBox
    token: str | None
    templates: Jinja2Templates
    read_token: str | None = None
    sessions: auth.Sessions = field(default_factory=auth.Sessions)

    @property
    def actions(self) -> bool:
        """Whether resume and terminate are enabled (a token is configured)."""
        return self.token is not None

    def render(
        self, request: Request, template: str, *, status: int = 200, **context: Any
    ) -> Response:
        try:
            who = auth.caller(request)
        except HTTPException:
            who = auth.Caller(None, "")
        return self.templates.TemplateResponse(
            request,
            template,
            {
                "actions": self.actions,
                "status": status,
                "viewer": who,
                "csrf": who.session.csrf if who.session is not None else "",
                "login": self.token is not None or self.read_token is not None,
                "refresh": None,
                "live": False,
                **context,
            },
            status_code=status,
            headers={"Cache-Control": "no-store"},
        )

    def log_event(self, event: str, **fields: Any) -> None:
        log.info("%s %s", event, fields, extra={"event": event, **fields})

    def audit(
        self, caller: auth.Caller, action: str, target: str | None, count: int | None
    ) -> None:
        """Record an action in the audit log and the console's log."""
        role = caller.role or "anonymous"
        self.log_event(
            "console-action", who=caller.who, role=role, action=action, target=target, count=count
        )
        self.box.audit(action, who=caller.who, role=role, via=CONSOLE, target=target, count=count)

    def shows_parts(self, request: Request, form: FormData | None = None) -> bool:
        """Whether a message's part contents may be shown: on a console without a token
        always (it has no login), else only to a logged-in caller or a request carrying
        a token. A wrong token is refused (403), and so is a form posted without one."""
        if self.token is None and self.read_token is None:
            return True
        if self.sessions.get(request.cookies.get(auth.COOKIE)) is not None:
            return True
        field = form.get("token") if form is not None else None
        given = field.encode() if isinstance(field, str) else auth.bearer(request)
        if not given and form is None:
            return False
        if not given:
            raise HTTPException(
                403,
                "the contents of a message's parts need the console token (the token "
                "field, or an Authorization: Bearer header)",
            )
        if auth.checked(request, given) is None:
            raise HTTPException(403, "wrong token; the parts' contents are not shown")
        return True
