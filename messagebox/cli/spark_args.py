"""The ``spark`` commands' arguments (``spark route``, ``spark what-if``)."""

from __future__ import annotations

import argparse
from typing import Any


def spark_parser(sub: Any) -> None:
    """Add ``spark route`` and ``spark what-if`` to the command line's subcommands."""
    spark = sub.add_parser("spark", help="batch routing on Spark (needs the 'spark' extra)")
    spark_sub = spark.add_subparsers(dest="spark_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    common.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.driver.memory=8g (repeatable)",
    )
    route = spark_sub.add_parser(
        "route",
        parents=[common],
        help="route a file of messages; write (key, subscription) pairs per subscription",
        description="Route messages (Parquet, CSV or JSON; wide: a key column and one "
        "column per property; long: key, property, value columns) against the "
        "subscriptions of a MessageBox, and write the matching pairs partitioned by "
        "subscription.",
    )
    route.add_argument("--input", required=True, help="a file or folder of messages")
    route.add_argument(
        "--subscriptions",
        help="a MessageBox URL (default: --url, $MESSAGEBOX_URL) or a JSON file of "
        "[{name, service, host, filter}]",
    )
    route.add_argument("--output", required=True, help="the output folder (replaced)")
    route.add_argument(
        "--format",
        default="auto",
        choices=["auto", "parquet", "csv", "json"],
        help="input format (default: from the file names)",
    )
    route.add_argument(
        "--output-format",
        default="parquet",
        choices=["parquet", "csv", "json"],
        help="the format of the written pairs (default parquet)",
    )
    route.add_argument("--key", default="key", help="the message key column (default key)")
    route.add_argument("--layout", default="auto", choices=["auto", "wide", "long"])
    route.add_argument("--schema", help="the input schema as DDL (default: inferred)")
    route.add_argument(
        "--no-validate", action="store_true", help="skip the duplicate-key check (one pass)"
    )
    whatif = spark_sub.add_parser(
        "what-if",
        parents=[common],
        help="which stored messages would change destination under proposed subscriptions",
    )
    whatif.add_argument(
        "--proposed",
        required=True,
        help="a JSON file of [{name, service, host, filter}] or a MessageBox URL",
    )
    whatif.add_argument(
        "--replace-all",
        action="store_true",
        help="the proposal is the whole new set (default: it replaces the services it names)",
    )
    whatif.add_argument("--output", help="also write the changed messages here (Parquet)")
    whatif.add_argument("--show", type=int, default=20, help="changed messages to print")
