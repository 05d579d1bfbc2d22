"""The endpoint file beside a DuckDB store sends commands only to the process that
serves that store: a symbolic link (another user's, in a shared folder) or anything but
a regular file is refused, and a process that answers for another store is refused
too (:func:`messagebox.cli.remote.endpoint_for`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from messagebox import MessageBox
from messagebox.cli.remote import advertise, endpoint_file, endpoint_for, withdraw
from messagebox.console import create_app
from messagebox.console.background import BackgroundServer
from messagebox.errors import MessageBoxError
from tests.cli_support import run_cli

TOKEN = "api-token"


@pytest.fixture
def other(tmp_path: Path) -> Iterator[Path]:
    """``other.duckdb``, held by a console served from this process and advertised in
    its endpoint file; the file of the store the tests ask for, ``asked.duckdb``,
    exists beside it."""
    with MessageBox(f"duckdb:///{tmp_path / 'asked.duckdb'}"):
        pass
    database = tmp_path / "other.duckdb"
    box = MessageBox(f"duckdb:///{database}")
    server = BackgroundServer(create_app(box, api_token=TOKEN), "127.0.0.1", 0)
    written = advertise(database, server.start(), TOKEN)
    try:
        yield database
    finally:
        withdraw(written)
        server.stop()
        box.close()


def test_the_store_s_own_endpoint_file_is_followed(other: Path) -> None:
    found = endpoint_for(f"duckdb:///{other}")

    assert found is not None
    assert found.pid == os.getpid()


def test_a_symbolic_link_to_another_store_s_endpoint_file_is_refused(
    other: Path, tmp_path: Path
) -> None:
    link = endpoint_file(tmp_path / "asked.duckdb")
    link.symlink_to(endpoint_file(other))

    with pytest.raises(MessageBoxError, match="symbolic link") as refused:
        endpoint_for(f"duckdb:///{tmp_path / 'asked.duckdb'}")

    assert str(link) in str(refused.value)


def test_a_copy_of_another_store_s_endpoint_file_is_refused(other: Path, tmp_path: Path) -> None:
    asked = tmp_path / "asked.duckdb"
    copy = endpoint_file(asked)
    shutil.copy(endpoint_file(other), copy)
    copy.chmod(0o600)

    done = run_cli(["--url", f"duckdb:///{asked}", "stats"])

    assert done.returncode == 1
    assert str(other) in done.stderr  # what the process serves
    assert str(asked) in done.stderr  # what was asked for
    assert str(copy) in done.stderr


@pytest.mark.timeout(30)
def test_an_endpoint_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    asked = tmp_path / "asked.duckdb"
    os.mkfifo(endpoint_file(asked), 0o600)  # opening it to read would wait for a writer

    with pytest.raises(MessageBoxError, match="not a regular file"):
        endpoint_for(f"duckdb:///{asked}")


def test_the_status_says_which_store_the_process_serves(other: Path) -> None:
    found = endpoint_for(f"duckdb:///{other}")
    assert found is not None
    status = httpx.get(
        f"{found.url}/api/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ).json()

    assert status["database"] == os.path.realpath(other)
