"""The main job: a day of orders routed by content, from an inbound folder to send ports.

``make demo`` runs it on DuckDB with no set-up. It

1. declares the integration in Python (:mod:`routing`: a host, a receive port with XML,
   JSON and payment locations, ten send ports, a send port group, and the order
   fulfilment orchestration of :mod:`fulfilment`);
2. starts a host instance (the receive locations, the send ports and the orchestration
   run in it);
3. drops the payment gateway's captures of the web shop's orders (some in two parts,
   some only in part, some never) into the payments folder, then, once they are in, a
   day of generated orders (thousands; single XML orders, XML batches, JSON arrays from
   the web shop, and a few bad files) into the inbound folder;
4. shows progress while the orders are received, routed and written to the outbound
   folders, and while each web order is shipped and confirmed, or cancelled when the
   rest of its payment does not come in time;
5. checks every outbound folder against the reference evaluator's prediction (and the
   fulfilment against the generated payments) and ends with a summary table: routed
   per port, suspended, throughput.

    python examples/orders/demo.py [URL] [--orders N] [--workdir DIR] [--keep] [--no-fsync]

It works in ``--workdir DIR`` (kept), else in a new folder of the system's temporary
folder (``$TMPDIR``, else ``/tmp``), named on its first lines and removed at the end,
unless the run fails or ``--keep`` is given: a day of orders leaves about 60 MB there.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import routing

from messagebox import MessageBox
from messagebox.hosts import HostApp
from messagebox.hosts.ports import port_filter

REGIONS = ["EU", "US", "APAC", "LATAM"]
CUSTOMERS = ["Contoso", "Fabrikam", "Northwind", "Tailspin", "Woodgrove", "Litware"]


@dataclass
class Day:
    """The files of a generated day and what routing them should do."""

    files: list[tuple[str, bytes]] = field(default_factory=list)
    orders: list[dict[str, object]] = field(default_factory=list)
    bad_files: int = 0
    web_orders: list[str] = field(default_factory=list)
    """Orders from the web shop (the JSON files): each starts a fulfilment."""
    payment_files: list[tuple[str, bytes]] = field(default_factory=list)
    unpaid: set[str] = field(default_factory=set)
    """Web orders never paid in full (no payment, or a part only): the fulfilment
    cancels them on its timeout."""


def _order(rng: random.Random, n: int, when: datetime) -> dict[str, object]:
    order: dict[str, object] = {
        "id": f"SO-{n:06d}",
        "region": rng.choices(REGIONS, weights=[4, 4, 2, 1])[0],
        "total": round(rng.lognormvariate(7.5, 1.3), 2),
        "priority": rng.randint(1, 9),
        "orderedAt": when.isoformat(),
        "customer": rng.choice(CUSTOMERS),
    }
    if rng.random() < 0.05:
        order["rush"] = True
    return order


def _xml(order: dict[str, object], *, root: bool = True) -> str:
    rush = ' rush="true"' if order.get("rush") else ""
    xmlns = ' xmlns="urn:orders"' if root else ""
    return (
        f"<Order{xmlns}{rush}><Id>{order['id']}</Id><Region>{order['region']}</Region>"
        f"<Total>{order['total']:.2f}</Total><Priority>{order['priority']}</Priority>"
        f"<OrderedAt>{order['orderedAt']}</OrderedAt><Customer>{order['customer']}</Customer>"
        "</Order>"
    )


def generate(n_orders: int, seed: int = 7) -> Day:
    """About ``n_orders`` orders over one day: 60% single XML files, 25% in XML batches,
    15% in JSON arrays; plus a few files the pipelines must refuse."""
    rng = random.Random(seed)
    day = Day()
    start = datetime(2026, 11, 23, tzinfo=UTC)
    n = 0
    while n < n_orders:
        kind = rng.random()
        size = 1 if kind < 0.6 else rng.randint(5, 40)
        batch = []
        for _ in range(min(size, n_orders - n)):
            n += 1
            when = start + timedelta(seconds=86_400 * n / n_orders)
            batch.append(_order(rng, n, when))
        day.orders.extend(batch)
        if kind < 0.6:
            day.files.append((f"order-{n:06d}.xml", _xml(batch[0]).encode()))
        elif kind < 0.85:
            body = '<Batch xmlns="urn:orders">' + "".join(_xml(o, root=False) for o in batch)
            day.files.append((f"batch-{n:06d}.xml", (body + "</Batch>").encode()))
        else:
            day.files.append((f"orders-{n:06d}.json", json.dumps(batch).encode()))
            day.web_orders.extend(str(o["id"]) for o in batch)
    bad = [
        ("broken-1.xml", b'<Order xmlns="urn:orders"><Id>X</Id><Region>EU'),  # truncated
        ("broken-2.json", b'[{"id": "SO-X", "region": "EU", '),  # truncated
        ("no-total.xml", _xml(_order(rng, 0, start)).replace("Total", "Sum").encode()),
        ("bad-region.json", json.dumps([{**_order(rng, 0, start), "region": "MARS"}]).encode()),
    ]
    day.files.extend(bad)
    day.bad_files = len(bad)
    rng.shuffle(day.files)
    totals = {str(o["id"]): float(o["total"]) for o in day.orders}  # type: ignore[arg-type]
    payments: list[dict[str, object]] = []
    for order_id in day.web_orders:
        total = totals[order_id]
        draw = rng.random()
        if draw < 0.06:  # never paid
            day.unpaid.add(order_id)
        elif draw < 0.09:  # a first part only
            day.unpaid.add(order_id)
            payments.append({"orderId": order_id, "amount": round(total * 0.4, 2)})
        elif draw < 0.24:  # paid in two parts
            first = round(total * 0.4, 2)
            payments.append({"orderId": order_id, "amount": first})
            payments.append({"orderId": order_id, "amount": round(total - first, 2)})
        else:
            payments.append({"orderId": order_id, "amount": total})
    rng.shuffle(payments)  # the gateway reports captures in its own order
    for start in range(0, len(payments), 25):
        chunk = payments[start : start + 25]
        day.payment_files.append((f"payments-{start:06d}.json", json.dumps(chunk).encode()))
    return day


def expected(day: Day, app: HostApp) -> Counter[str]:
    """Deliveries per port, predicted by the reference evaluator from the same filters
    the ports subscribe with."""
    filters = {
        name: port_filter(port, app.send_port_groups) for name, port in app.send_ports.items()
    }
    want: Counter[str] = Counter()
    for o in day.orders:
        props: dict[str, object] = {
            "orders.Region": o["region"],
            "orders.Total": o["total"],
            "orders.Priority": o["priority"],
        }
        if o.get("rush"):
            props["orders.Rush"] = True
        for name, f in filters.items():
            if f is not None and f.matches(props):
                want[name] += 1
    want["errors"] = day.bad_files
    paid = len(day.web_orders) - len(day.unpaid)
    want["warehouse"] = want["confirmations"] = paid
    want["cancellations"] = len(day.unpaid)
    return want


def box_instances(box: MessageBox) -> list[str]:
    """The state of every fulfilment instance."""
    import sqlalchemy as sa

    from messagebox.storage import schema

    si = schema.service_instance
    with box.store.transaction() as conn:
        return list(
            conn.execute(sa.select(si.c.state).where(si.c.service == "fulfilment")).scalars()
        )


def outcomes(out: Path) -> dict[str, set[str]]:
    """The web orders each fulfilment port wrote a document for."""
    return {
        port: {json.loads(f.read_bytes())["orderId"] for f in (out / port).glob("*")}
        for port in ("confirmations", "warehouse", "cancellations")
        if (out / port).is_dir()
    }


def drop(folder: Path, files: list[tuple[str, bytes]]) -> None:
    """Write each file under a hidden name, then rename it in (as producers should)."""
    for name, body in files:
        tmp = folder / f".{name}.tmp"
        tmp.write_bytes(body)
        tmp.rename(folder / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url", nargs="?", help="MessageBox URL (default: DuckDB in the workdir)")
    ap.add_argument("--orders", type=int, default=5_000, help="orders in the day (5000)")
    ap.add_argument("--workdir", type=Path, help="folder for in/, out/ and the database")
    ap.add_argument("--no-fsync", action="store_true", help="do not fsync outbound files")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after (s)")
    ap.add_argument(
        "--keep", action="store_true", help="keep the temporary working folder (no --workdir)"
    )
    args = ap.parse_args(argv)
    console = Console()
    logging.basicConfig(
        level=logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
    )
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args, args.workdir, console, "")
    root = Path(tempfile.mkdtemp(prefix="messagebox-orders-"))
    code = 1
    try:
        code = run(args, root, console, " (temporary: removed at the end, unless the run fails)")
    finally:
        if code or args.keep:
            console.print(f"working folder kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return code


def run(args: argparse.Namespace, root: Path, console: Console, temporary: str) -> int:
    """Route a generated day of orders through the demo's integration, in ``root`` (the
    inbound and outbound folders, and the database unless ``args.url``)."""
    url = args.url or f"duckdb:///{root / 'orders.duckdb'}"
    app = routing.build(root, fsync=not args.no_fsync)
    console.print(f"[bold]messagebox order routing[/] — {url}\nworking folder: {root}{temporary}\n")
    instance = app.instance(url)
    box = instance.box
    ports = Table(title="Send ports", title_justify="left")
    ports.add_column("port")
    ports.add_column("filter (own, OR its groups')")
    for s in box.subscriptions(host="orders"):
        ports.add_row(s.service, str(s.filter))
    console.print(ports)

    day = generate(args.orders)
    want = expected(day, app)
    total_deliveries = sum(want.values())
    console.print(
        f"\nGenerated {len(day.orders):,} orders in {len(day.files):,} files "
        f"({day.bad_files} of them bad), {len(day.web_orders):,} of them from the web shop "
        f"({len(day.unpaid):,} will never be paid in full); expecting {total_deliveries:,} "
        "deliveries.\n"
    )

    instance.start()
    started = time.perf_counter()
    locations = [loc for p in app.receive_ports for loc in p.locations]
    [payments] = [loc for loc in locations if loc.name == "payments-drop"]
    finished = False
    try:
        with Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            n_files = len(day.files) + len(day.payment_files)
            received = progress.add_task("received", total=n_files)
            delivered = progress.add_task("delivered", total=total_deliveries)
            fulfilled = progress.add_task("fulfilled", total=len(day.web_orders))
            # the captures first: every order's step then sees all that was paid for
            # it, so only the orders never paid in full wait, and those time out (no
            # outcome depends on how fast this machine is)
            drop(root / "payments", day.payment_files)
            ordering = False
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                inputs = sum(loc.stats.snapshot()["inputs"] for loc in locations)
                stats = {n: p.stats.snapshot() for n, p in app.send_ports.items()}
                sent = sum(s["sent"] + s["sent_backup"] for s in stats.values())
                done = sum(stats[n]["sent"] for n in ("confirmations", "cancellations"))
                progress.update(received, completed=inputs)
                progress.update(delivered, completed=sent)
                progress.update(fulfilled, completed=done)
                if not ordering and payments.stats.snapshot()["inputs"] >= len(day.payment_files):
                    # every capture is published (committed): the orders may come
                    drop(root / "in", day.files)
                    ordering = True
                if inputs >= n_files and sent >= total_deliveries:
                    finished = True
                    break
                time.sleep(0.1)
        elapsed = time.perf_counter() - started
    finally:
        instance.stop()

    with MessageBox(url, publisher="demo") as box:
        suspended = Counter(e.reason for e in box.suspended())
        fulfilment = Counter(box_instances(box))
        cleanup = box.cleanup()

    table = Table(title="Summary", title_justify="left")
    for col in ("port", "expected", "delivered", "files written", "retries", ""):
        table.add_column(col, justify="right" if col not in ("port", "") else "left")
    ok = finished
    for name, port in app.send_ports.items():
        stats = port.stats.snapshot()
        folder = root / "out" / name
        written = sum(1 for _ in folder.iterdir()) if folder.exists() else 0
        good = written == want[name] == stats["sent"]
        ok &= good
        table.add_row(
            name,
            f"{want[name]:,}",
            f"{stats['sent'] + stats['sent_backup']:,}",
            f"{written:,}",
            str(stats["retried"]),
            "[green]ok[/]" if good else "[red]MISMATCH[/]",
        )
    console.print()
    console.print(table)
    for reason, n in sorted(suspended.items()):
        console.print(f"suspended ({reason}): {n}")
    if not suspended:
        console.print("suspended: 0")
    console.print(
        f"throughput: {len(day.orders):,} orders in {elapsed:.1f} s = "
        f"{len(day.orders) / elapsed:,.0f} orders/s received and routed; "
        f"{total_deliveries / elapsed:,.0f} deliveries/s written to the outbound folders"
    )
    console.print(
        f"fulfilment: {fulfilment.get('completed', 0):,} instances completed, "
        f"{fulfilment.get('running', 0):,} running, {fulfilment.get('suspended', 0):,} suspended"
        f" ({len(day.web_orders) - len(day.unpaid):,} shipped and confirmed, "
        f"{len(day.unpaid):,} cancelled for want of payment in full)"
    )
    if fulfilment.get("completed", 0) != len(day.web_orders):
        ok = False
    fates = outcomes(root / "out")
    paid = set(day.web_orders) - day.unpaid
    if fates != {"confirmations": paid, "warehouse": paid, "cancellations": day.unpaid}:
        console.print("[red]Some web order did not get the fulfilment its payments call for.[/]")
        ok = False
    console.print(f"cleanup: deleted {cleanup.messages:,} delivered messages")
    if suspended != Counter({"receive-failure": day.bad_files}):
        ok = False
    if not ok:
        console.print("[red]The routed files do not match the prediction (or timed out).[/]")
        return 1
    console.print(
        "[green]Every order reached exactly the ports the reference evaluator predicts.[/]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
