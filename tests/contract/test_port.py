"""The port names exactly what host instances call on their store: every attribute
``hosts/`` reads off a consumer (``self.queue``, a part's ``self._queue``, ``queue``
as the parts are built, ``box.consumer(...)``) is a member of
:class:`messagebox.port.HostStore`, and every member is read somewhere."""

from __future__ import annotations

import ast
from pathlib import Path

from messagebox.port import HostStore

HOSTS = Path(__file__).resolve().parents[2] / "messagebox" / "hosts"


def _used() -> set[str]:
    """The attributes read off a consumer in ``hosts/``."""
    found: set[str] = set()
    for path in HOSTS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute):
                continue
            inner = node.value
            if (isinstance(inner, ast.Attribute) and inner.attr in ("queue", "_queue")) or (
                isinstance(inner, ast.Name) and inner.id == "queue"
            ):
                found.add(node.attr)  # self.queue.X, a part's self._queue.X, queue.X
            elif (
                isinstance(inner, ast.Call)
                and isinstance(inner.func, ast.Attribute)
                and inner.func.attr == "consumer"
            ):
                found.add(node.attr)  # box.consumer(host, owner).X
    return found


def _members() -> set[str]:
    return {name for name in vars(HostStore) if not name.startswith("_")}


def test_hosts_use_only_the_port() -> None:
    assert _used() - _members() == set()


def test_every_member_of_the_port_is_used_by_hosts() -> None:
    assert _members() - _used() == set()
