"""What a served command may reach on the serving machine
(:func:`messagebox.console.served.serve`): only the commands on the allow-list are served,
and a served ``spark`` command reads and writes only inside the store's own folder (a
DuckDB store's) and the folders the serving process's operator allows. The Spark job is
replaced by a recorder: what matters is what would reach it."""

from __future__ import annotations

import argparse
import base64
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from messagebox import MessageBox
from messagebox.cli import remote
from messagebox.console import served as serving
from messagebox.console.served import serve
from messagebox.pipelines import spark_cli

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


class Recorder:
    """Stands in for the Spark job: records its arguments and the subscriptions file's
    contents while it runs."""

    def __init__(self) -> None:
        self.runs: list[argparse.Namespace] = []
        self.subscriptions: list[bytes] = []

    def __call__(self, args: argparse.Namespace) -> int:
        self.runs.append(args)
        named = getattr(args, "subscriptions", None) or getattr(args, "proposed", None)
        if named and "://" not in named:
            self.subscriptions.append(Path(named).read_bytes())
        return 0


@pytest.fixture
def spark(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(spark_cli, "run", recorder)
    return recorder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A DuckDB store's folder (``box.duckdb`` in it, with ``in.csv``), beside a folder
    ``outside`` holding ``secret.csv`` and a folder ``victim`` with a file."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "in.csv").write_text("key,t.N\n1,3\n")
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "keep.txt").write_text("keep me")
    (outside / "secret.csv").write_text("key,t.N\n1,1\n")
    (outside / "subs.json").write_text("[]")
    with MessageBox(f"duckdb:///{store / 'box.duckdb'}"):
        pass
    return store


@pytest.fixture
def box(folder: Path) -> Iterator[MessageBox]:
    with MessageBox(f"duckdb:///{folder / 'box.duckdb'}") as opened:
        yield opened


def served(
    box: MessageBox,
    *argv: str,
    cwd: Path,
    files: dict[str, bytes] | None = None,
    **options: Any,
) -> tuple[int, str]:
    answer = serve(
        box,
        {
            "argv": list(argv),
            "files": {k: base64.b64encode(v).decode() for k, v in (files or {}).items()},
            "cwd": str(cwd),
        },
        **options,
    )
    return answer["exit"], base64.b64decode(answer["stderr"]).decode()


def test_a_served_spark_route_reaches_no_file_outside_the_store_s_folder(
    box: MessageBox, folder: Path, spark: Recorder
) -> None:
    outside = folder.parent / "outside"

    code, err = served(
        box,
        "spark",
        "route",
        "--input",
        str(outside / "secret.csv"),
        "--output",
        str(outside / "victim"),
        cwd=folder,
    )

    assert code == 2, err
    assert "--input" in err
    assert str(outside / "secret.csv") in err
    assert spark.runs == []
    assert (outside / "victim" / "keep.txt").read_text() == "keep me"


ESCAPES = {
    "a relative path up and out": (["--input", "../outside/secret.csv"], "--input"),
    "a file:// URL": (["--input", "file://{outside}/secret.csv"], "--input"),
    "a symbolic link inside pointing out": (["--input", "link.csv"], "--input"),
    "another scheme": (["--input", "hdfs://namenode/orders.csv"], "hdfs://"),
    "a Hadoop glob": (["--input", "{{in,../outside/secret}}.csv"], "--input"),
    "a NUL character": (["--input", "in.csv\x00../../x"], "--input"),
    "the output replacing another folder": (["--output", "../outside/victim"], "--output"),
    "the output replacing the store's folder": (["--output", "."], "--output"),
    "the output replacing the database": (["--output", "box.duckdb"], "--output"),
    "the output replacing the endpoint file": (["--output", "box.duckdb.endpoint"], "--output"),
    "subscriptions from a file outside": (
        ["--subscriptions", "{outside}/subs.json"],
        "--subscriptions",
    ),
    "subscriptions from another store": (
        ["--subscriptions", "duckdb:///{outside}/other.duckdb"],
        "--subscriptions",
    ),
    "a Spark setting naming files": (["--conf", "spark.jars=http://x/evil.jar"], "spark.jars"),
    "a cluster": (["--master", "spark://elsewhere:7077"], "--master"),
}


@pytest.mark.parametrize("change", ESCAPES.values(), ids=ESCAPES.keys())
def test_every_way_out_of_the_store_s_folder_is_refused_naming_it(
    box: MessageBox, folder: Path, spark: Recorder, change: tuple[list[str], str]
) -> None:
    options, named = change
    outside = folder.parent / "outside"
    (folder / "link.csv").symlink_to(outside / "secret.csv")
    argv = {"--input": "in.csv", "--output": "routes"}
    extra: list[str] = []
    for key, value in zip(options[::2], options[1::2], strict=True):
        value = value.format(outside=outside)
        if key in argv:
            argv[key] = value
        else:
            extra += [key, value]

    code, err = served(
        box, "spark", "route", *[a for kv in argv.items() for a in kv], *extra, cwd=folder
    )

    assert code == 2, err
    assert named in err
    assert "spark route" in err
    assert spark.runs == []


def test_what_if_reads_and_writes_only_inside_too(
    box: MessageBox, folder: Path, spark: Recorder
) -> None:
    outside = folder.parent / "outside"
    proposed = {"p.json": b"[]"}

    read = served(box, "spark", "what-if", "--proposed", str(outside / "subs.json"), cwd=folder)
    written = served(
        box,
        "spark",
        "what-if",
        "--proposed",
        "p.json",
        "--output",
        str(outside / "victim"),
        cwd=folder,
        files=proposed,
    )

    assert read[0] == 2, read[1]
    assert "--proposed" in read[1]
    assert written[0] == 2, written[1]
    assert "--output" in written[1]
    assert spark.runs == []


def test_paths_inside_the_store_s_folder_reach_spark_resolved(
    box: MessageBox, folder: Path, spark: Recorder
) -> None:
    (folder / "work").mkdir()

    code, err = served(
        box,
        "spark",
        "route",
        "--input",
        "../in.csv",
        "--output",
        "routes",
        "--conf",
        "spark.sql.shuffle.partitions=4",
        "--master",
        "local[2]",
        cwd=folder / "work",
    )

    assert code == 0, err
    [args] = spark.runs
    assert args.input == str(folder.resolve() / "in.csv")
    assert args.output == str(folder.resolve() / "work" / "routes")


def test_a_subscriptions_file_sent_with_the_command_is_read_from_what_was_sent(
    box: MessageBox, folder: Path, spark: Recorder
) -> None:
    sent = b'[{"name": "s", "service": "s", "host": "h", "filter": {"any": []}}]'

    code, err = served(
        box,
        "spark",
        "route",
        "--input",
        "in.csv",
        "--output",
        "routes",
        "--subscriptions",
        "subs.json",
        cwd=folder.parent,  # not where the store is: the file came with the command
        files={"subs.json": sent},
    )

    assert code == 2, err  # the input is outside all the same
    code, err = served(
        box,
        "spark",
        "route",
        "--input",
        "in.csv",
        "--output",
        "routes",
        "--subscriptions",
        "subs.json",
        cwd=folder,
        files={"subs.json": sent},
    )
    assert code == 0, err
    assert spark.subscriptions == [sent]


def test_the_command_line_sends_a_subscriptions_file_with_the_command() -> None:
    from messagebox.cli.parser import build

    route = build().parse_args(
        ["spark", "route", "--input", "i", "--output", "o", "--subscriptions", "s.json"]
    )
    what_if = build().parse_args(["spark", "what-if", "--proposed", "p.json"])
    by_url = build().parse_args(["spark", "what-if", "--proposed", "duckdb:///x.duckdb"])

    assert remote._named_files(route) == ["s.json"]
    assert remote._named_files(what_if) == ["p.json"]
    assert remote._named_files(by_url) == []


def test_the_store_itself_may_be_named_as_the_subscriptions(
    box: MessageBox, folder: Path, spark: Recorder
) -> None:
    code, err = served(
        box,
        "spark",
        "route",
        "--input",
        "in.csv",
        "--output",
        "routes",
        "--subscriptions",
        "duckdb:///box.duckdb",
        cwd=folder,
    )

    assert code == 0, err
    assert spark.runs[0].subscriptions == box.store.url.render_as_string(hide_password=True)


def test_folders_the_operator_allows_are_reachable_through_the_api(
    box: MessageBox, folder: Path, spark: Recorder
) -> None:
    shared = folder.parent / "outside"
    api = TestClient(
        create_app_with(box, serve_paths=[str(shared)]), base_url="http://127.0.0.1:8080"
    )
    body = {
        "argv": ["spark", "route", "--input", "secret.csv", "--output", "routes"],
        "cwd": str(shared),
    }

    answer = api.post("/api/v1/cli", json=body, headers={"Authorization": "Bearer k"}).json()

    assert answer["exit"] == 0, base64.b64decode(answer["stderr"])
    assert spark.runs[0].input == str(shared.resolve() / "secret.csv")


def create_app_with(box: MessageBox, **options: Any) -> Any:
    from messagebox.console import create_app

    return create_app(box, api_token="k", **options)


def test_on_postgresql_no_path_is_reachable_unless_the_operator_allows_one(
    pg_url: str, tmp_path: Path, spark: Recorder
) -> None:
    (tmp_path / "in.csv").write_text("key\n1\n")
    with MessageBox(pg_url) as box:
        code, err = served(
            box, "spark", "route", "--input", "in.csv", "--output", "routes", cwd=tmp_path
        )
        assert code == 2, err
        assert "MESSAGEBOX_SERVE_PATHS" in err
        assert spark.runs == []

        from messagebox.console.paths import ServedPaths

        allowed = ServedPaths.of(None, [tmp_path])
        code, err = served(
            box,
            "spark",
            "route",
            "--input",
            "in.csv",
            "--output",
            "routes",
            cwd=tmp_path,
            paths=allowed,
        )
        assert code == 0, err


@pytest.mark.parametrize(
    ("argv", "name"),
    [(["host", "run", "tests.apps.pair:alpha"], "host run"), (["console"], "console")],
)
def test_commands_off_the_allow_list_are_refused_naming_them(
    box: MessageBox, argv: list[str], name: str
) -> None:
    code, err = served(box, *argv, cwd=Path.cwd())

    assert code == 2
    assert f"`{name}` is not served" in err


def test_only_the_commands_on_the_allow_list_are_served(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from messagebox.cli.commands import COMMANDS

    assert set(COMMANDS) | {("spark", "route"), ("spark", "what-if")} == set(serving.SERVED)
    monkeypatch.setattr(serving, "SERVED", serving.SERVED - {("stats", "")})

    code, err = served(box, "stats", cwd=Path.cwd())

    assert code == 2
    assert "`stats` is not served" in err


@pytest.mark.parametrize("setting", ["relative/folder", "/no/such/folder"])
def test_a_served_folder_that_is_not_one_is_bad_usage(folder: Path, setting: str) -> None:
    from tests.cli_support import run_cli

    done = run_cli(
        ["--url", f"duckdb:///{folder / 'box.duckdb'}", "console", "--port", "1"],
        env={"MESSAGEBOX_SERVE_PATHS": f"{folder}:{setting}"},
    )

    assert done.returncode == 2
    assert f"MESSAGEBOX_SERVE_PATHS: {setting!r}" in done.stderr
