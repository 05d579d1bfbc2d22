"""What every console page needs: :class:`Console`, kept in the application's state."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from messagebox.console import auth
from messagebox.console.lockout import Lockout
from messagebox.storage.audit import CONSOLE

if TYPE_CHECKING:
    from starlette.templating import Jinja2Templates

    from messagebox.engine import MessageBox

log = logging.getLogger("messagebox.console")


@dataclass(frozen=True)
class Console:
    """What every page needs: the MessageBox, the secrets, the lock-outs, the templates."""

    box: MessageBox
    token: str | None
    templates: Jinja2Templates
    read_token: str | None = None
    session_settings: auth.SessionSettings = field(default_factory=auth.SessionSettings)
    lockout: Lockout = field(default_factory=lambda: Lockout(auth.policy))
    """Failed secrets by client address."""
    user_lockout: Lockout = field(default_factory=lambda: Lockout(auth.user_policy))
    """Failed logins by user name."""
    hashing: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(auth.HASHING_AT_ONCE)
    )
    """Turns to check a password (:mod:`messagebox.console.login`)."""

    def render(
        self, request: Request, template: str, *, status: int = 200, **context: Any
    ) -> Response:
        who: auth.Caller = request.scope.get(auth.CALLER) or auth.Caller(None, "anonymous")
        anonymous = who.role is None
        return self.templates.TemplateResponse(
            request,
            template,
            {
                # the forms of actions: for an operator, or (the token field) anyone
                # who is not logged in on a console with a token
                "actions": who.operator or (anonymous and self.token is not None),
                "admin": who.admin,
                "status": status,
                "viewer": who,
                "csrf": who.session.csrf if who.session is not None else "",
                # whether there is a login to offer: a secret, or (when asked) users
                "login": self.token is not None
                or self.read_token is not None
                or request.scope.get(auth.USERS) is not False,
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
        """Record an action in the audit log and the console's log: who (a user's name,
        or ``token:admin``), with which role, from which address."""
        role = caller.role or "anonymous"
        self.log_event(
            "console-action",
            who=caller.who,
            role=role,
            action=action,
            target=target,
            count=count,
            client=caller.client,
        )
        self.box.audit(
            action,
            who=caller.who,
            role=role,
            via=CONSOLE,
            target=target,
            count=count,
            detail=f"from {caller.client}",
        )

    def shows_parts(self, request: Request, form: FormData | None = None) -> bool:
        """Whether a message's part contents may be shown: to a logged-in caller, or a
        request carrying a token; on a console without any secret or user (open to
        every reader) always. A wrong token is refused (403), and so is a form posted
        without one."""
        if auth.caller(request).role is not None:
            return True
        if self.token is None and auth.open_to_all(request):
            return True
        field = form.get("token") if form is not None else None
        given = field.encode() if isinstance(field, str) else auth.bearer(request)
        if not given and form is None:
            return False
        if not given:
            raise HTTPException(
                403,
                "the contents of a message's parts need the console token (the token "
                "field, or an Authorization: Bearer header) or a login",
            )
        if auth.checked(request, given) is None:
            raise HTTPException(403, "wrong token; the parts' contents are not shown")
        return True
