"""Routing as code as a user runs it, each command its own process, on both backends:
export, plan (exit code 4 for a change), apply, versions, rollback, a refused file (the
other commands and options run in-process: tests/integration/test_routing_as_code.py)."""

from __future__ import annotations

from pathlib import Path

from messagebox import Message, MessageBox
from messagebox.config.routing_file import load
from messagebox.predicates import P
from tests.cli_support import run_process


def test_a_change_from_export_to_rollback(backend_url: str, tmp_path: Path) -> None:
    with MessageBox(backend_url) as box:
        box.create_host("shipping")
        box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
        box.publish([Message(b"o", promoted={"orders.Region": r}) for r in ("EU", "UK")])
    env = {"MESSAGEBOX_URL": backend_url}

    def cli(*argv: str) -> tuple[int, str, str]:
        done = run_process(list(argv), env=env)
        return done.returncode, done.stdout, done.stderr

    code, exported, err = cli("export")
    assert code == 0, err
    path = tmp_path / "routing.toml"
    path.write_text(exported.replace('== "EU"', 'in ["EU", "UK"]'))
    code, out, err = cli("plan", str(path))
    assert code == 4, err
    assert "ship-eu: gains 1" in out
    assert "1 no longer" in out
    code, out, err = cli("apply", str(path))
    assert (code, "applied as version 2" in out) == (0, True), err
    code, out, err = cli("versions")
    assert code == 0, err
    assert "1 change" in out
    code, out, err = cli("rollback", "1")
    assert code == 0, err
    assert "applied again as version 3" in out
    with MessageBox(backend_url) as box:
        assert box.export_config() == load(exported)
    path.write_text(
        exported + '\n[[subscriptions]]\nservice = "x"\nhost = "nowhere"\nfilter = "a.b == 1"\n'
    )
    code, _, err = cli("apply", str(path))
    assert code == 2
    assert f"{path}:" in err
    assert "no host named 'nowhere'" in err
