"""A PostgreSQL primary and a streaming standby on this machine, for failover tests.

Two clusters (``initdb``, ``pg_basebackup -R``) in a folder of their own, on free ports,
run by the ``postgres`` OS user (PostgreSQL's tools refuse root). With ``synchronous``,
the primary waits for the standby to flush each commit before acknowledging it
(``synchronous_standby_names``, ``synchronous_commit = on``); the standby has no
synchronous standby of its own, so that it takes writes once promoted.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"
STANDBY_NAME = "standby1"


def tools_reason() -> str | None:
    """Why a pair cannot be built here (None: it can)."""
    if not (BIN / "initdb").exists():
        return f"no PostgreSQL 15 tools in {BIN}"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER!r} OS user to run PostgreSQL as"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != USER:
        return f"needs root (to run PostgreSQL as {USER!r}) or the {USER!r} user"
    return None


def _as_postgres(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL tool as the ``postgres`` user; its output kept for the error."""
    if os.geteuid() == 0:
        argv = ("runuser", "-u", USER, "--", *argv)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


@dataclass
class Server:
    """One cluster of the pair."""

    name: str
    data: Path
    port: int
    log: Path
    running: bool = field(default=False)

    @property
    def url(self) -> str:
        """A store URL naming this server alone."""
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/postgres"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres connect_timeout=2"

    def start(self) -> None:
        ctl = str(BIN / "pg_ctl")
        _as_postgres(ctl, "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log))
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (``immediate``: as if the machine died)."""
        _as_postgres(str(BIN / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(self.data))
        self.running = False

    def promote(self) -> None:
        """End recovery (``pg_ctl promote``), waiting until it takes writes."""
        _as_postgres(str(BIN / "pg_ctl"), "promote", "-w", "-t", "60", "-D", str(self.data))

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return list(conn.execute(statement).fetchall())


@dataclass
class Pair:
    """A primary and its standby; ``url`` names both, writes going to whichever is the
    primary (``target_session_attrs=read-write``)."""

    root: Path
    primary: Server
    standby: Server
    synchronous: bool

    @property
    def url(self) -> str:
        return (
            f"postgresql+psycopg://{USER}@/postgres?host=127.0.0.1:{self.primary.port}"
            f"&host=127.0.0.1:{self.standby.port}&target_session_attrs=read-write"
            "&connect_timeout=2"
        )

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the standby streams from the primary (synchronously, if so set up)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while True:
            rows = self.primary.query(
                "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
            )
            if rows and rows[0][0] == want:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"standby not streaming ({want}) after {timeout:g} s: {rows}")
            time.sleep(0.1)

    def hold_replication(self) -> None:
        """Stop the primary's WAL senders (SIGSTOP) for good: its commits no longer
        reach the standby, as over a slow or cut link, while (replicating
        asynchronously) it goes on acknowledging them. ``pg_ctl stop -m immediate``
        kills them still (SIGKILL, after 5 s)."""
        for (pid,) in self.primary.query("SELECT pid FROM pg_stat_replication"):
            os.kill(int(pid), signal.SIGSTOP)

    def close(self) -> None:
        """Stop both servers (immediately) and remove their folders."""
        for server in (self.primary, self.standby):
            if server.running or (server.data / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    server.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def _configure(server: Server, lines: list[str]) -> None:
    with (server.data / "postgresql.auto.conf").open("a") as conf:
        conf.write("\n".join(lines) + "\n")


def build(root: Path, ports: tuple[int, int], *, synchronous: bool) -> Pair:
    """Make, start and connect the pair in ``root`` (created, given to ``postgres``); on
    failure, whatever was started is stopped."""
    root.mkdir(parents=True)
    shutil.chown(root, USER, USER)
    root.chmod(0o700)
    primary = Server("primary", root / "primary", ports[0], root / "primary.log")
    standby = Server("standby", root / "standby", ports[1], root / "standby.log")
    pair = Pair(root, primary, standby, synchronous)
    try:
        _as_postgres(
            str(BIN / "initdb"), "-D", str(primary.data), "-U", USER, "-A", "trust", "--no-sync"
        )
        common = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{root}'",
            # throw-away clusters: a primary's processes die here, never the machine
            "fsync = off",
            "wal_level = replica",
            "max_wal_senders = 4",
            "wal_keep_size = '64MB'",
            "autovacuum_naptime = '2s'",
        ]
        sync = [f"synchronous_standby_names = '{STANDBY_NAME}'", "synchronous_commit = on"]
        _configure(primary, [*common, f"port = {primary.port}", *(sync if synchronous else [])])
        primary.start()
        _as_postgres(
            str(BIN / "pg_basebackup"),
            "-D",
            str(standby.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            USER,
            "-d",
            f"application_name={STANDBY_NAME}",
        )
        _configure(standby, [f"port = {standby.port}", "synchronous_standby_names = ''"])
        standby.start()
        pair.wait_streaming()
    except BaseException:
        pair.close()
        raise
    return pair
