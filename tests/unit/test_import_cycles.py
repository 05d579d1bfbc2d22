"""The project's modules import each other without cycles (tests/import_cycles.py)."""

from __future__ import annotations

from tests import import_cycles


def test_no_import_cycle_between_the_project_s_modules() -> None:
    edges = import_cycles.graph()
    assert "messagebox.routing.router" in edges  # it read the tree
    assert "messagebox.routing.convoys" in edges["messagebox.routing.router"]
    assert import_cycles.cycles(edges) == []


def test_the_check_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles.cycles(edges) == [["a", "b", "c"]]
