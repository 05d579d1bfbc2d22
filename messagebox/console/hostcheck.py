"""The console's Host check, against DNS rebinding.

A page on ``evil.example`` that re-points its name at 127.0.0.1 gets the browser to send
its requests to a console there, and to let the page read the answers: same origin,
as far as the browser knows. But the requests still say ``Host: evil.example``, so the
console answers only to the names it is reached by, on every route, reads included.

:class:`AllowedHosts` is that list: the address the console is bound to; when that is a
loopback address (or ``localhost``), also ``localhost``, ``127.0.0.1`` and ``[::1]``;
and the names given (``--allowed-host``; a reverse proxy's, say). A name matches with
any port or none (an SSH tunnel or a proxy changes the port, and the port is not what a
rebinding page forges); ``NAME:PORT`` matches that port only. Bound to every address
(``0.0.0.0``, ``::``) with no names given, the check is off: any Host is accepted, and
:func:`messagebox.console.create_app` logs a warning saying so.

:class:`HostCheck` is the ASGI middleware: a request with any other Host (or none, or
two) gets 400 and a short plain-text answer naming the refused host, and is logged.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("messagebox.console")

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
"""Accepted too when the console is bound to a loopback address (any port)."""

_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
"""A DNS name or an IPv4 address, lowercased, without a trailing dot."""


def split_host(text: str) -> tuple[str, int | None]:
    """A ``Host`` value, or an allowed-host name, as (its name, normalised; its port or
    None): ``Localhost.:8080`` is ``("localhost", 8080)``, ``[0::1]`` and ``::1`` are
    ``("[::1]", None)``. Raises ValueError naming ``text`` when it is neither a name nor
    an IP address, with or without ``:PORT``."""
    wrong = ValueError(f"{text!r} is not a host name or an IP address, with or without :PORT")
    lowered = text.strip().lower()
    rest = ""
    try:
        if lowered.startswith("["):
            inside, bracket, rest = lowered[1:].partition("]")
            if not bracket:
                raise wrong
            name = f"[{ipaddress.IPv6Address(inside).compressed}]"
        elif lowered.count(":") > 1:  # a bare IPv6 address: no port
            name = f"[{ipaddress.IPv6Address(lowered).compressed}]"
        else:
            name, colon, port = lowered.partition(":")
            name, rest = name.removesuffix("."), colon + port
            if not _NAME.fullmatch(name):
                raise wrong
    except ValueError:
        raise wrong from None
    if not rest:
        return name, None
    digits = rest.removeprefix(":")
    if rest[0] != ":" or not digits.isascii() or not digits.isdigit():
        raise wrong
    if not 0 < int(digits) < 65536:
        raise wrong
    return name, int(digits)


def _address(bind: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(bind.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


@dataclass(frozen=True)
class AllowedHosts:
    """The ``Host`` values a console answers to: (name, None) entries match any port or
    none, (name, port) entries that port only; ``checked`` False accepts anything."""

    entries: frozenset[tuple[str, int | None]]
    checked: bool = True

    @classmethod
    def of(cls, bind: str, names: Iterable[str] = ()) -> AllowedHosts:
        """The names of a console bound to ``bind``, plus ``names`` (ValueError names a
        malformed one). Bound to every address with no names: unchecked."""
        given = {split_host(n) for n in names}
        address = _address(bind)
        everywhere = address is not None and address.is_unspecified
        if everywhere and not given:
            return cls(frozenset(), checked=False)
        entries = set(given)
        if not everywhere:
            entries.add((split_host(bind)[0], None))
        loopback = everywhere or (
            address.is_loopback
            if address is not None
            else bind.strip().lower().removesuffix(".") == "localhost"
        )
        if loopback:  # every address includes the loopback ones
            entries.update((name, None) for name in LOOPBACK_NAMES)
        return cls(frozenset(entries))

    def allows(self, host: str) -> bool:
        """Whether a request with this ``Host`` header is answered."""
        if not self.checked:
            return True
        try:
            name, port = split_host(host)
        except ValueError:
            return False
        return (name, None) in self.entries or (port is not None and (name, port) in self.entries)

    def __str__(self) -> str:
        if not self.checked:
            return "any host"
        return ", ".join(
            name if port is None else f"{name}:{port}"
            for name, port in sorted(self.entries, key=lambda e: (e[0], e[1] or 0))
        )


class HostCheck:
    """ASGI middleware: refuses (400, plain text, logged) an HTTP or WebSocket request
    whose ``Host`` header is not one of ``allowed``."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.allowed.checked:
            await self.app(scope, receive, send)
            return
        hosts = [value.decode("latin-1") for key, value in scope["headers"] if key == b"host"]
        if len(hosts) == 1 and self.allowed.allows(hosts[0]):
            await self.app(scope, receive, send)
            return
        if not hosts:
            why = "the request has no Host header"
        elif len(hosts) > 1:
            why = f"the request has {len(hosts)} Host headers ({', '.join(map(repr, hosts))})"
        else:
            why = f"the host {hosts[0]!r} is not one this console answers to"
        client = scope.get("client")
        log.warning(
            "refused %s %s from %s: %s (it answers to: %s; --allowed-host adds names)",
            scope.get("method", "WEBSOCKET"),
            scope.get("path", ""),
            client[0] if client else "an unknown client",
            why,
            self.allowed,
            extra={"event": "console-host-refused", "host_header": hosts},
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: a 403
            return
        answer = PlainTextResponse(
            f"400 Bad Request: {why} (a DNS-rebinding guard; the console's "
            "--allowed-host option adds names)\n",
            status_code=400,
            headers={"Cache-Control": "no-store"},
        )
        await answer(scope, receive, send)
