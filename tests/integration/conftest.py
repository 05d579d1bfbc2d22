"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from hosts import HostApp, HostInstance


@pytest.fixture
def running(backend_url: str) -> Iterator[Callable[..., HostInstance]]:
    """Start host instances of apps on the test's backend; all are stopped after."""
    started: list[HostInstance] = []

    def start(app: HostApp, **settings: object) -> HostInstance:
        inst = app.instance(backend_url, **settings)
        inst.start()
        started.append(inst)
        return inst

    yield start
    for inst in reversed(started):
        inst.stop(5.0)
