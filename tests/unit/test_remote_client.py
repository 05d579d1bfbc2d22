"""The command line's side of a served command (``--url http://…``,
:func:`messagebox.cli.remote.forward`) against a broken or hostile server, a tiny
``http.server`` in a thread: a redirect is not followed (the token goes nowhere else),
an answer of the wrong shape or not JSON is a clear error, an error page is shown
shortened, and a server that never answers is given up on; never a traceback or a hang.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from messagebox.cli import remote
from tests.cli_support import run_cli

TOKEN = "a-token"
Answer = Callable[[http.server.BaseHTTPRequestHandler], None]


class Server:
    """An HTTP server in a thread answering every request with ``answer``; it records
    the requests it got (path and headers)."""

    def __init__(self, answer: Answer) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._handle()

            def _handle(self) -> None:
                server.requests.append((self.path, dict(self.headers.items())))
                answer(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def servers() -> Iterator[Callable[[Answer], Server]]:
    started: list[Server] = []

    def start(answer: Answer) -> Server:
        started.append(Server(answer))
        return started[-1]

    yield start
    for s in started:
        s.close()


def reply(status: int, body: bytes, **headers: str) -> Answer:
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            h.send_header(name.replace("_", "-"), value)
        h.end_headers()
        h.wfile.write(body)

    return answer


def served_answer(exit: int = 0, stdout: bytes = b"", stderr: bytes = b"") -> bytes:
    return json.dumps(
        {
            "exit": exit,
            "stdout": base64.b64encode(stdout).decode(),
            "stderr": base64.b64encode(stderr).decode(),
        }
    ).encode()


def cli(url: str, *argv: str) -> tuple[int, str, str]:
    done = run_cli(["--url", url, *argv], env={"MESSAGEBOX_CONSOLE_TOKEN": TOKEN})
    return done.returncode, done.stdout, done.stderr


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(
    servers: Callable[[Answer], Server], tmp_path: Path
) -> None:
    elsewhere = servers(reply(200, served_answer(0), Content_Type="application/json"))
    location = f"{elsewhere.url}/api/v1/cli"
    redirecting = servers(reply(302, b"", Location=location))
    body = tmp_path / "order.xml"
    body.write_bytes(b"<order/>")

    code, _, err = cli(redirecting.url, "publish", str(body), "-p", "a.B=1")

    assert code == 1, err
    assert elsewhere.requests == []  # neither followed nor sent the token
    assert "302" in err
    assert location in err
    [(_, headers)] = redirecting.requests
    assert headers["Authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    "answer",
    [
        b'{"exit": "0", "stdout": "", "stderr": ""}',
        b'{"exit": true, "stdout": "", "stderr": ""}',
        b'{"exit": 0}',
        b'{"exit": 0, "stdout": "not base64!", "stderr": ""}',
        b'{"exit": 0, "stdout": "", "stderr": 5}',
        b"[1, 2]",
        b"null",
    ],
)
def test_an_answer_of_the_wrong_shape_is_a_clear_error(
    servers: Callable[[Answer], Server], answer: bytes
) -> None:
    wrong = servers(reply(200, answer, Content_Type="application/json"))

    code, out, err = cli(wrong.url, "stats")

    assert (code, out) == (1, ""), err
    assert "not a served command's answer" in err
    assert wrong.url in err


def test_an_answer_that_is_not_json_is_a_clear_error(
    servers: Callable[[Answer], Server],
) -> None:
    html = servers(reply(200, b"<html><body>a login page</body></html>", Content_Type="text/html"))

    code, _, err = cli(html.url, "stats")

    assert code == 1
    assert "not JSON" in err
    assert "<html>" not in err


def test_an_error_page_is_shown_shortened(servers: Callable[[Answer], Server]) -> None:
    page = (
        b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body>\n"
        + b"<p>nothing here</p>\n" * 500
        + b"</body></html>\n"
    )
    missing = servers(reply(404, page, Content_Type="text/html"))

    code, _, err = cli(missing.url, "stats")

    assert code == 1
    assert "answered 404" in err
    assert "404 Not Found" in err
    assert "<p>" not in err
    assert len(err) < 400, err


def test_a_long_plain_error_is_cut_to_its_first_line(servers: Callable[[Answer], Server]) -> None:
    failing = servers(reply(500, b"x" * 5000 + b"\nsecond line\n", Content_Type="text/plain"))

    code, _, err = cli(failing.url, "stats")

    assert code == 1
    assert "answered 500" in err
    assert "second line" not in err
    assert len(err) < 400, err


def test_a_server_that_never_answers_is_given_up_on(
    servers: Callable[[Answer], Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(_: http.server.BaseHTTPRequestHandler) -> None:
        silent.release.wait(60)  # until the test ends

    silent = servers(never)
    monkeypatch.setattr(remote, "TIMEOUTS", remote.Timeouts(connect=2.0, idle=0.3))

    code, _, err = cli(silent.url, "stats")

    assert code == 1
    assert "no answer" in err
    assert "0.3 s" in err
    assert len(silent.requests) == 1  # it was asked, and said nothing


def test_a_server_that_is_not_there_is_a_clear_error(servers: Callable[[Answer], Server]) -> None:
    gone = servers(reply(200, b""))
    url = gone.url
    gone.close()

    code, _, err = cli(url, "stats")

    assert code == 1
    assert "does not answer" in err
    assert url in err
