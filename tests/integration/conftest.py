"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from messagebox import MessageBox
from messagebox.hosts import HostApp, HostInstance
from messagebox.predicates import P
from tests.conftest import scratch_url


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


@pytest.fixture(scope="module", params=["duckdb", "postgresql"])
def shared_box(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MessageBox]:
    """One store per backend for a whole module, with a host ``h``; each example
    removes what it made."""
    with scratch_url(request.param, tmp_path_factory.mktemp("shared")) as url:
        box = MessageBox(url)
        box.create_host("h")
        try:
            yield box
        finally:
            box.close()


@contextmanager
def catch_all_box(url: str) -> Iterator[MessageBox]:
    """A store with a host ``h`` and a subscription ``s`` there to every message with
    ``a.N`` (closed after)."""
    box = MessageBox(url, publisher="tests")
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("a.N") >= 0, name="s")
    try:
        yield box
    finally:
        box.close()


@pytest.fixture
def instances() -> Iterator[list[HostInstance]]:
    """Host instances a test started (it appends them); stopped at its end even if it
    fails."""
    started: list[HostInstance] = []
    yield started
    for inst in started:
        inst.stop(timeout=5)
