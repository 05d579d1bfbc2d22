"""The web console as an operator uses it, on the embedded default (DuckDB): in a real
browser (headless Debian chromium through selenium), an entry suspended by a failing
service is resumed with the token and then delivered; operators log in by name and
password (or with the token), a reader sees no action and is refused one; and
``messagebox console`` as a command, with its token from a file or the environment.

The browser test skips when chromium or chromedriver is missing, except when
``CI=true``: there it fails. DuckDB allows one process per file, so the browser test
serves the console from a thread of the test process, beside the host instance.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from pydantic import BaseModel

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.console.cli import TOKEN_ENV
from messagebox.hosts import (
    Delivery,
    HostApp,
    HostInstance,
    Orchestration,
    activate,
    receive,
    timeout,
)
from messagebox.predicates import P
from messagebox.storage import rollup
from tests.conftest import IN_CI, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TOKEN = "open-sesame"
PASSWORD = "correct horse battery"
FAST: dict[str, Any] = {
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.1,
    "retry_backoff_seconds": 0.0,
    "heartbeat_seconds": 0.2,
    "dead_after_seconds": 2.0,
    "cleanup_interval_seconds": 0.0,
    "max_attempts": 1,
}


def require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return
    reason = f"{' and '.join(missing)} missing (apt-get install chromium chromium-driver)"
    if IN_CI:
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


SHOTS_ENV = "MESSAGEBOX_SCREENSHOTS"
"""A folder: when set, the tests save screenshots of the pages they walk there."""


def screenshot(browser: object, name: str) -> None:
    """Save the page as ``$MESSAGEBOX_SCREENSHOTS/NAME.png``, when that is set."""
    from selenium.webdriver.remote.webdriver import WebDriver

    folder = os.environ.get(SHOTS_ENV)
    if not folder or not isinstance(browser, WebDriver):
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, max(800, min(int(height) + 40, 4000)))
    browser.save_screenshot(str(Path(folder) / f"{name}.png"))


@contextmanager
def serving(box: MessageBox, token: str | None) -> Iterator[str]:
    """The console over ``box``, served by uvicorn from a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(box, token=token),
        log_level="warning",
        lifespan="off",
        ws="none",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, "the console to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def browser() -> Iterator[object]:
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    driver.implicitly_wait(30)  # a click's page may still be loading: wait for elements
    try:
        yield driver
    finally:
        driver.quit()


def test_an_operator_resumes_a_failed_delivery_in_the_browser(
    tmp_path: Path, browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    box = MessageBox(f"duckdb:///{tmp_path / 'box.duckdb'}")
    box.create_host("shipping", **FAST)
    box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
    # Given a service that fails its first delivery (max_attempts 1: suspended at once)
    healthy = threading.Event()
    delivered: list[tuple[str, int]] = []

    def ship(delivery: Delivery) -> None:
        if not healthy.is_set():
            raise RuntimeError("the warehouse is offline")
        delivered.append((str(delivery.message_id), delivery.attempt))

    inst = HostInstance(box, "shipping", {"ship": ship}).start()
    try:
        [routed] = box.publish([Message(b"<order/>", promoted={"orders.Region": "EU"})])
        wait_for(lambda: len(box.suspended()) == 1, "the delivery failure")
        [entry] = box.suspended()
        assert entry.reason == "delivery-failure"
        healthy.set()  # the warehouse is back
        with serving(box, TOKEN) as base:
            # When the operator opens the suspended queue
            browser.get(f"{base}/suspended")
            row = browser.find_element(By.ID, f"entry-{entry.id}")
            assert "RuntimeError: the warehouse is offline" in row.text
            # and its message: the parts' contents are hidden until the token is typed
            browser.get(f"{base}/messages/{routed.message_id}")
            reveal = browser.find_element(By.ID, "reveal")
            assert "body (body) · 8 B" in browser.find_element(By.ID, "part-1").text
            assert "order/" not in browser.find_element(By.TAG_NAME, "main").text
            reveal.find_element(By.NAME, "token").send_keys(TOKEN)
            reveal.find_element(By.TAG_NAME, "button").click()
            assert browser.find_element(By.CSS_SELECTOR, "pre.preview").text == "<order/>"
            # When the operator goes back to the entry and first types a wrong token
            browser.get(f"{base}/suspended")
            row = browser.find_element(By.ID, f"entry-{entry.id}")
            row.find_element(By.NAME, "token").send_keys("guess")
            row.find_element(By.CSS_SELECTOR, "button.resume").click()
            # Then the console refuses it and nothing changes
            assert "wrong token" in browser.find_element(By.ID, "error").text
            assert [e.id for e in box.suspended()] == [entry.id]
            # When the operator types the token and clicks Resume
            browser.get(f"{base}/suspended")
            row = browser.find_element(By.ID, f"entry-{entry.id}")
            row.find_element(By.NAME, "token").send_keys(TOKEN)
            row.find_element(By.CSS_SELECTOR, "button.resume").click()
            # Then the page says it was resumed, and the service gets the message
            assert browser.find_element(By.ID, "notice").text == f"Entry {entry.id} resumed."
            wait_for(lambda: bool(delivered), "the delivery after resume")
            assert delivered == [(str(routed.message_id), 1)]
            wait_for(lambda: not box.queue_depth(), "the queue to drain")
            # and the overview shows every queue empty, nothing suspended
            browser.get(f"{base}/")
            assert browser.find_element(By.ID, "queues-empty").text == "Every queue is empty."
            counts = browser.find_element(By.ID, "counts").text
            assert "queued\n0" in counts
            assert "suspended\n0" in counts
            browser.get(f"{base}/suspended")
            assert browser.find_element(By.ID, "no-suspended").text == "No suspended entries."
    finally:
        inst.stop(5.0)
        box.close()


def test_a_reader_logs_in_sees_no_action_and_is_refused_one(
    tmp_path: Path, browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    url, entry_id = suspended_store(tmp_path / "box.duckdb")
    box = MessageBox(url)
    try:
        box.add_user("rita", "reader", PASSWORD)
        with serving(box, TOKEN) as base:
            # When a stranger opens the suspended queue, the console asks to log in
            browser.get(f"{base}/suspended")
            form = browser.find_element(By.ID, "login")
            # and the reader logs in by name and password
            form.find_element(By.NAME, "user").send_keys("rita")
            form.find_element(By.NAME, "password").send_keys(PASSWORD)
            form.find_element(By.TAG_NAME, "button").click()
            # Then the reader is back on the suspended queue, and sees the entry
            assert browser.find_element(By.ID, "who").text == "rita (reader)"
            row = browser.find_element(By.ID, f"entry-{entry_id}")
            assert "service-unenlisted" in row.text
            # but no Resume button, and a note saying why
            browser.implicitly_wait(0)
            assert browser.find_elements(By.CSS_SELECTOR, "button.resume") == []
            browser.implicitly_wait(30)
            assert "rita is a reader" in browser.find_element(By.ID, "read-only").text
            # When the reader's session posts Resume all the same (its cookie, its CSRF)
            cookie = browser.get_cookie("mb_session")
            assert cookie is not None
            assert cookie["httpOnly"] is True
            assert cookie["sameSite"] == "Strict"
            csrf = browser.find_element(By.CSS_SELECTOR, "form.logout input[name=csrf]")
            refused = httpx.post(
                f"{base}/suspended/{entry_id}/resume",
                data={"csrf": csrf.get_attribute("value") or ""},
                cookies={"mb_session": cookie["value"]},
                timeout=30,
            )
            # Then it is refused, and nothing changes
            assert refused.status_code == 403
            assert "rita is a reader: this needs an operator" in refused.text
            assert [e.id for e in box.suspended()] == [entry_id]
            # When an admin makes rita an operator, her next page has the button
            box.set_user_role("rita", "operator")
            browser.get(f"{base}/suspended")
            row = browser.find_element(By.ID, f"entry-{entry_id}")
            row.find_element(By.CSS_SELECTOR, "button.resume").click()
            assert browser.find_element(By.ID, "notice").text == f"Entry {entry_id} resumed."
            assert box.suspended() == []
            [resumed] = box.audit_log()
            assert (resumed.who, resumed.role, resumed.action) == ("rita", "operator", "resume")
    finally:
        box.close()


def chart_totals(browser: object, chart_id: str) -> dict[str, int]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    found = browser.find_element(By.ID, chart_id).get_attribute("data-totals")
    assert found is not None
    totals: dict[str, int] = json.loads(found)
    return totals


def test_an_operator_logs_in_and_bulk_resumes_a_failure_group_and_the_chart_moves(
    tmp_path: Path, browser: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    monkeypatch.setattr(rollup, "FLUSH_SECONDS", 0.0)  # counts reach the store at once
    box = MessageBox(f"duckdb:///{tmp_path / 'box.duckdb'}")
    box.create_host("billing", **FAST)
    box.subscribe("bill", host="billing", filter=P("orders.Total") >= 0, name="bill-all")
    healthy = threading.Event()
    delivered: list[str] = []

    def bill(delivery: Delivery) -> None:
        if not healthy.is_set():
            raise TimeoutError(f"the ledger did not answer for {delivery.message_id}")
        delivered.append(str(delivery.message_id))

    inst = HostInstance(box, "billing", {"bill": bill}).start()
    try:
        # Given six orders whose billing timed out (one failure group)
        box.publish([Message(b"<o/>", promoted={"orders.Total": t}) for t in range(6)])
        wait_for(lambda: box.count_suspended() == 6, "six delivery failures")
        healthy.set()
        box.add_user("ada", "operator", PASSWORD)
        with serving(box, TOKEN) as base:
            # When the operator logs in by name and password
            browser.get(f"{base}/login")
            form = browser.find_element(By.ID, "login")
            form.find_element(By.NAME, "user").send_keys("ada")
            form.find_element(By.NAME, "password").send_keys(PASSWORD)
            form.find_element(By.TAG_NAME, "button").click()
            assert browser.find_element(By.ID, "who").text == "ada (operator)"
            # and sees, on the overview's chart, six failures and nothing delivered yet
            before = chart_totals(browser, "chart-rates")
            assert (before["failed"], before["delivered"]) == (6, 0)
            # When the operator opens the failure groups and resumes the timeouts
            browser.get(f"{base}/failures")
            [group] = box.failure_groups()
            row = browser.find_element(By.ID, f"group-{group.id}")
            assert "the ledger did not answer for <id>" in row.text
            assert "TimeoutError" in row.text
            row.find_element(By.CSS_SELECTOR, "button.resume").click()
            # Then the console asks to confirm, with the count
            assert "6 entries" in browser.find_element(By.ID, "confirm-count").text
            assert box.count_suspended() == 6
            browser.find_element(By.ID, "confirm").find_element(By.TAG_NAME, "button").click()
            assert browser.find_element(By.ID, "notice").text == "6 entries resumed."
            wait_for(lambda: len(delivered) == 6, "the six deliveries after resume")

            # and the chart moves: the overview shows the six deliveries
            def moved() -> bool:
                browser.get(f"{base}/")
                return chart_totals(browser, "chart-rates")["delivered"] == 6

            wait_for(moved, "the chart to show the deliveries")
            # and the audit log names the operator, the action and the count
            browser.get(f"{base}/audit")
            audit = browser.find_element(By.ID, "audit").text
            assert "ada operator console resume (bulk)" in audit
            assert "from 127.0.0.1" in audit
    finally:
        inst.stop(5.0)
        box.close()


def test_an_operator_opens_a_failure_group_of_fifty_and_resumes_it(
    tmp_path: Path, browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    box = MessageBox(f"duckdb:///{tmp_path / 'box.duckdb'}")
    box.create_host("shipping", **FAST)
    box.subscribe("ship", host="shipping", filter=P("o.N") >= 0, name="ship-all")
    healthy = threading.Event()
    delivered: list[int] = []

    def price(order: str) -> None:
        raise ValueError(f"unsupported currency 'JPY' for order {order}")

    def ship(delivery: Delivery) -> None:
        n = delivery.properties["o.N"]
        assert isinstance(n, int)
        if n >= 50 and not healthy.is_set():
            raise KeyError(f"tax table has no entry for region {n}")  # another failure
        if not healthy.is_set():
            price(str(delivery.properties["o.Id"]))
        delivered.append(n)

    inst = HostInstance(box, "shipping", {"ship": ship}).start()
    try:
        # Given 50 orders, each with an id of its own (A064109, B7, …), failed alike
        ids = [f"{'ABCDEFGH'[n % 8]}{n * 7919 % 10 ** (1 + n % 6)}" for n in range(50)]
        box.publish(
            [Message(b"<o/>", promoted={"o.N": n, "o.Id": o}) for n, o in enumerate(ids)]
            + [Message(b"<o/>", promoted={"o.N": n, "o.Id": "Z1"}) for n in (50, 51, 52)]
        )
        wait_for(lambda: box.count_suspended() == 53, "53 delivery failures")
        healthy.set()
        with serving(box, TOKEN) as base:
            # (logged in with the console token: the operator's service account)
            browser.get(f"{base}/login")
            form = browser.find_element(By.ID, "login-token")
            form.find_element(By.NAME, "token").send_keys(TOKEN)
            form.find_element(By.TAG_NAME, "button").click()
            assert browser.find_element(By.ID, "who").text == "token:admin (admin)"
            # When the operator opens the failure groups: the 50 are one group, the
            # other failure another
            browser.get(f"{base}/failures")
            rows = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
            assert [r.find_element(By.CSS_SELECTOR, "td.num").text for r in rows] == ["50", "3"]
            assert "unsupported currency <value> for order <id>" in rows[0].text
            assert "e.g. ValueError: unsupported currency 'JPY' for order" in rows[0].text
            assert "in price" in rows[0].text
            # and opens the group
            rows[0].find_element(By.CSS_SELECTOR, "a.group-link").click()
            assert browser.find_element(By.ID, "group-count").text == "50"
            listed = browser.find_elements(By.CSS_SELECTOR, "#suspended tbody tr")
            assert len(listed) == 50
            assert "price" in browser.find_element(By.ID, "where").text
            screenshot(browser, "failure-group")
            # and resumes it: one confirmation for the whole group
            bulk = browser.find_element(By.ID, "bulk-group")
            bulk.find_element(By.CSS_SELECTOR, "button.resume").click()
            assert "50 entries" in browser.find_element(By.ID, "confirm-count").text
            browser.find_element(By.ID, "confirm").find_element(By.TAG_NAME, "button").click()
            # Then the group page says so, and has nothing left
            assert browser.find_element(By.ID, "notice").text == "50 entries resumed."
            assert browser.find_element(By.ID, "no-entries").text == (
                "No suspended entry is left in this group."
            )
            wait_for(lambda: len(delivered) == 50, "the 50 deliveries after resume")
            assert sorted(delivered) == list(range(50))
            assert box.count_suspended() == 3
    finally:
        inst.stop(5.0)
        box.close()


class Order(BaseModel):
    total: float = 0


class Fulfilment(Orchestration[Order]):
    """An order waits for its payment (which never comes here)."""

    correlation = ("orders.OrderId",)

    @activate(P("orders.Kind") == "order")
    def order(self, msg: Delivery) -> None:
        self.state.total = float(msg.properties["orders.Total"])  # type: ignore[arg-type]
        self.wait_for("payment", timeout=3600)

    @receive(P("orders.Kind") == "payment")
    def payment(self, msg: Delivery) -> None:
        self.complete()

    @timeout("payment")
    def unpaid(self) -> None:
        self.complete()


def test_an_operator_finds_an_orchestration_instance_by_its_order_id_and_terminates_it(
    tmp_path: Path, browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    box = MessageBox(url)
    box.configure_tracking(True)
    app = HostApp("orders", **{k: v for k, v in FAST.items() if k != "max_attempts"})
    app.orchestration(Fulfilment)
    inst = app.instance(url).start()
    try:
        # Given two orders, each waiting for its payment
        box.publish(
            [
                Message(b"<order/>", promoted={"orders.Kind": "order", "orders.OrderId": o,
                                               "orders.Total": total})
                for o, total in (("A123", 100.0), ("B7", 5.0))
            ]
        )  # fmt: skip
        wait_for(lambda: [len(i.timers) for i in box.service_instances()] == [1, 1], "both orders")
        [a123] = box.find_instances({"orders.OrderId": "A123"})
        with serving(box, TOKEN) as base:
            # When the operator searches the instances for order A123
            browser.get(f"{base}/instances")
            search = browser.find_element(By.ID, "find-instance")
            search.find_element(By.NAME, "q").send_keys("orders.OrderId=A123")
            search.find_element(By.TAG_NAME, "button").click()
            # Then only its instance is listed, with its order id
            row = browser.find_element(By.ID, f"instance-{a123.id}")
            assert 'orders.OrderId="A123"' in row.text
            assert len(browser.find_elements(By.CSS_SELECTOR, "#service-instances tbody tr")) == 1
            # When the operator opens it
            row.find_element(By.TAG_NAME, "a").click()
            # Then its page shows its correlation value, saved state, handled order, timer
            assert browser.find_element(By.ID, "correlation").text == 'orders.OrderId="A123"'
            assert '"total": 100.0' in browser.find_element(By.ID, "state").text
            [step] = browser.find_elements(By.CSS_SELECTOR, "#steps tbody tr")
            assert "handled" in step.text
            assert "payment" in browser.find_element(By.ID, "timers").text
            screenshot(browser, "instance")
            # When the operator terminates it, with the token, and confirms
            form = browser.find_element(By.ID, "terminate")
            form.find_element(By.NAME, "token").send_keys(TOKEN)
            form.find_element(By.CSS_SELECTOR, "button.terminate").click()
            confirm = browser.find_element(By.ID, "confirm")
            assert "1 timer cancelled" in browser.find_element(By.ID, "confirm-terminate").text
            confirm.find_element(By.NAME, "token").send_keys(TOKEN)
            confirm.find_element(By.TAG_NAME, "button").click()
            # Then it is terminated, and B7 goes on
            assert browser.find_element(By.ID, "notice").text == "Instance terminated."
            assert browser.find_element(By.ID, "instance-state").text.startswith("terminated")
            [b7] = box.find_instances({"orders.OrderId": "B7"})
            assert b7.state == "running"
            assert [a.action for a in box.audit_log()] == ["orchestrations terminate"]
    finally:
        inst.stop(5.0)
        box.close()


def test_an_operator_searches_by_a_range_and_sees_each_state(
    tmp_path: Path, browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    box = MessageBox(f"duckdb:///{tmp_path / 'box.duckdb'}")
    box.configure_tracking(True)
    box.create_host("billing", **FAST)
    box.create_host("audit")  # no instance runs: its entries stay queued
    box.subscribe("bill", host="billing", filter=P("orders.Total") >= 0, name="bill-all")
    box.subscribe("audit", host="audit", filter=P("orders.Region") == "US", name="audit-us")

    def bill(delivery: Delivery) -> None:
        if delivery.properties["orders.Total"] == 9400:
            raise RuntimeError("the ledger refused an order above its limit")

    inst = HostInstance(box, "billing", {"bill": bill}).start()
    try:
        # Given six orders, published one after another, billed (one refused), the
        # billed ones deleted by cleanup (tracking keeps their properties)
        ids: dict[str, str] = {}
        for order, total, region in [
            ("A1", 1200, "EU"),
            ("A2", 5600, "EU"),
            ("A3", 7200, "US"),
            ("A4", 9400, "EU"),
            ("A5", 12000, "EU"),
            ("A6", 6100, "EU"),
        ]:
            promoted = {"orders.OrderId": order, "orders.Total": total, "orders.Region": region}
            [routed] = box.publish([Message(b"<order/>", promoted=promoted)])
            ids[order] = str(routed.message_id)
        wait_for(lambda: not box.queue_depth("billing"), "the bills")
        wait_for(lambda: box.count_suspended() == 1, "the refused bill")
        assert box.cleanup().tracked_messages == 4  # A1, A2, A5, A6
        with serving(box, TOKEN) as base:
            # When the operator searches the last hour for totals from 5,000 to 10,000,
            # three at a time
            browser.get(f"{base}/search")
            form = browser.find_element(By.ID, "search")
            form.find_element(By.NAME, "q").send_keys(
                "orders.Total >= 5000 and orders.Total < 10000"
            )
            since = form.find_element(By.NAME, "since")
            since.clear()
            since.send_keys("1h")
            form.find_element(By.NAME, "limit").send_keys("3")
            form.find_element(By.TAG_NAME, "button").click()
            # Then the newest three come, each with its state
            rows = browser.find_elements(By.CSS_SELECTOR, "#found tbody tr")
            found = [r.get_attribute("id") for r in rows]
            assert found == [f"found-{ids[o]}" for o in ("A6", "A4", "A3")]
            states = [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows]
            assert states[0].startswith("deleted")
            assert states[1:] == ["suspended", "queued"]
            assert "orders.Total=9400" in rows[1].text
            screenshot(browser, "search")
            # When the operator asks for the older ones
            browser.find_element(By.ID, "more").click()
            rows = browser.find_elements(By.CSS_SELECTOR, "#found tbody tr")
            assert [r.get_attribute("id") for r in rows] == [f"found-{ids['A2']}"]
            searched = browser.find_element(By.ID, "searched").text
            assert searched.startswith("Searched the 2 remaining messages published since")
            # and a deleted one links to its tracked history
            rows[0].find_element(By.TAG_NAME, "a").click()
            assert "published" in browser.find_element(By.TAG_NAME, "main").text
            # When the operator mistypes the range, the page says what is wrong
            browser.get(f"{base}/search")
            form = browser.find_element(By.ID, "search")
            form.find_element(By.NAME, "q").send_keys("orders.Total >= 5000 and < 10000")
            form.find_element(By.TAG_NAME, "button").click()
            error = browser.find_element(By.ID, "search-error").text
            assert error.startswith("400 filter text, column 26: expected a property name")
    finally:
        inst.stop(5.0)
        box.close()


# --- `messagebox console` as a command ---


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.Popen(
        [sys.executable, "-m", "messagebox.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def suspended_store(path: Path) -> tuple[str, int]:
    """A DuckDB store with one resumable suspended entry; its URL and the entry's id."""
    url = f"duckdb:///{path}"
    with MessageBox(url) as box:
        box.create_host("shipping")
        box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU")
        box.publish([Message(b"<order/>", promoted={"orders.Region": "EU"})])
        box.set_service_state("ship", "unenlisted")  # suspends it, resumable
        box.set_service_state("ship", "started")
        [entry] = box.suspended()
    return url, entry.id


@pytest.mark.parametrize("source", ["token-file", "environment"])
def test_the_console_command_serves_pages_and_takes_its_token(tmp_path: Path, source: str) -> None:
    url, entry_id = suspended_store(tmp_path / "box.duckdb")
    port = free_port()
    args = ["--url", url, "console", "--port", str(port)]
    env = None
    if source == "token-file":
        token_file = tmp_path / "token"
        token_file.write_text(f"{TOKEN}\n")
        args += ["--token-file", str(token_file)]
    else:
        env = {TOKEN_ENV: TOKEN}
    proc = cli(*args, env=env)
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:
                return httpx.get(f"{base}/", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, "messagebox console to serve", timeout=60)
        assert "<td>shipping</td>" in httpx.get(f"{base}/", timeout=30).text
        action = f"{base}/suspended/{entry_id}/resume"
        wrong = httpx.post(action, headers={"Authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 403
        done = httpx.post(action, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert done.status_code == 303
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (
        f"console at http://127.0.0.1:{port}/ — resume, terminate and message contents "
        "need the token" in err
    )
    with MessageBox(url) as box:
        assert box.suspended() == []
        assert sum(q.depth for q in box.queue_stats()) == 1


def test_the_console_command_is_read_only_without_a_token(tmp_path: Path) -> None:
    url, entry_id = suspended_store(tmp_path / "box.duckdb")
    port = free_port()
    proc = cli("--url", url, "console", "--bind", "127.0.0.1", "--port", str(port))
    try:
        action = f"http://127.0.0.1:{port}/suspended/{entry_id}/terminate"

        def answered() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            except httpx.TransportError:
                return False
            return True

        wait_for(answered, "messagebox console to serve", timeout=60)
        refused = httpx.post(action, data={"token": TOKEN}, timeout=30)
        assert refused.status_code == 403
        assert "actions are disabled" in refused.text
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert "read-only (set MESSAGEBOX_CONSOLE_TOKEN or --token-file" in err
    with MessageBox(url) as box:
        assert [e.id for e in box.suspended()] == [entry_id]


def test_the_console_command_answers_only_to_its_hosts(tmp_path: Path) -> None:
    # Given the console command behind a proxy named console.example.com
    url, _entry_id = suspended_store(tmp_path / "box.duckdb")
    with MessageBox(url) as box:
        [entry] = box.suspended()
    port = free_port()
    args = ["--url", url, "console", "--port", str(port), "--allowed-host", "console.example.com"]
    proc = cli(*args, env={TOKEN_ENV: TOKEN})
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:
                return httpx.get(f"{base}/", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, "messagebox console to serve", timeout=60)
        message = f"{base}/messages/{entry.message_id}"
        # When the proxy's name asks, the console answers; the parts need the token
        proxied = {"Host": "console.example.com"}
        assert httpx.get(f"{base}/", headers=proxied, timeout=30).status_code == 200
        assert "&lt;order/&gt;" not in httpx.get(message, headers=proxied, timeout=30).text
        bearer = {**proxied, "Authorization": f"Bearer {TOKEN}"}
        assert "&lt;order/&gt;" in httpx.get(message, headers=bearer, timeout=30).text
        # but a rebinding page's name is refused, token or not
        forged = {"Host": "rebind.evil.example", "Authorization": f"Bearer {TOKEN}"}
        answer = httpx.get(message, headers=forged, timeout=30)
        assert answer.status_code == 400
        assert "the host 'rebind.evil.example' is not one this console answers to" in answer.text
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"refused GET /messages/{entry.message_id} from 127.0.0.1" in err


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (
            ["--allowed-host", "http://console.example.com/"],
            2,
            "--allowed-host: 'http://console.example.com/' is not a host name",
        ),
        (["--token-file", "{empty}"], 2, "--token-file: '{empty}' is empty"),
        (["--token-file", "{missing}"], 2, "--token-file: cannot read '{missing}'"),
        (["--token", "x"], 2, "unrecognized arguments: --token"),
        ([], 1, "`messagebox init` creates it"),
    ],
)
def test_the_console_command_refuses_bad_tokens_and_missing_stores(
    tmp_path: Path, args: list[str], code: int, says: str
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    names = {"empty": str(empty), "missing": str(tmp_path / "missing")}
    url = f"duckdb:///{tmp_path / 'none.duckdb'}"
    proc = cli("--url", url, "console", *[a.format(**names) for a in args])
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert says.format(**names) in err
    assert not (tmp_path / "none.duckdb").exists()
