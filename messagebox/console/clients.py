"""Who a request comes from: the address the lock-out (:mod:`messagebox.console.lockout`)
counts and the audit log and the console's log record.

It is the socket peer. ``X-Forwarded-For`` is anyone's to write, so it is read only when
the operator names the proxies in front of the console (``trusted_proxies``, from
``MESSAGEBOX_CONSOLE_TRUSTED_PROXIES``: addresses or networks, ``10.0.0.5,
192.168.0.0/24``) and the peer is one of them. Then the header is read from the right,
the end each proxy appends to: the first address that is not a trusted proxy is the
client (what came before it is what that client claimed, and is ignored); an entry that
is not an address stops the walk, leaving the last proxy reached as the client. The
scheme a trusted proxy gives (``X-Forwarded-Proto``: ``http`` or ``https``) is taken too,
so that the session cookie is marked ``Secure`` behind a TLS proxy.

:class:`ClientAddress` is the ASGI middleware that sets the request's client so;
uvicorn's own reading of the header is turned off (:mod:`messagebox.console.background`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

TRUSTED_PROXIES_ENV = "MESSAGEBOX_CONSOLE_TRUSTED_PROXIES"


def _address(text: str) -> Address | None:
    """An address of a header entry or a peer (``[v6]``, ``v4:port`` and ``[v6]:port``
    too); None when it is none."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        found = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


@dataclass(frozen=True)
class TrustedProxies:
    """The proxies whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed."""

    networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, names: Iterable[str]) -> TrustedProxies:
        """From addresses and networks (``10.0.0.5``, ``10.0.0.0/8``, ``fd00::/8``); a
        ValueError names a malformed one."""
        networks = []
        for name in names:
            try:
                networks.append(ipaddress.ip_network(name.strip(), strict=False))
            except ValueError:
                raise ValueError(
                    f"{name!r} is not an IP address or network (a trusted proxy)"
                ) from None
        return cls(tuple(networks))

    def __contains__(self, address: object) -> bool:
        return isinstance(address, Address) and any(
            address.version == n.version and address in n for n in self.networks
        )

    def client(self, peer: str, forwarded: list[str]) -> str:
        """The client of a request from ``peer`` with these ``X-Forwarded-For`` values."""
        current = _address(peer)
        if current is None or current not in self:
            return peer
        entries = [e for value in forwarded for e in value.split(",") if e.strip()]
        for entry in reversed(entries):
            found = _address(entry)
            if found is None:
                break
            current = found
            if found not in self:
                break
        return str(current)


class ClientAddress:
    """ASGI middleware: the request's client is its socket peer, or behind ``proxies``
    the client they name (:class:`TrustedProxies`)."""

    def __init__(self, app: ASGIApp, proxies: TrustedProxies) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer = scope.get("client")
        if scope["type"] not in ("http", "websocket") or not self.proxies.networks or not peer:
            await self.app(scope, receive, send)
            return
        forwarded = [v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"]
        client = self.proxies.client(str(peer[0]), forwarded)
        changed = dict(scope)
        if client != peer[0]:
            changed["client"] = (client, 0)
        if _address(str(peer[0])) in self.proxies:
            proto = [v for k, v in scope["headers"] if k == b"x-forwarded-proto"]
            scheme = proto[-1].decode("latin-1").strip().lower() if proto else ""
            if scheme in ("http", "https") and scope["type"] == "http":
                changed["scheme"] = scheme
        await self.app(changed, receive, send)
