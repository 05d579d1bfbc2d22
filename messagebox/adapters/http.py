"""The HTTP adapter: receive POSTed messages, send by POST.

**Receive** — ``http://0.0.0.0:8080/orders`` (port 0 picks a free port; see
:attr:`HttpReceive.address`). Locations on one address (``:8181/orders`` and
``:8181/payments``) share one server in the process, each at its path with its own
pipeline, ``max_bytes`` and receipts; two at one path of one address are refused.

A ``POST`` to the path with a ``Content-Length`` is run through the receive pipeline
and published before the answer is sent (requests that arrive together are published
together, in one transaction: :mod:`messagebox.adapters.grouping`):

- ``202`` ``{"message_ids": [...]}``: published (committed);
- ``422`` ``{"error", "code", "suspended": [id]}``: the pipeline refused it; it is
  suspended with its original bytes;
- ``413`` larger than the location's ``max_bytes``; ``411`` no ``Content-Length``;
  ``404`` a path no location of the address serves; ``405`` another method: nothing
  stored;
- ``503`` (with ``Retry-After``): throttled or the database failed; nothing stored,
  send it again.

An ``Idempotency-Key`` header makes a retried request safe: a key seen before is
answered ``202`` with the first request's message ids, and nothing is published again.

**Send** — ``https://partner.example/orders`` with options ``timeout`` (30.0 s) and
``content_type`` (default: from the message type, XML or JSON). The message id goes in
the ``X-Message-Id`` header. Any answer other than 2xx, or no answer within the
timeout, fails the attempt (the send port retries, then uses its backup).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import httpx

from messagebox.adapters.base import (
    Inbound,
    Outbound,
    ReceiveAdapter,
    SendAdapter,
    Sink,
    parse_options,
)
from messagebox.adapters.grouping import GroupedSink
from messagebox.errors import AlreadyReceived, MessageBoxError, Throttled, ValidationError

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

log = logging.getLogger("messagebox.adapters.http")

MAX_KEY = 200


def _route(path: str) -> str:
    """The path a location serves, as requests are matched to it."""
    return path.rstrip("/") or "/"


class _Server(ThreadingHTTPServer):
    """One listening address, serving the receive locations bound to it by path."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    """The listen backlog: connections the kernel completes while the server has not
    accepted them yet (the system's ``net.core.somaxconn`` caps it). socketserver's
    default of 5 dropped the connections of a burst of clients while the accepting
    thread waited its turn for the interpreter: they were retried by TCP after 1, 3,
    7 s (50 concurrent clients: p99 1.5 s, max 27 s)."""

    def __init__(self, bind: tuple[str, int]) -> None:
        super().__init__(bind, _Handler)
        self.routes: dict[str, HttpReceive] = {}
        self.thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"http-receive:{bind[0]}:{self.server_address[1]}",
            daemon=True,
        )


_SERVERS: dict[tuple[str, int], _Server] = {}
"""The servers of this process by address (not those of port 0: each its own)."""
_SERVERS_LOCK = threading.Lock()


def _attach(adapter: HttpReceive) -> _Server:
    """Serve ``adapter`` at its path on its address's server, started if need be."""
    route = _route(adapter.path)
    with _SERVERS_LOCK:
        server = _SERVERS.get(adapter.bind)
        if server is None:
            try:
                server = _Server(adapter.bind)
            except OSError as exc:
                raise ValidationError(
                    f"{adapter.url}: cannot listen on {adapter.bind}: {exc}"
                ) from exc
            server.thread.start()
            if adapter.bind[1] != 0:
                _SERVERS[adapter.bind] = server
        other = server.routes.get(route)
        if other is not None:
            raise ValidationError(
                f"{adapter.url}: {route} on {adapter.bind[0]}:{adapter.bind[1]} is served "
                f"already (by {other.url}); give each location a path of its own"
            )
        server.routes[route] = adapter
    return server


def _detach(adapter: HttpReceive, server: _Server, timeout: float) -> None:
    """Stop serving ``adapter``; the server stops with the last location it serves."""
    with _SERVERS_LOCK:
        if server.routes.get(_route(adapter.path)) is adapter:
            del server.routes[_route(adapter.path)]
        if server.routes:
            return
        if _SERVERS.get(adapter.bind) is server:
            del _SERVERS[adapter.bind]
    server.shutdown()
    server.server_close()
    server.thread.join(timeout)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _answer(
        self,
        status: int,
        body: dict[str, Any],
        *,
        close: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer with JSON; ``close`` for a request whose body was not read (the
        connection cannot carry another request after unread bytes)."""
        data = json.dumps(body).encode()
        headers = dict(headers or {})
        if close:
            self.close_connection = True
            headers["Connection"] = "close"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        adapter = self.server.routes.get(_route(urlsplit(self.path).path))
        if adapter is None:
            self._answer(404, {"error": f"no receive location at {self.path}"}, close=True)
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._answer(411, {"error": "a Content-Length header is required"}, close=True)
            return
        size = int(length)
        if size > adapter.sink.max_bytes:
            self._answer(
                413,
                {"error": f"the body is {size} bytes; at most {adapter.sink.max_bytes}"},
                close=True,
            )
            return
        body = self.rfile.read(size)
        if len(body) != size:
            self._answer(
                400, {"error": f"the body ended after {len(body)} of {size} bytes"}, close=True
            )
            return
        key = self.headers.get("Idempotency-Key")
        if key is not None and (not key or len(key) > MAX_KEY):
            self._answer(400, {"error": f"Idempotency-Key must be 1 to {MAX_KEY} characters"})
            return
        props: dict[str, object] = {}
        if self.headers.get("Content-Type"):
            props["http.ContentType"] = self.headers["Content-Type"][:256]
        inbound = Inbound.of_bytes(body, key=key, properties=props, name=f"POST {self.path}")
        try:
            result = adapter.grouped.submit(inbound)
        except AlreadyReceived as exc:
            self._answer(202, {"message_ids": exc.message_ids, "duplicate": True})
            return
        except Throttled as exc:
            self._answer(503, {"error": str(exc)}, headers={"Retry-After": "5"})
            return
        except MessageBoxError as exc:
            log.error("%s: could not publish: %s", adapter.address, exc)
            self._answer(503, {"error": f"not stored: {exc}"}, headers={"Retry-After": "5"})
            return
        ids = [str(i) for i in result.message_ids]
        if result.suspended:
            self._answer(422, {"error": result.error, "code": result.code, "suspended": ids})
        else:
            self._answer(202, {"message_ids": ids, "duplicate": result.duplicate})

    def _refuse(self) -> None:
        self._answer(405, {"error": "only POST is accepted"}, close=True, headers={"Allow": "POST"})

    do_GET = do_PUT = do_DELETE = do_PATCH = _refuse


class HttpReceive(ReceiveAdapter):
    """An HTTP endpoint that publishes each POSTed body."""

    schemes = ("http",)
    transport_type = "HTTP"

    def __init__(self, url: str, **options: object) -> None:
        super().__init__(url, **options)
        parts = urlsplit(url)
        parse_options(url, {}, options, query=parts.query)
        if not parts.hostname:
            raise ValidationError(f"{url}: an HTTP receive URL needs a host to bind")
        self.bind = (parts.hostname, 80 if parts.port is None else parts.port)  # 0: any free port
        self.path = parts.path or "/"
        self._server: _Server | None = None
        self._address = url

    @property
    def address(self) -> str:
        """The URL it listens on (with the real port once started)."""
        return self._address

    def start(self, box: MessageBox, owner: str, sink: Sink) -> None:
        self.sink = sink
        self.grouped = GroupedSink(sink)  # concurrent requests in one transaction
        self._server = _attach(self)
        host, port = self._server.server_address[:2]
        self._address = f"http://{host!s}:{port}{self.path}"

    def stop(self, timeout: float) -> None:
        if self._server is not None:
            _detach(self, self._server, timeout)
            self._server = None


class HttpSend(SendAdapter):
    """POST each message to a URL."""

    schemes = ("http", "https")
    OPTIONS: ClassVar[dict[str, object]] = {"timeout": 30.0, "content_type": ""}

    def __init__(self, url: str, **options: object) -> None:
        super().__init__(url, **options)
        opts = parse_options(url, self.OPTIONS, options)
        self.timeout = float(opts["timeout"])  # type: ignore[arg-type]
        self.content_type = str(opts["content_type"])
        self._client = httpx.Client(timeout=self.timeout)

    def send(self, body: bytes, message: Outbound) -> str:
        kind = self.content_type or (
            "application/xml"
            if body.lstrip()[:1] == b"<"
            else "application/json"
            if body.lstrip()[:1] in (b"{", b"[")
            else "application/octet-stream"
        )
        response = self._client.post(
            self.url,
            content=body,
            headers={"Content-Type": kind, "X-Message-Id": str(message.message_id)},
        )
        if not response.is_success:
            raise OSError(
                f"POST {self.url} answered {response.status_code} "
                f"{response.reason_phrase}: {response.text[:200]}"
            )
        return f"{self.url} {response.status_code}"

    def close(self) -> None:
        self._client.close()
