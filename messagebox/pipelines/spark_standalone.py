"""A Spark standalone cluster on this machine, from the installed pyspark: a master and
workers as child processes, to try a job on a real cluster (executors in their own
JVMs, tasks sent over the network) without one at hand.

    from messagebox.pipelines.spark import session
    from messagebox.pipelines.spark_standalone import StandaloneCluster

    with StandaloneCluster(workers=2, cores=1, memory="1g") as cluster:
        spark = session(cluster.master, **{"spark.executor.memory": "1g"})
        ...
        spark.stop()

Each daemon runs ``bin/spark-class`` of the pyspark package (Java 17 on the ``PATH`` or
in ``JAVA_HOME``) in a folder of its own under ``folder`` (by default a temporary one,
removed at :meth:`~StandaloneCluster.stop`), its output in ``<name>.log`` there;
executors run in their worker's folder. :meth:`~StandaloneCluster.start` returns once
the master's web UI (``/json/``) lists every worker ALIVE, or raises
:class:`~messagebox.errors.MessageBoxError` with the end of the logs;
:meth:`~StandaloneCluster.stop` ends every process it started (and their executors).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from messagebox.errors import MessageBoxError

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def spark_class() -> Path:
    """The ``spark-class`` launcher of the installed pyspark."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` (for their
    executors) each, on 127.0.0.1; ``env`` adds to the daemons' environment."""

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    daemon_memory: str = "256m"
    """Heap of the master and worker JVMs themselves."""
    folder: Path | None = None
    timeout: float = 90.0
    """Seconds :meth:`start` waits for the master and the workers."""
    env: dict[str, str] = field(default_factory=dict)
    master: str = field(init=False, default="")
    """``spark://127.0.0.1:<port>`` once started."""
    ui: str = field(init=False, default="")
    """The master's web UI, ``http://127.0.0.1:<port>``."""
    _processes: list[tuple[str, subprocess.Popen[bytes]]] = field(init=False, default_factory=list)
    _own_folder: bool = field(init=False, default=False)

    def start(self) -> StandaloneCluster:
        """Start the master, wait for it, start the workers, wait for them all."""
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="messagebox-spark-cluster-"))
            self._own_folder = True
        port, ui_port = _free_port(), _free_port()
        self.master, self.ui = f"spark://{HOST}:{port}", f"http://{HOST}:{ui_port}"
        try:
            self._spawn("master", "master", "--port", str(port), "--webui-port", str(ui_port))
            # workers started before the master is up wait 5-15 s to try again
            self._wait(lambda status: status.get("status") == "ALIVE", "the master")
            for i in range(self.workers):
                self._spawn(
                    f"worker-{i}",
                    "worker",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(self.folder / f"worker-{i}" / "work"),
                    self.master,
                )
            self._wait(lambda status: len(_alive(status)) >= self.workers, "the workers")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, role: str, *args: str) -> None:
        assert self.folder is not None
        here = self.folder / name
        here.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            SPARK_HOME=str(spark_class().parent.parent),
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_LOCAL_IP=HOST,
        )
        env.update(self.env)
        main = f"org.apache.spark.deploy.{role}.{role.capitalize()}"
        with open(self.folder / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                [str(spark_class()), main, "--host", HOST, *args],
                cwd=here,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its executors join its process group
            )
        self._processes.append((name, process))

    def status(self) -> dict[str, Any]:
        """The master's ``/json/`` status (workers, cores, applications)."""
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=2) as response:
            status: dict[str, Any] = json.load(response)
        return status

    def _wait(self, ready: Callable[[dict[str, Any]], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            for name, process in self._processes:
                if process.poll() is not None:
                    raise MessageBoxError(
                        f"Spark {name} exited with {process.returncode}:\n{self.log_tail(name)}"
                    )
            try:
                if ready(self.status()):
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                tails = "\n".join(self.log_tail(name) for name, _ in self._processes)
                raise MessageBoxError(
                    f"{what} of {self.master} not up in {self.timeout:g} s\n{tails}"
                )
            time.sleep(0.2)

    def log_tail(self, name: str, lines: int = 15) -> str:
        """The last lines of a daemon's log (``master``, ``worker-0``…)."""
        assert self.folder is not None
        try:
            text = (self.folder / f"{name}.log").read_text(errors="replace")
        except OSError:
            return f"[{name}: no log]"
        return "\n".join(f"[{name}] {line}" for line in text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """End the workers (and their executors), then the master: SIGTERM to each
        process group, SIGKILL after ``timeout`` seconds."""
        for _, process in reversed(self._processes):
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, process in reversed(self._processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.wait(5)
            _signal(process, signal.SIGKILL)  # what is left of its group (executors)
        self._processes.clear()
        if self._own_folder and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _alive(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the process group the process leads (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
