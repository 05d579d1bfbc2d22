"""The HTTP front door under a real load generator: a receive location against a raw
endpoint on the same server stack writing the same rows, same run.

What it measures
    ApacheBench (``ab``) POSTs ``--requests`` small XML orders with ``--concurrency``
    clients at once (a new connection per request, as ``ab`` does without ``-k``) to:

    - ``messagebox``: a host instance in this process with an HTTP receive location
      (``XmlReceive`` promoting three properties) and one subscription whose service
      does nothing; each ``202`` answer means the order was published (committed);
    - ``raw``: the same server stack (``http.server.ThreadingHTTPServer``, the same
      listen backlog) whose handler parses the order with ElementTree and, in a
      transaction of its own per request, writes what a publish writes at the least:
      a spool row, a part and one queue entry (psycopg 3 with a connection per thread;
      DuckDB: one connection, a cursor per thread).

    The figures are requests per second, and each request's time as ``ab`` saw it
    (p50, p99, the longest). The targets: messagebox >= 0.5 of raw's requests/s, p99
    <= 100 ms, no request over 1 s. Every run checks that every request was answered
    2xx and, for messagebox, that every order was delivered.

Run it from the project root (``ab``: ``apt-get install apache2-utils``)::

    python -m bench.http_receive                  # 5,000 requests, 50 clients, 3 rounds
    python -m bench.http_receive --quick          # 1,000 requests, 1 round
    python -m bench.http_receive --concurrency 20 --backends postgresql
"""

from __future__ import annotations

import argparse
import itertools
import queue
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from bench.orchestrate import positive
from bench.tracking import pg_reachable
from messagebox import MessageBox
from messagebox.adapters.http import _Server
from messagebox.hosts import Delivery, HostApp
from messagebox.pipelines import Field, PropertySchema, XmlReceive
from messagebox.predicates import P

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
NS = "urn:orders"
ORDER = (
    f'<?xml version="1.0" encoding="utf-8"?>\n<Order xmlns="{NS}"><Id>42</Id>'
    "<Region>EU</Region><Total>10.00</Total></Order>\n"
).encode()
PROPS = PropertySchema(
    f"{NS}#Order",
    {
        "orders.Id": Field("/o:Order/o:Id", int),
        "orders.Region": "/o:Order/o:Region",
        "orders.Total": Field("/o:Order/o:Total", float),
    },
    namespaces={"o": NS},
)
TARGET_RATIO = 0.5
TARGET_P99_MS = 100.0
TARGET_MAX_MS = 1000.0


@dataclass(frozen=True)
class Run:
    """What ``ab`` reported for one run."""

    rps: float
    p50: float
    p99: float
    longest: float
    failed: int


def ab(url: str, body: Path, requests: int, concurrency: int) -> Run:
    """Run ApacheBench against ``url``; its requests/s and percentiles (ms)."""
    out = subprocess.run(
        [
            *("ab", "-q", "-r", "-n", str(requests), "-c", str(concurrency), "-s", "60"),
            *("-p", str(body), "-T", "application/xml", url),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    text = out.stdout
    if out.returncode != 0 or "Requests per second" not in text:
        raise RuntimeError(f"ab failed ({out.returncode}): {out.stderr.strip() or text[-500:]}")

    def number(pattern: str) -> float:
        found = re.search(pattern, text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    failed = int(number(r"^Failed requests:\s+(\d+)") + number(r"^Non-2xx responses:\s+(\d+)"))
    return Run(
        rps=number(r"^Requests per second:\s+([\d.]+)"),
        p50=number(r"^\s+50%\s+(\d+)"),
        p99=number(r"^\s+99%\s+(\d+)"),
        longest=number(r"^\s+100%\s+(\d+)"),
        failed=failed,
    )


# --- the raw endpoint ---


def _parse(body: bytes) -> dict[str, Any]:
    root = ET.fromstring(body)
    ns = {"o": NS}
    return {
        "orders.Id": int(root.findtext("o:Id", namespaces=ns) or 0),
        "orders.Region": root.findtext("o:Region", namespaces=ns),
        "orders.Total": float(root.findtext("o:Total", namespaces=ns) or 0),
    }


_RAW_TABLES = (
    "CREATE TABLE raw_spool (id UUID PRIMARY KEY, context TEXT NOT NULL, "
    "published_at TIMESTAMP WITH TIME ZONE NOT NULL)",
    "CREATE TABLE raw_part (msg UUID PRIMARY KEY, data {blob} NOT NULL)",
    "CREATE TABLE raw_queue (id BIGINT PRIMARY KEY, msg UUID NOT NULL, sub BIGINT NOT NULL, "
    "host TEXT NOT NULL, enqueued_at TIMESTAMP WITH TIME ZONE NOT NULL)",
)
_INSERTS = (
    "INSERT INTO raw_spool VALUES ({p}, {p}, {p})",
    "INSERT INTO raw_part VALUES ({p}, {p})",
    "INSERT INTO raw_queue VALUES ({p}, {p}, 1, 'h', {p})",
)


class _RawHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    write: Callable[[bytes], None]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.write(body)
        data = b'{"ok": true}'
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _row(body: bytes, ids: Iterator[int]) -> tuple[uuid.UUID, str, datetime, int]:
    return uuid.uuid4(), repr(_parse(body)), datetime.now(UTC), next(ids)


def _pg_writer(schema: str) -> Callable[[bytes], None]:
    """Writes with connections taken from a pool (the server runs a thread a request):
    made as needed, at most one a request in flight, kept for the next requests."""
    pool: queue.SimpleQueue[psycopg.Connection[Any]] = queue.SimpleQueue()
    ids = itertools.count(1)

    def write(body: bytes) -> None:
        try:
            conn = pool.get_nowait()
        except queue.Empty:
            conn = psycopg.connect(PG_DSN, options=f"-csearch_path={schema}")
        try:
            msg, context, now, qid = _row(body, ids)
            with conn.transaction():
                conn.execute(_INSERTS[0].format(p="%s"), (msg, context, now), prepare=True)
                conn.execute(_INSERTS[1].format(p="%s"), (msg, body), prepare=True)
                conn.execute(_INSERTS[2].format(p="%s"), (qid, msg, now), prepare=True)
        finally:
            pool.put(conn)

    return write


def _duckdb_writer(path: str) -> Callable[[bytes], None]:
    db = duckdb.connect(path)
    for ddl in _RAW_TABLES:
        db.execute(ddl.format(blob="BLOB"))
    ids = itertools.count(1)

    def write(body: bytes) -> None:
        cur = db.cursor()  # the server runs a thread a request
        msg, context, now, qid = _row(body, ids)
        cur.execute("BEGIN")
        cur.execute(_INSERTS[0].format(p="?"), (msg, context, now))
        cur.execute(_INSERTS[1].format(p="?"), (msg, body))
        cur.execute(_INSERTS[2].format(p="?"), (qid, msg, now))
        cur.execute("COMMIT")
        cur.close()

    return write


@contextmanager
def raw_endpoint(write: Callable[[bytes], None]) -> Iterator[str]:
    handler = type("Raw", (_RawHandler,), {"write": staticmethod(write)})
    server = _Server(("127.0.0.1", 0))
    server.RequestHandlerClass = handler
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/orders"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# --- messagebox ---


@contextmanager
def messagebox_endpoint(url: str) -> Iterator[tuple[str, Callable[[int], None]]]:
    """A host instance with the receive location: its address, and a wait for a number
    of orders to be delivered (raising if they are not within a minute)."""
    handled = itertools.count()
    seen = [0]

    def sink(_d: Delivery) -> None:
        seen[0] = next(handled) + 1

    def delivered(expected: int) -> None:
        deadline = time.monotonic() + 60
        while seen[0] < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        if seen[0] != expected:
            raise RuntimeError(f"messagebox delivered {seen[0]} of {expected} answered orders")

    app = HostApp("web", cleanup_interval_seconds=0)
    app.add_service("sink", sink)
    app.subscribe("sink", filter=P("orders.Id") >= 0, name="orders")
    app.receive_port("web").location(
        "orders", "http://127.0.0.1:0/orders", pipeline=XmlReceive([PROPS])
    )
    with MessageBox(url) as box:
        app.setup(box)
    instance = app.instance(url)
    instance.start()
    try:
        yield instance.receivers[0].adapter.address, delivered  # type: ignore[attr-defined]
    finally:
        instance.stop(10)


# --- the runs ---


@contextmanager
def _stores(backend: str) -> Iterator[tuple[str, Callable[[], Callable[[bytes], None]]]]:
    """A fresh messagebox URL and a maker of raw writers, dropped afterwards."""
    if backend == "duckdb":
        tmp = tempfile.mkdtemp(prefix="bench-http-")
        try:
            yield (
                f"duckdb:///{tmp}/mb.duckdb",
                lambda: _duckdb_writer(f"{tmp}/raw-{uuid.uuid4().hex}.duckdb"),
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    schemas: list[str] = []

    def schema() -> str:
        name = f"bench_http_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        schemas.append(name)
        return name

    def raw() -> Callable[[bytes], None]:
        name = schema()
        with psycopg.connect(PG_DSN, autocommit=True, options=f"-csearch_path={name}") as c:
            for ddl in _RAW_TABLES:
                c.execute(ddl.format(blob="BYTEA"))
        return _pg_writer(name)

    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema()}", raw
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for name in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def one_round(backend: str, body: Path, requests: int, concurrency: int) -> dict[str, Run]:
    """Raw, then messagebox, each on a fresh store."""
    with _stores(backend) as (url, raw):
        with raw_endpoint(raw()) as address:
            raw_run = ab(address, body, requests, concurrency)
        with messagebox_endpoint(url) as (address, delivered):
            mb_run = ab(address, body, requests, concurrency)
            delivered(requests - mb_run.failed)  # every order answered 2xx
    return {"raw": raw_run, "messagebox": mb_run}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=positive, default=5_000)
    ap.add_argument("--concurrency", type=positive, default=50)
    ap.add_argument("--runs", type=positive, default=3)
    ap.add_argument("--backends", default="postgresql,duckdb")
    ap.add_argument("--quick", action="store_true", help="1,000 requests, 1 round")
    args = ap.parse_args(argv)
    if shutil.which("ab") is None:
        print("(bench.http_receive skipped: it needs ApacheBench, apt-get install apache2-utils)")
        return
    requests, runs = (1_000, 1) if args.quick else (args.requests, args.runs)
    backends = [b for b in args.backends.split(",") if b != "postgresql" or pg_reachable()]
    with tempfile.NamedTemporaryFile(suffix=".xml") as f:
        f.write(ORDER)
        f.flush()
        results = {
            b: [one_round(b, Path(f.name), requests, args.concurrency) for _ in range(runs)]
            for b in backends
        }
    print(
        f"\n{requests:,} POSTs of a {len(ORDER)}-byte XML order, {args.concurrency} clients "
        f"at once (ab, a connection a request); the median of {runs} round(s)"
    )
    print(
        f"{'backend':<12}{'system':<12}{'req/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
        f"{'failed':>8}{'ratio':>7}  targets"
    )
    for backend, rounds in results.items():
        for system in ("raw", "messagebox"):
            med = {
                k: statistics.median(getattr(r[system], k) for r in rounds)
                for k in ("rps", "p50", "p99", "longest")
            }
            ratio = med["rps"] / statistics.median(r["raw"].rps for r in rounds)
            failed = sum(r[system].failed for r in rounds)
            verdict = ""
            if system == "messagebox":
                verdict = (
                    f">= {TARGET_RATIO} of raw {'ok' if ratio >= TARGET_RATIO else 'MISS'}; "
                    f"p99 <= {TARGET_P99_MS:.0f} ms "
                    f"{'ok' if med['p99'] <= TARGET_P99_MS else 'MISS'}; max < 1 s "
                    f"{'ok' if max(r[system].longest for r in rounds) < TARGET_MAX_MS else 'MISS'}"
                )
            print(
                f"{backend:<12}{system:<12}{med['rps']:>9,.0f}{med['p50']:>8.0f}"
                f"{med['p99']:>8.0f}{med['longest']:>8.0f}{failed:>8}{ratio:>7.2f}  {verdict}"
            )
        if len(rounds) > 1:
            for system in ("raw", "messagebox"):
                cells = " / ".join(f"{r[system].rps:,.0f}" for r in rounds)
                print(f"{'':<12}{system:<12} rounds (req/s): {cells}")


if __name__ == "__main__":
    main()
