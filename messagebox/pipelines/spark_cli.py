"""``messagebox spark route`` and ``messagebox spark what-if``: the command-line side of
:mod:`messagebox.pipelines.spark` and :mod:`messagebox.pipelines.whatif` (arguments in
:mod:`messagebox.cli.parser`).

Progress goes to standard error: each step with its elapsed time, and Spark's own
progress bar while a job runs. Exit codes: 0 success, 1 a messagebox or Spark error
(the message says which), 2 bad usage.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from messagebox.errors import MessageBoxError

_FORMATS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}


class _Steps:
    """Prints each step with the time since the start."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:7.1f} s] {text}", file=sys.stderr, flush=True)


def input_format(path: Path, given: str) -> str:
    """The input format: as given, else from the file name (or a folder's files)."""
    if given != "auto":
        return given
    names = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for name in names:
        fmt = _FORMATS.get(name.suffix.lower())
        if fmt:
            return fmt
    raise MessageBoxError(
        f"cannot tell the format of {path} from its file names; give --format parquet, csv or json"
    )


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _input(text: str, given: str) -> tuple[str, str]:
    """Where Spark reads the input, and its format. A URI (``hdfs://``, ``s3a://``,
    ``file://``…) goes to Spark as it is, its format from its name or ``--format``; a
    local path must exist, its format from its files' names when not given."""
    if _URI.match(text):
        if given != "auto":
            return text, given
        fmt = _FORMATS.get(PurePosixPath(urlparse(text).path).suffix.lower())
        if fmt is None:
            raise MessageBoxError(
                f"cannot tell the format of {text} from its name; give --format parquet, "
                "csv or json"
            )
        return text, fmt
    path = Path(text)
    if not path.exists():
        raise MessageBoxError(f"--input {path}: no such file or folder")
    return str(path), input_format(path, given)


def _spark_error(exc: Exception) -> str:
    """The useful line of a Spark error (our own ``messagebox: …`` text when it is one)."""
    text = str(exc)
    found = re.search(r"messagebox: (.*?)(?: SQLSTATE: \w+)?$", text, re.MULTILINE)
    if found:
        return found.group(1).strip()
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _session(args: argparse.Namespace) -> Any:
    from messagebox.pipelines.spark import session

    conf = {"spark.ui.showConsoleProgress": "true"}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MessageBoxError(f"--conf {item!r}: expected KEY=VALUE")
        conf[key] = value
    spark = session(args.master, "messagebox-spark", **conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(args: argparse.Namespace) -> int:
    """Run a ``messagebox spark`` command."""
    try:
        from pyspark.errors import PySparkException
    except ImportError:
        print(
            "messagebox: Spark is not installed: pip install 'messagebox[spark]' (and Java 17)",
            file=sys.stderr,
        )
        return 1
    step = _Steps()
    try:
        if args.spark_command == "route":
            return _route(args, step)
        return _what_if(args, step)
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=sys.stderr)
        return 1
    except PySparkException as exc:
        print(f"messagebox: {_spark_error(exc)}", file=sys.stderr)
        return 1


def _route(args: argparse.Namespace, step: _Steps) -> int:
    from pyspark.sql import functions as F

    from messagebox.pipelines.spark import load_subscriptions, route_dataframe, write_routes

    source = args.subscriptions or args.explicit_url
    if not source:
        raise MessageBoxError("give --subscriptions (a MessageBox URL or a JSON file), or --url")
    location, fmt = _input(args.input, args.format)
    targets = load_subscriptions(source)
    step(f"{len(targets):,} subscriptions loaded")
    spark = _session(args)
    step(f"Spark {spark.version} on {spark.sparkContext.master}")
    reader = spark.read.format(fmt)
    if args.schema:
        reader = reader.schema(args.schema)
    elif fmt == "csv":
        reader = reader.option("inferSchema", "true")
    elif fmt == "json":
        reader = reader.option("inferTimestamp", "true")
    if fmt == "csv":
        reader = reader.option("header", "true")
    df = reader.load(location)
    step(f"reading {location} ({fmt}): columns {', '.join(df.columns)}")
    routes = route_dataframe(
        df, targets, key=args.key, layout=args.layout, validate=not args.no_validate
    )
    step("routing and writing")
    write_routes(routes, args.output, args.output_format)
    step(f"written to {args.output}")
    counts = {
        r["subscription"]: int(r["count"])
        for r in spark.read.format(args.output_format)
        .load(args.output)
        .groupBy("subscription")
        .agg(F.count(F.lit(1)).alias("count"))
        .collect()
    }
    print("subscription\tname\tservice\tmessages")
    for t in targets:
        print(f"{t.id}\t{t.name or ''}\t{t.service}\t{counts.get(t.id, 0)}")
    step(f"done: {sum(counts.values()):,} (message, subscription) pairs")
    return 0


def _what_if(args: argparse.Namespace, step: _Steps) -> int:
    from messagebox.engine import MessageBox
    from messagebox.pipelines.whatif import export_messages, what_if

    spark = _session(args)
    with MessageBox(args.url) as box:
        step("exporting stored messages")
        frame = export_messages(box, spark, progress=lambda n: step(f"  {n:,} messages exported"))
        step("routing under the current and the proposed subscriptions")
        report = what_if(
            box, args.proposed, spark=spark, replace_all=args.replace_all, messages=frame
        )
    if args.output:
        report.changes.write.mode("overwrite").parquet(args.output)
        step(f"changed messages written to {args.output}")
    print(report.summary)
    for row in report.changes.orderBy("message_id").limit(args.show).collect():
        print(f"{row['message_id']}\t-{','.join(row['removed'])}\t+{','.join(row['added'])}")
    step("done")
    return 0
