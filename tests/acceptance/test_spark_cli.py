"""``messagebox spark route`` and ``what-if`` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.cli import main
from messagebox.predicates import Filter, P
from tests.cli_support import run_cli

CSV = """key,orders.Region,orders.Total,orders.At
1,EU,5.5,2024-01-01T00:00:00Z
2,US,500,2024-01-02T00:00:00Z
3,,1000,
4,UK,,2024-01-03T00:00:00Z
"""


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    with MessageBox(url) as box:
        box.create_host("shipping")
        box.subscribe("ship-eu", host="shipping", filter=P("orders.Region") == "EU", name="eu")
        box.subscribe("big", host="shipping", filter=P("orders.Total") >= 100, name="big")
        box.subscribe("none", host="shipping", filter=P("orders.Region") == "nowhere", name="no")
        box.publish([Message(b"o", promoted={"orders.Region": "UK", "orders.Total": 1.0})])
    return url


def test_spark_route_writes_pairs_partitioned_by_subscription(
    spark: Any, store: str, tmp_path: Path
) -> None:
    # Given a CSV of messages and a store's subscriptions
    (tmp_path / "in.csv").write_text(CSV)
    out = tmp_path / "out"
    # When the command runs as a user runs it (in this process, on the tests' Spark
    # session, so --master is moot: a Spark of its own would cost ~10 s of JVM start-up)
    result = run_cli(
        [
            "--url",
            store,
            "spark",
            "route",
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(out),
            "--master",
            "local[1]",
        ]
    )
    # Then it succeeds, with its steps on stderr and a count per subscription on stdout
    assert result.returncode == 0, result.stderr
    assert "subscriptions loaded" in result.stderr
    assert "done: 3 (message, subscription) pairs" in result.stderr
    lines = [line.split("\t") for line in result.stdout.splitlines()[1:]]
    assert [(name, int(n)) for _, name, _, n in lines] == [("eu", 1), ("big", 2), ("no", 0)]
    # and one folder per matching subscription holds its message keys
    with MessageBox(store) as box:
        ids = {s.name: s.id for s in box.subscriptions()}
    folders = {p.name for p in out.iterdir() if p.is_dir()}
    assert folders == {f"subscription={ids['eu']}", f"subscription={ids['big']}"}


def test_spark_route_errors_name_the_culprit(
    spark: Any, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier run's output")
    bad_name = tmp_path / "bad.csv"
    bad_name.write_text("key,total amount\n1,2\n")
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "data.bin").write_bytes(b"?")
    nan = tmp_path / "nan.json"
    nan.write_text('{"key": 1, "orders.Total": "NaN"}\n')
    cases = [
        (["--input", str(tmp_path / "missing.csv")], "no such file or folder"),
        (["--input", str(bad_name)], "column 'total amount'"),
        (["--input", str(unknown)], "cannot tell the format"),
        (
            ["--input", str(nan), "--schema", "key INT, `orders.Total` DOUBLE"],
            "property 'orders.Total': float is not finite (message key 1)",
        ),
        (["--input", str(bad_name), "--conf", "oops"], "expected KEY=VALUE"),
    ]
    for args, says in cases:
        code = main(["--url", store, "spark", "route", "--output", str(out), *args])
        err = capsys.readouterr().err
        assert code == 1, args
        assert says in err, err
    # a failed run leaves the earlier output as it was, and nothing beside it
    assert [p.name for p in out.iterdir()] == ["earlier.txt"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(SystemExit) as usage:
        main(["spark", "route", "--input", "x"])
    assert usage.value.code == 2


def test_spark_route_reads_a_uri_as_spark_does(
    spark: Any, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the input as a URI (as hdfs:// or s3a:// would be), not a local path
    (tmp_path / "in.csv").write_text(CSV)
    out = tmp_path / "out"
    uri = (tmp_path / "in.csv").as_uri()
    # When it is routed, the format told by the URI's name
    code = main(["--url", store, "spark", "route", "--input", uri, "--output", str(out)])
    # Then Spark read it
    assert code == 0, capsys.readouterr().err
    assert "done: 3 (message, subscription) pairs" in capsys.readouterr().err
    # and a URI whose name says no format needs --format
    remote = ["--input", "s3a://bucket/orders", "--output", str(tmp_path / "out2")]
    code = main(["--url", store, "spark", "route", *remote])
    assert code == 1
    assert "cannot tell the format of s3a://bucket/orders" in capsys.readouterr().err


def test_spark_what_if_prints_the_moves(
    spark: Any, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proposed = tmp_path / "proposed.json"
    filt = Filter.of(P("orders.Region").in_(["EU", "UK"]))
    proposed.write_text(json.dumps([{"service": "ship-eu", "filter": json.loads(filt.to_json())}]))
    code = main(
        [
            "--url",
            store,
            "spark",
            "what-if",
            "--proposed",
            str(proposed),
            "--output",
            str(tmp_path / "changes"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "1 of 1 stored messages would change destination" in captured.out
    assert "\t-\t+ship-eu" in captured.out
    assert (tmp_path / "changes" / "_SUCCESS").exists()
