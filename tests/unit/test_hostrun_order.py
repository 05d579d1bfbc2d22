"""``messagebox host run`` advertises its endpoint (on DuckDB, the endpoint file) only
once every host instance has started: a command sent as soon as the file appears finds
them all registered; and it ends, failing, when an instance has exhausted itself."""

from __future__ import annotations

from typing import Any

import pytest

from messagebox.cli.hostrun import _run
from messagebox.errors import HostExhausted


class Fake:
    def __init__(self, name: str, log: list[str]) -> None:
        self.host = name
        self._log = log
        self.exhausted: str | None = None

    def start(self) -> None:
        self._log.append(f"start {self.host}")

    def stop(self) -> None:
        self._log.append(f"stop {self.host}")


def test_the_endpoint_is_advertised_after_every_instance_started() -> None:
    log: list[str] = []
    fakes: list[Any] = [Fake("alpha", log), Fake("beta", log)]
    _run(fakes, 0.0, started=lambda: log.append("advertised"))
    assert log[:3] == ["start alpha", "start beta", "advertised"]
    assert sorted(log[3:]) == ["stop alpha", "stop beta"]


def test_an_exhausted_instance_stops_them_all_and_the_run_fails() -> None:
    """``host run`` ends (so that a supervisor restarts the process) when an instance
    has stopped itself because hung handlers took its threads."""
    log: list[str] = []
    alpha, beta = Fake("alpha", log), Fake("beta", log)
    fakes: list[Any] = [alpha, beta]
    beta.exhausted = "host instance beta: 4 handlers abandoned"
    with pytest.raises(HostExhausted, match="beta: 4 handlers abandoned"):
        _run(fakes, None)  # no duration: only the exhaustion ends it
    assert sorted(log[2:]) == ["stop alpha", "stop beta"]
