"""The benchmarks refuse bad arguments with argparse's error naming the argument (exit
2), before any store is made: a count below 1, not a whole number, an unknown backend."""

from __future__ import annotations

import pytest

from bench import orchestrate, ordered


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rounds", "0"], "--rounds: at least 1, not 0"),
        (["--messages", "ten"], "--messages: not a whole number: 'ten'"),
        (["--ordered", "-3"], "--ordered: at least 1, not -3"),
        (["--backends", "duckdb,mysql"], "--backends: not a backend: 'mysql'"),
        (["--backends", ","], "--backends: no backend given"),
    ],
)
def test_bench_ordered_refuses_bad_arguments(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        ordered.main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_bench_orchestrate_refuses_a_round_count_below_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        orchestrate.main(["--runs", "0"])
    assert exited.value.code == 2
    assert "--runs: at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--messages", "0"], "--messages: at least 1, not 0"),
        (["--rounds", "x"], "--rounds: not a whole number: 'x'"),
        (["--backend", "mysql"], "--backend: invalid choice: 'mysql'"),
    ],
)
def test_bench_search_refuses_bad_arguments(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import search

    with pytest.raises(SystemExit) as exited:
        search.main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
