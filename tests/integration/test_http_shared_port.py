"""HTTP receive locations on one address share its server, on both backends: each is
served at its own path with its own pipeline, ``max_bytes`` and receipts; one path
twice is refused; the address is free again once the last of them stops."""

from __future__ import annotations

import json
import select
import socket
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from messagebox import MessageBox
from messagebox.adapters.http import HttpReceive, _Server
from messagebox.errors import ValidationError
from messagebox.hosts import HostApp
from messagebox.hosts.receive_locations import running_location
from messagebox.pipelines import JsonReceive, XmlReceive
from tests.conftest import free_port
from tests.integration.test_ports import (
    FAST,
    JSON_ORDER,
    JSON_ORDER_PROPS,
    XML_ORDER_PROPS,
    running,
    xml_order,
)


def _two_on_one_port(port: int) -> HostApp:
    app = HostApp("h", **FAST)
    web = app.receive_port("web")
    web.location(
        "orders", f"http://127.0.0.1:{port}/orders", pipeline=XmlReceive([XML_ORDER_PROPS])
    )
    web.location(
        "payments",
        f"http://127.0.0.1:{port}/payments/",
        pipeline=JsonReceive([JSON_ORDER_PROPS], message_type=JSON_ORDER),
        max_bytes=100,
    )
    return app


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_two_locations_share_a_port_each_with_its_own_settings(
    backend_url: str, box: MessageBox
) -> None:
    # Given two receive locations on one port: XML orders, and JSON payments of at most
    # 100 bytes
    port = free_port()
    app = _two_on_one_port(port)
    base = f"http://127.0.0.1:{port}"
    payment = json.dumps({"id": 7, "region": "EU", "total": 5.0}).encode()
    with running(app, backend_url), httpx.Client(timeout=10) as client:
        # When each gets what it takes
        order = client.post(f"{base}/orders", content=xml_order(1, "EU"))
        paid = client.post(f"{base}/payments", content=payment)
        # Then each published it through its own pipeline, as itself
        assert (order.status_code, paid.status_code) == (202, 202), (order.text, paid.text)
        [order_id] = order.json()["message_ids"]
        [payment_id] = paid.json()["message_ids"]
        assert box.read_message(order_id).promoted["messagebox.ReceiveLocationName"] == "orders"
        stored = box.read_message(payment_id).promoted
        assert stored["messagebox.ReceiveLocationName"] == "payments"
        assert stored["orders.Id"] == 7
        # And each keeps its own limit and its own receipts
        big = xml_order(2, "EU", "1" * 200)
        assert client.post(f"{base}/orders", content=big).status_code == 202
        assert client.post(f"{base}/payments", content=big).status_code == 413
        key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
        first = client.post(f"{base}/orders", content=xml_order(3, "EU"), headers=key)
        other = client.post(f"{base}/payments", content=payment, headers=key)
        assert first.json()["duplicate"] is False
        assert other.json()["duplicate"] is False  # another location: not a retry
        # And a path neither serves is not found
        assert client.post(f"{base}/refunds", content=payment).status_code == 404
    # When both stopped, the port is free again
    assert _bindable(port)


def test_one_path_twice_on_one_address_is_refused(backend_url: str) -> None:
    port = free_port()
    app = HostApp("h", **FAST)
    web = app.receive_port("web")
    web.location("a", f"http://127.0.0.1:{port}/orders")
    web.location("b", f"http://127.0.0.1:{port}/orders/")
    with pytest.raises(ValidationError, match="is served already"), running(app, backend_url):
        pass
    assert _bindable(port)


def test_the_server_stays_while_another_location_uses_it() -> None:
    port = free_port()

    class Sink:
        max_bytes = 10

        def submit(self, inputs: list[object]) -> list[object]:
            raise AssertionError("not called")

    first = HttpReceive(f"http://127.0.0.1:{port}/a")
    second = HttpReceive(f"http://127.0.0.1:{port}/b")
    first.start(None, "t", Sink())  # type: ignore[arg-type]
    second.start(None, "t", Sink())  # type: ignore[arg-type]
    try:
        first.stop(5)
        assert not _bindable(port)  # still serving /b
        answer = httpx.get(f"http://127.0.0.1:{port}/b", timeout=10)
        assert answer.status_code == 405  # /b answers (a GET is refused)
        gone = httpx.post(f"http://127.0.0.1:{port}/a", content=b"x", timeout=10)
        assert gone.status_code == 404
    finally:
        second.stop(5)
    assert _bindable(port)


def test_a_burst_of_connections_waits_in_the_backlog_not_for_tcp_retries() -> None:
    """Connections the server has not accepted yet are completed by the kernel up to the
    listen backlog; past it their SYNs are dropped and TCP retries them after 1, 3, 7 s.
    With the server's accepting stopped, a burst of 200 all connect."""
    server = _Server(("127.0.0.1", 0))  # listening, its accept loop not started
    clients: list[socket.socket] = []
    try:
        for _ in range(200):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(server.server_address)
            clients.append(c)
        deadline = time.monotonic() + 5.0
        waiting = set(clients)
        while waiting and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(waiting), [], 0.5)
            waiting -= set(writable)
        assert not waiting, f"{len(waiting)} of 200 connections not completed in 5 s"
        assert all(c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for c in clients)
    finally:
        for c in clients:
            c.close()
        server.server_close()


def test_concurrent_requests_are_published_together_each_answered_as_alone(
    backend_url: str, box: MessageBox
) -> None:
    # Given a location, and 40 requests at once: 30 orders, 10 of them sent twice with one
    # Idempotency-Key (a client's retry racing its first try), and 5 that its pipeline
    # refuses
    port = free_port()
    app = _two_on_one_port(port)
    base = f"http://127.0.0.1:{port}"
    requests: list[tuple[bytes, dict[str, str]]] = []
    for i in range(30):
        key = {"Idempotency-Key": f"order-{i}"} if i < 10 else {}
        requests.append((xml_order(i, "EU"), key))
        if key:
            requests.append((xml_order(i, "EU"), key))
    requests += [(b"<not-xml", {})] * 5
    with running(app, backend_url), httpx.Client(timeout=30) as client:
        location = running_location(box, "web", "orders")
        assert location is not None
        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(
                pool.map(
                    lambda r: client.post(f"{base}/orders", content=r[0], headers=r[1]), requests
                )
            )
        groups = location.adapter.grouped.groups  # type: ignore[attr-defined]
    # Then each got what it would have alone
    codes = Counter(a.status_code for a in answers)
    assert codes == {202: 40, 422: 5}, [a.text for a in answers if a.status_code >= 500]
    by_key: dict[str, set[str]] = {}
    for (_, key), answer in zip(requests, answers, strict=True):
        if key:
            by_key.setdefault(key["Idempotency-Key"], set()).update(answer.json()["message_ids"])
    assert all(len(ids) == 1 for ids in by_key.values())  # a retry: the first's id
    published = {i for a in answers if a.status_code == 202 for i in a.json()["message_ids"]}
    assert len(published) == 30
    refused = [s for s in box.suspended() if str(s.message_id) not in published]
    assert len(refused) == 5  # (the orders are suspended too: no subscription takes them)
    # And fewer transactions than requests were needed (they overlapped)
    print(f"45 requests in {groups} submits")
