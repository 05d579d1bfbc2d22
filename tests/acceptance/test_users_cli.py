"""``messagebox users …`` and ``messagebox console`` with named users, on both backends:
the password asked twice at a terminal (a real pseudo-terminal) or read with
``--password-stdin``, refused without either; bad names, roles and passwords are bad
usage; every change is audited as its runner or ``--as``. A console process keeps its
sessions in the store: restarted, the same cookie is still logged in (a DuckDB file,
PostgreSQL), and a user disabled meanwhile (through the running console, on DuckDB) is
out at once."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from messagebox import MessageBox
from tests.cli_support import ROOT, run_cli, run_process
from tests.conftest import free_port, wait_for

PASSWORD = "correct horse battery"


def users(url: str, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return run_cli(["--url", url, "users", *argv], stdin=stdin)


def test_users_are_added_listed_changed_and_removed(backend_url: str) -> None:
    with MessageBox(backend_url):
        pass
    added = users(backend_url, "add", "alice", "--role", "operator", "--password-stdin",
                  stdin=f"{PASSWORD}\n".encode())  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout == "added user 'alice' (operator)\n"
    listed = users(backend_url, "--json", "list")
    [alice] = json.loads(listed.stdout)
    assert (alice["name"], alice["role"], alice["disabled"], alice["sessions"]) == (
        "alice",
        "operator",
        False,
        0,
    )
    assert PASSWORD not in listed.stdout
    assert "hash" not in listed.stdout
    assert users(backend_url, "set-role", "alice", "--role", "admin").returncode == 0
    assert users(backend_url, "disable", "alice", "--as", "ops-lead").returncode == 0
    shown = users(backend_url).stdout  # `users` alone lists
    assert "alice" in shown
    assert "admin" in shown
    assert "disabled" in shown
    assert users(backend_url, "enable", "alice").returncode == 0
    reset = users(backend_url, "reset-password", "alice", "--password-stdin",
                  stdin=b"a brand new secret\n")  # fmt: skip
    assert reset.returncode == 0, reset.stderr
    with MessageBox(backend_url) as box:
        assert box.authenticate("alice", "a brand new secret") is not None
        log = box.audit_log()
    assert [r.action for r in log] == [
        "users reset-password",
        "users enable",
        "users disable",
        "users set-role",
        "users add",
    ]
    assert {r.target for r in log} == {"user alice"}
    disabled = log[2]
    assert disabled.who == "ops-lead"
    assert disabled.detail is not None
    assert "run by" in disabled.detail
    assert "@" in log[0].who  # the OS user and machine
    assert all(PASSWORD not in (r.detail or "") for r in log)
    assert users(backend_url, "remove", "alice").returncode == 0
    gone = users(backend_url, "remove", "alice")
    assert gone.returncode == 3
    assert "no user named 'alice'" in gone.stderr


@pytest.mark.parametrize(
    ("argv", "stdin", "why"),
    [
        (["add", "bob", "--role", "admni"], b"", "no role 'admni'; did you mean 'admin'?"),
        (["add", "bob", "--role", "admin"], b"", "no terminal to ask the password at"),
        (["add", "Bob", "--role", "admin"], b"", "did you mean 'bob'?"),
        (["add", "b" * 5000, "--role", "admin"], b"", "at most 64 characters"),
        (["add", "bob", "--role", "reader", "--password-stdin"], b"\n", "must not be empty"),
        (["add", "bob", "--role", "reader", "--password-stdin"], b"Xy7#q\n", "too short"),
        (["add", "bob", "--role", "reader", "--password-stdin"], b"a" * 100_000, "too long"),
        (["add", "bob", "--role", "reader", "--password-stdin"], b"\xff\xfe\x00\x01", "UTF-8"),
        (["add", "bob", "--role", "reader", "--password-stdin"], b"one line\ntwo\n", "one line"),
        (["add", "bob", "--role", "reader", "--password-stdin"], b"password2024\n", "easily"),
        (["set-role", "bob", "--role", "root"], b"", "one of: reader, operator, admin"),
        (["disable", "bob", "--as", "\x1b[2J"], b"", "--as: give a printable name"),
    ],
)
def test_bad_users_input_is_bad_usage_and_changes_nothing(
    duckdb_url: str, argv: list[str], stdin: bytes, why: str
) -> None:
    with MessageBox(duckdb_url):
        pass
    done = users(duckdb_url, *argv, stdin=stdin)
    assert done.returncode == 2, done.stderr
    assert why in done.stderr
    assert len(done.stderr) < 500
    with MessageBox(duckdb_url) as box:
        assert box.users() == []


def at_terminal(argv: list[str], answers: list[str]) -> tuple[int, str]:
    """Run ``messagebox ARGV`` on a pseudo-terminal, typing each answer after a new
    prompt (output ending with ': '); its exit code and everything it wrote there."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its controlling one, as a shell's would be
        os.chdir(ROOT)
        os.environ["PYTHONPATH"] = str(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "messagebox.cli", *argv])
    seen, pending, answered = b"", list(answers), 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child ended: its side of the terminal closed
            break
        if not chunk:
            break
        seen += chunk
        # a new prompt (written once the terminal stopped echoing): the next answer
        if pending and seen[answered:].endswith(b": "):
            os.write(fd, pending.pop(0).encode() + b"\r")
            answered = len(seen)
    else:  # never finished: say what it wrote
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
        raise AssertionError(f"no end after 60 s; it wrote: {seen!r}")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), seen.decode("utf-8", "replace")


def test_the_password_is_asked_twice_at_a_terminal_and_not_echoed(duckdb_url: str) -> None:
    with MessageBox(duckdb_url):
        pass
    argv = ["--url", duckdb_url, "users", "add", "carol", "--role", "reader"]
    code, seen = at_terminal(argv, [PASSWORD, PASSWORD + "x"])
    assert code == 2, seen
    assert "Password for carol:" in seen
    assert "Again:" in seen
    assert "the passwords differ; nothing was changed" in seen
    code, seen = at_terminal(argv, [PASSWORD, PASSWORD])
    assert code == 0, seen
    assert PASSWORD not in seen  # never echoed
    assert "added user 'carol' (reader)" in seen
    with MessageBox(duckdb_url) as box:
        assert box.authenticate("carol", PASSWORD) is not None


@contextmanager
def console(url: str, port: int, **env: str) -> Iterator[str]:
    """``messagebox console`` on ``url`` (a process of its own); its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "messagebox.cli", "--url", url, "console", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.communicate()
        try:
            httpx.get(f"{base}/login", timeout=1)
        except httpx.TransportError:
            return False
        return True

    try:
        wait_for(up, "messagebox console to serve", timeout=30)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert PASSWORD not in err


def test_sessions_outlive_a_restart_of_the_console(backend_url: str) -> None:
    with MessageBox(backend_url) as box:
        box.add_user("alice", "operator", PASSWORD)
        box.add_user("bob", "reader", PASSWORD)
    port = free_port()
    with console(backend_url, port) as base:
        done = httpx.post(f"{base}/login", data={"user": "alice", "password": PASSWORD})
        assert done.status_code == 303, done.text
        cookie = {"mb_session": done.cookies["mb_session"]}
        page = httpx.get(f"{base}/", cookies=cookie)
        assert '<span id="who">alice (operator)</span>' in page.text
    with console(backend_url, port) as base:  # restarted: the same cookie is logged in
        page = httpx.get(f"{base}/", cookies=cookie)
        assert page.status_code == 200
        assert '<span id="who">alice (operator)</span>' in page.text
        if backend_url.startswith("duckdb"):  # the console holds the file: sent to it
            disabled = run_process(["--url", backend_url, "users", "disable", "alice"])
            added = run_process(
                ["--url", backend_url, "users", "add", "carol", "--role", "reader",
                 "--password-stdin"],
                stdin=b"another good secret\n",
            )  # fmt: skip
            assert added.returncode == 0, added.stderr
            login = httpx.post(
                f"{base}/login", data={"user": "carol", "password": "another good secret"}
            )
            assert login.status_code == 303
        else:  # PostgreSQL: any process disables her
            disabled = run_cli(["--url", backend_url, "users", "disable", "alice"])
        assert disabled.returncode == 0, disabled.stderr
        away = httpx.get(f"{base}/", cookies=cookie)
        assert away.status_code == 303
        assert away.headers["location"].startswith("/login")
    with MessageBox(backend_url) as box:
        served = [r for r in box.audit_log() if r.action == "users disable"]
        assert [r.via for r in served] == (
            ["served"] if backend_url.startswith("duckdb") else ["cli"]
        )
