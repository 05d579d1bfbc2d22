"""Publishing in the caller's transaction against a publish of its own, same run.

What it measures
    For each backend and batch size, the same messages published three ways in turn,
    alternating within each round so that drift hits them alike: ``own`` — ``publish``
    in a transaction of its own (the baseline); ``joined`` — the application's
    transaction begun, ``publish(connection=conn)``, its commit (PostgreSQL: a
    SQLAlchemy connection of the application's engine; DuckDB: ``box.transaction()``);
    and on PostgreSQL ``psycopg``, the same with a psycopg 3 connection. Nothing else is
    in the application's transaction: the ratio is what joining costs. The figure is
    messages per second (median of the rounds); the target is a ratio of at least 0.9.

Run it from the project root::

    python -m bench.joined            # 2,000 messages a way and batch, 5 rounds
    python -m bench.joined --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import psycopg
import sqlalchemy as sa

from bench.orchestrate import positive
from bench.tracking import pg_reachable, store
from messagebox import Message, MessageBox
from messagebox.predicates import P

TARGET = 0.9


def _messages(start: int, batch: int) -> list[Message]:
    return [Message(b"<m/>", promoted={"t.K": (start + j) % 10}) for j in range(batch)]


def _ways(box: MessageBox, url: str) -> dict[str, Callable[[int, int], None]]:
    """Each way of publishing a batch (and writing one row) by name."""
    pg = url.startswith("postgresql")
    engine = sa.create_engine(url) if pg else None

    def own(n: int, batch: int) -> None:
        box.publish(_messages(n, batch))

    def joined(n: int, batch: int) -> None:
        with box.transaction() if engine is None else engine.begin() as conn:
            box.publish(_messages(n, batch), connection=conn)

    ways: dict[str, Callable[[int, int], None]] = {"own": own, "joined": joined}
    if pg:
        raw = psycopg.connect(
            sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )

        def lent(n: int, batch: int) -> None:
            with raw.transaction():
                box.publish(_messages(n, batch), connection=raw)

        ways["psycopg"] = lent
    return ways


def run(backend: str, batch: int, n: int, rounds: int) -> list[str]:
    rates: dict[str, list[float]] = {}
    with store(backend) as url, MessageBox(url) as box:
        box.create_host("h")
        for k in range(10):
            box.subscribe(f"s{k}", host="h", filter=P("t.K") == k)
        ways = _ways(box, url)
        counter = 0
        for way in ways.values():  # a warm-up of each
            way(counter, batch)
            counter += 1
        for _ in range(rounds):
            for name, way in ways.items():
                started = time.perf_counter()
                for _ in range(n // batch):
                    way(counter, batch)
                    counter += 1
                rates.setdefault(name, []).append(n / (time.perf_counter() - started))
    own = statistics.median(rates["own"])
    cells = [backend, str(batch)]
    for name in ("own", "joined", "psycopg"):
        if name in rates:
            mine = statistics.median(rates[name])
            cells.append(f"{mine:,.0f}" + ("" if name == "own" else f" ({mine / own:.2f})"))
        else:
            cells.append("-")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--messages", type=positive, default=2000)
    parser.add_argument("--rounds", type=positive, default=5)
    args = parser.parse_args()
    n, rounds = (200, 1) if args.quick else (args.messages, args.rounds)
    backends = ["duckdb"] + (["postgresql"] if pg_reachable() else [])
    header = ["backend", "batch", "own msgs/s", "joined (ratio)", "psycopg (ratio)"]
    rows = [run(b, batch, n, rounds) for b in backends for batch in (1, 100)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print(f"target: joined at least {TARGET} of own (the same messages)")


if __name__ == "__main__":
    main()
