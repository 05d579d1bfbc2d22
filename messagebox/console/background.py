"""The console served from a thread of a process that does other work (``messagebox host
run``), so that the store it holds open can be watched and steered while it runs."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from messagebox.errors import MessageBoxError

if TYPE_CHECKING:
    from starlette.applications import Starlette

STARTUP_SECONDS = 15.0


class BackgroundServer:
    """uvicorn serving ``app`` on ``bind:port`` (0: a free port) from a daemon thread."""

    def __init__(self, app: Starlette, bind: str, port: int) -> None:
        import uvicorn

        self.bind = bind
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=bind,
                port=port,
                log_level="warning",
                log_config=None,  # its records go to the root logger, as text or JSON
                lifespan="off",
                ws="none",
                # the client is the socket peer; X-Forwarded-For only from the proxies
                # the operator names (messagebox.console.clients), never uvicorn's default
                proxy_headers=False,
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="console", daemon=True)

    def start(self) -> str:
        """Serve; returns the address (``http://HOST:PORT``) once it listens."""
        self._thread.start()
        deadline = time.monotonic() + STARTUP_SECONDS
        while not self._server.started:
            if not self._thread.is_alive():
                raise MessageBoxError(f"cannot serve the console on {self.bind} (see the log)")
            if time.monotonic() > deadline:
                self.stop()
                raise MessageBoxError(f"the console on {self.bind} did not start in time")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"http://{host}:{port}"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking requests; wait (``timeout`` seconds at most) for those in flight
        (a bulk action) to finish."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
