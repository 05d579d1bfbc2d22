"""A command run by the process that holds the store (:func:`messagebox.console.served.serve`),
on both backends: the same output and exit codes as run from the command line, with
its files and standard input taken from what was sent."""

from __future__ import annotations

import base64
import json

from messagebox import MessageBox
from messagebox.console.served import serve


def run(
    box: MessageBox, *argv: str, files: dict[str, bytes] | None = None, stdin: bytes = b""
) -> tuple[int, bytes, str]:
    answer = serve(
        box,
        {
            "argv": list(argv),
            "files": {k: base64.b64encode(v).decode() for k, v in (files or {}).items()},
            "stdin": base64.b64encode(stdin).decode(),
        },
    )
    return (
        answer["exit"],
        base64.b64decode(answer["stdout"]),
        base64.b64decode(answer["stderr"]).decode(),
    )


def test_a_served_command_reads_what_was_sent_and_answers_as_the_cli(box: MessageBox) -> None:
    box.create_host("h")
    code, _, err = run(
        box,
        "subscriptions",
        "add",
        "s",
        "--host",
        "h",
        "--filter",
        "@f.txt",
        files={"f.txt": b"a.B >= 1"},
    )
    assert code == 0, err
    body = b"\x00\xff not text"
    code, out, err = run(
        box, "--json", "publish", "body.bin", "-p", "a.B=2", files={"body.bin": body}
    )
    assert code == 0, err
    [routed] = json.loads(out)
    assert routed["outcome"] == "routed"
    code, out, err = run(box, "--json", "publish", "-p", "a.B=3", stdin=b"from stdin")
    assert code == 0, err
    [from_stdin] = json.loads(out)
    assert box.read_message(from_stdin["message_id"]).body == b"from stdin"
    code, out, err = run(box, "messages", "show", routed["message_id"])
    assert (code, out) == (0, body), err
    [added] = [r for r in box.audit_log() if r.action == "subscriptions add"]
    assert (added.via, added.who) == ("served", "token holder at an unknown address")


def test_served_errors_keep_their_exit_codes(box: MessageBox) -> None:
    assert run(box, "publish", "missing.bin")[0] == 2  # a file that was not sent
    code, _, err = run(box, "suspended", "show", "12345")
    assert code == 3
    assert "12345" in err
    code, _, err = run(box, "queues", "--no-such-option")
    assert code == 2
    assert "unrecognized arguments" in err
    code, _, err = run(box, "console")
    assert code == 2
    assert "not served" in err


def test_the_api_refuses_a_malformed_request_and_runs_nothing(box: MessageBox) -> None:
    import warnings

    from messagebox.console import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    api = TestClient(create_app(box, api_token="k"), base_url="http://127.0.0.1:8080")
    auth = {"Authorization": "Bearer k"}
    for body in (b"not json", b"[1, 2]", b'{"argv": "hosts add h"}', b'{"argv": [1]}'):
        refused = api.post("/api/v1/cli", content=body, headers=auth)
        assert refused.status_code == 400, body
        assert "malformed request" in refused.json()["error"]
    assert box.hosts() == []
    assert api.post("/api/v1/cli", json={"argv": ["stats"]}).status_code == 401
    assert (
        api.post(
            "/api/v1/cli", json={"argv": ["stats"]}, headers={"Authorization": "Bearer x"}
        ).status_code
        == 403
    )


def test_a_routing_file_goes_with_plan_and_apply(box: MessageBox) -> None:
    from messagebox.cli.parser import build
    from messagebox.cli.remote import _named_files

    routing = b'[hosts.h]\n[[subscriptions]]\nservice = "s"\nhost = "h"\nfilter = "a.B == 1"\n'
    for command in ("plan", "apply", "lint"):
        assert _named_files(build().parse_args([command, "r.toml"])) == ["r.toml"]
    code, out, err = run(box, "plan", "r.toml", files={"r.toml": routing})
    assert code == 4, err  # a change
    assert b"+ subscription s" in out
    code, out, err = run(box, "apply", "r.toml", files={"r.toml": routing})
    assert code == 0, err
    assert [s.name for s in box.subscriptions()] == ["s"]
    assert run(box, "plan", "r.toml", files={"r.toml": routing})[0] == 0
    assert run(box, "apply", "other.toml")[0] == 2  # not sent
    [applied] = [r for r in box.audit_log() if r.action == "apply"]
    assert applied.via == "served"
    assert box.versions()[0].who == "token holder at an unknown address"
