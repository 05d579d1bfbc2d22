"""Usage the command line refuses clearly: malformed store URLs (exit 2, saying how to
write one), host settings given on the command line (exit 2; a store that refuses is
still 1), misspelt host names and routing-file keys ("did you mean"), and the version
(``--version``, ``messagebox.__version__``)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

import messagebox
from messagebox import MessageBox
from messagebox.config.routing_file import RoutingFileError, load
from messagebox.errors import UnknownHost, ValidationError
from messagebox.predicates import P
from tests.cli_support import run_cli


def test_the_version_is_the_distributions() -> None:
    installed = metadata.version("messagebox-router")
    assert messagebox.__version__ == installed
    shown = run_cli(["--version"])
    assert (shown.returncode, shown.stdout) == (0, f"messagebox {installed}\n")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("duckdb://file.duckdb", "duckdb:///relative.duckdb"),
        ("duckdb://file.duckdb", "duckdb:////absolute/path.duckdb"),
        ("postgres://", "postgresql+psycopg://user@host/db"),
        ("postgres://me@db.example/shop", "postgresql+psycopg://user@host/db"),
        ("sqlite://", "unsupported backend 'sqlite'"),
        ("", "--url is empty"),
        ("  ", "--url is empty"),
        ("duckdb:", "not a database URL"),
    ],
)
def test_a_malformed_url_is_bad_usage_saying_how_to_write_one(
    url: str, said: str, tmp_path: Path
) -> None:
    result = run_cli(["--url", url, "stats"])
    assert result.returncode == 2, result.stderr
    assert said in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_malformed_url_from_the_environment_is_bad_usage_too() -> None:
    result = run_cli(["stats"], env={"MESSAGEBOX_URL": "duckdb://file.duckdb"})
    assert result.returncode == 2
    assert "duckdb:///relative.duckdb" in result.stderr


def test_host_run_refuses_a_malformed_url() -> None:
    result = run_cli(["--url", "duckdb://file.duckdb", "host", "run", "tests.apps.pair:alpha"])
    assert result.returncode == 2, result.stderr
    assert "duckdb:///relative.duckdb" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_library_refuses_a_duckdb_url_with_a_host() -> None:
    with pytest.raises(ValidationError, match=r"duckdb:////absolute/path\.duckdb"):
        MessageBox("duckdb://file.duckdb")


def test_host_settings_from_the_command_line_are_bad_usage(backend_url: str) -> None:
    env = {"MESSAGEBOX_URL": backend_url}
    assert run_cli(["init"], env=env).returncode == 0
    assert run_cli(["hosts", "add", "shipping"], env=env).returncode == 0
    for argv, said in [
        (["hosts", "add", "h", "--set", "max_attempts=abc"], "max_attempts"),
        (["hosts", "add", "h", "--set", "max_attemps=3"], "did you mean 'max_attempts'?"),
        (["hosts", "set", "shipping", "--set", "poll_min_seconds=5"], "poll_max_seconds"),
    ]:
        result = run_cli(argv, env=env)
        assert result.returncode == 2, (argv, result.stderr)
        assert said in result.stderr
    taken = run_cli(["hosts", "add", "shipping"], env=env)
    assert taken.returncode == 1  # the store refuses: not a usage error
    with MessageBox(backend_url) as box:
        assert [h.name for h in box.hosts()] == ["shipping"]
        assert box.host("shipping").settings.poll_min_seconds < 5


def test_an_unknown_host_is_named_with_the_nearest_one(backend_url: str) -> None:
    env = {"MESSAGEBOX_URL": backend_url}
    with MessageBox(backend_url) as box:
        box.create_host("shipping")
        with pytest.raises(UnknownHost, match="did you mean 'shipping'"):
            box.subscribe("s", host="shiping", filter=P("a.B") == 1)
        with pytest.raises(UnknownHost, match="did you mean 'shipping'"):
            box.configure_host("shiping", max_attempts=2)
        with pytest.raises(UnknownHost, match="did you mean 'shipping'"):
            box.queue_depth("shiping")
        with pytest.raises(UnknownHost, match=r"no host named 'zzz'$"):
            box.host("zzz")
    for argv in (
        ["queues", "--host", "shiping"],
        ["hosts", "set", "shiping", "--set", "max_attempts=2"],
        ["hosts", "remove", "shiping"],
        ["subscriptions", "add", "s", "--host", "shiping", "--filter", "a.B == 1"],
    ):
        result = run_cli(argv, env=env)
        assert result.returncode == 3, (argv, result.stderr)
        assert "did you mean 'shipping'?" in result.stderr


SUB = '[hosts.a]\n[hosts.shipping]\n[[subscriptions]]\nservice = "x"\n'


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (f'{SUB}host = "a"\nfiltr = "a.b == 1"\n', "'filter'"),
        ("[hosts.a]\nmax_attemps = 3\n", "'max_attempts'"),
        ("[services.x]\nstat = 'stopped'\n", "'state'"),
        ("hostz = 1\n", "'hosts'"),
        (f'{SUB}host = "shiping"\nfilter = "a.b == 1"\n', "'shipping'"),
    ],
)
def test_a_misspelt_key_or_host_in_a_routing_file_names_the_nearest(text: str, said: str) -> None:
    with pytest.raises(RoutingFileError, match=f"did you mean {said}"):
        load(text)
