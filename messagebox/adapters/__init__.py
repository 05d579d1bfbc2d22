"""Transports in and out, found by URL scheme.

    receive_adapter("file:///data/in?mask=*.xml")      # adapters.file.FileReceive
    receive_adapter("http://0.0.0.0:8080/orders")      # adapters.http.HttpReceive
    send_adapter("file:///data/out/%MessageID%.xml")   # adapters.file.FileSend
    send_adapter("https://partner.example/orders", timeout=10)  # adapters.http.HttpSend

Each adapter module's docstring is its spec (URL form, options). Register your own with
:func:`register` (see :mod:`messagebox.adapters.base` for the contract).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from messagebox.adapters.base import Inbound, Outbound, ReceiveAdapter, SendAdapter, Sink, Submitted
from messagebox.errors import UnknownAdapter

_receive: dict[str, type[ReceiveAdapter]] = {}
_send: dict[str, type[SendAdapter]] = {}
_loaded = False


def register(
    receive: type[ReceiveAdapter] | None = None, send: type[SendAdapter] | None = None
) -> None:
    """Make adapters available under their ``schemes``."""
    for cls, table in ((receive, _receive), (send, _send)):
        if cls is not None:
            for scheme in cls.schemes:
                table[scheme] = cls  # type: ignore[assignment]


def _builtins() -> None:
    global _loaded
    if not _loaded:
        from messagebox.adapters.file import FileReceive, FileSend
        from messagebox.adapters.http import HttpReceive, HttpSend

        register(FileReceive, FileSend)
        register(HttpReceive, HttpSend)
        _loaded = True


def _pick(url: str, table: dict[str, type], what: str) -> type:
    _builtins()
    if not isinstance(url, str) or "://" not in url:
        raise UnknownAdapter(
            f"{what} address {url!r} is not a URL; known schemes: {', '.join(sorted(table))}"
        )
    scheme = urlsplit(url).scheme.lower()
    cls = table.get(scheme)
    if cls is None:
        raise UnknownAdapter(
            f"no {what} adapter for scheme {scheme!r} in {url!r}; "
            f"known schemes: {', '.join(sorted(table))}"
        )
    return cls


def receive_adapter(url: str, **options: object) -> ReceiveAdapter:
    """The receive adapter for ``url``'s scheme."""
    return _pick(url, _receive, "receive")(url, **options)  # type: ignore[no-any-return]


def send_adapter(url: str, **options: object) -> SendAdapter:
    """The send adapter for ``url``'s scheme."""
    return _pick(url, _send, "send")(url, **options)  # type: ignore[no-any-return]


def schemes() -> dict[str, list[str]]:
    """The known schemes, for receiving and for sending."""
    _builtins()
    return {"receive": sorted(_receive), "send": sorted(_send)}


__all__ = [
    "Inbound",
    "Outbound",
    "ReceiveAdapter",
    "SendAdapter",
    "Sink",
    "Submitted",
    "receive_adapter",
    "register",
    "schemes",
    "send_adapter",
]
