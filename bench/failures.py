"""What grouping suspended entries by failure costs: ``box.failure_groups()`` over a
store of N suspended entries (100,000 by default, what the console's failures page
scans), and its two halves, reading the entries and grouping them.

What it measures
    For each backend (DuckDB, PostgreSQL) it creates a fresh store (a temporary DuckDB
    file, or a fresh PostgreSQL schema dropped afterwards) with one host and one
    subscription, and writes N suspended delivery failures straight into the suspended
    table, 10,000 rows a statement. Their errors are tracebacks as a host instance stores
    them (``traceback.format_exception``: the dispatching frame, then the service's, a
    third party's and the standard library's), raised in 10 places (4 exception types,
    under 3 service functions; one place at 3 line numbers, which is one place), each
    message carrying its own order id, amount and UUID, about 1.2 KB each: 10 groups.
    Then it times, ``--rounds`` times (median shown): ``failure_groups()``, the read
    alone (``operations.failure_rows``) and the grouping alone (``failures.groups`` over
    rows read beforehand).

Run it from the project root::

    python -m bench.failures                     # 100,000 entries, both backends
    python -m bench.failures --entries 20000 --quick
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from bench.orchestrate import positive
from bench.tracking import PG_URL, pg_reachable, store
from messagebox import MessageBox
from messagebox.ops import failures
from messagebox.predicates import P
from messagebox.storage import schema

DISPATCH = (
    '  File "{root}/.venv/lib/python3.11/site-packages/messagebox/hosts/handling.py", '
    "line 316, in _deliver\n    service(d)\n"
)
SITES: list[tuple[str, list[str]]] = [
    # (exception line with {order} {amount} {uuid}, the frames under the dispatch)
    (
        "ValueError: unsupported currency 'JPY' for order {order}",
        [
            '  File "{root}/shop/services.py", line 42, in ship\n'
            "    total = pricing.total(order)\n            ^^^^^^^^^^^^^^^^^^^^\n",
            '  File "{root}/shop/pricing.py", line {n}, in total\n'
            '    raise ValueError(f"unsupported currency {{c!r}} for order {{o}}")\n',
        ],
    ),
    (
        "TimeoutError: no answer for order {order} after {amount} s ({uuid})",
        [
            '  File "{root}/shop/services.py", line 48, in {function}\n    carrier.book(order)\n',
            '  File "{root}/shop/carrier.py", line {n}, in book\n'
            "    response = httpx.post(URL, json=order.json(), timeout=30)\n"
            "               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
            '  File "{root}/.venv/lib/python3.11/site-packages/httpx/_api.py", line 319, '
            "in post\n    return request(\n           ^^^^^^^^\n",
            '  File "/usr/lib/python3.11/socket.py", line 706, in readinto\n'
            "    return self._sock.recv_into(b)\n",
        ],
    ),
    (
        "KeyError: 'tax table has no entry for APAC'",
        [
            '  File "{root}/shop/services.py", line 61, in {function}\n'
            "    tax = taxes.rate(order.region)\n",
            '  File "{root}/shop/taxes.py", line {n}, in rate\n    return TABLE[region]\n'
            "           ~~~~~^^^^^^^^\n",
        ],
    ),
    (
        "RuntimeError: order {order} of {amount} EUR needs an approval",
        [
            '  File "{root}/shop/services.py", line {n}, in {function}\n'
            '    raise RuntimeError(f"order {{o}} of {{t}} EUR needs an approval")\n',
        ],
    ),
]
FUNCTIONS = ("ship", "bill", "notify")


def traceback_text(site: int, function: int, rng: random.Random) -> str:
    """One stored error: a traceback of ``site`` raised under service ``function``."""
    line, frames = SITES[site]
    root = "/srv/app"
    body = DISPATCH.format(root=root) + "".join(
        f.format(root=root, n=17 + function, function=FUNCTIONS[function]) for f in frames
    )
    text = line.format(
        order=f"{rng.choice('ABCDEFGH')}{rng.randrange(10**6):06d}",
        amount=f"{rng.uniform(1, 100):.1f}",
        uuid=uuid.UUID(int=rng.getrandbits(128)),
    )
    return f"Traceback (most recent call last):\n{body}{text}\n"


def fill(box: MessageBox, entries: int) -> None:
    """``entries`` suspended delivery failures of the subscription ``ship``."""
    rng = random.Random(58)
    sub = box.subscription("ship").id
    now = datetime.now(UTC)
    for start in range(0, entries, 10_000):
        ids = range(start + 1, min(entries, start + 10_000) + 1)
        n = len(ids)
        errors = [traceback_text(i % len(SITES), i % len(FUNCTIONS), rng) for i in ids]
        with box.store.transaction() as conn:
            box.store.dialect.insert(
                conn,
                schema.suspended,
                {
                    "id": list(ids),
                    "msg": [uuid.UUID(int=rng.getrandbits(128)) for _ in ids],
                    "sub": [sub] * n,
                    "host": ["shop"] * n,
                    "resumable": [True] * n,
                    "reason": ["delivery-failure"] * n,
                    "error": errors,
                    "report": [None] * n,
                    "attempts": [5] * n,
                    "suspended_at": [now] * n,
                    "priority": [0] * n,
                    "ordered": [False] * n,
                    "instance_id": [None] * n,
                    "enqueued_at": [now] * n,
                },
            )


def seconds(work: Callable[[], object], rounds: int) -> float:
    """The median time of ``rounds`` runs of ``work``."""
    found = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        found.append(time.perf_counter() - started)
    return statistics.median(found)


def run(backend: str, entries: int, rounds: int) -> list[str]:
    with store(backend) as url, MessageBox(url) as box:
        box.create_host("shop")
        box.subscribe("ship", host="shop", filter=P("o.Id").exists())
        fill(box, entries)
        rows = box.operations.failure_rows(entries)
        count = len(box.failure_groups(entries))
        whole = seconds(lambda: box.failure_groups(entries), rounds)
        read = seconds(lambda: box.operations.failure_rows(entries), rounds)
        grouping = seconds(lambda: failures.groups(rows), rounds)
    row = [backend, f"{entries:,}", str(count), f"{whole:.2f}", f"{read:.2f}", f"{grouping:.2f}"]
    print("  ".join(row), flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failures", description=__doc__)
    parser.add_argument("--entries", type=positive, default=100_000, help="default 100,000")
    parser.add_argument("--rounds", type=positive, default=3, help="timed runs (default 3)")
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    backends = ["duckdb"] + (["postgresql"] if pg_reachable() else [])
    if "postgresql" not in backends:
        print(f"(PostgreSQL unreachable at {PG_URL}: skipped)")
    head = ["backend", "entries", "groups", "failure_groups s", "read s", "grouping s"]
    print("  ".join(head))
    table = [run(backend, args.entries, rounds) for backend in backends]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    print()
    for row in [head, *table]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
