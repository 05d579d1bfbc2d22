"""``messagebox host run`` advertises its endpoint (on DuckDB, the endpoint file) only
once every host instance has started: a command sent as soon as the file appears finds
them all registered."""

from __future__ import annotations

from typing import Any

from messagebox.cli.hostrun import _run


class Fake:
    def __init__(self, name: str, log: list[str]) -> None:
        self.host = name
        self._log = log

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
