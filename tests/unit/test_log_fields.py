"""The fields a log line carries (``extra=``, and the host's ``_event(...)`` fields) never
take a name the log record has already (``thread``, ``name``, ``process``, ...): the
logging module raises ``KeyError`` for such a line, so the event would be lost and the
code logging it would fail, at the moment something needed reporting."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESERVED = set(vars(logging.LogRecord("x", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _fields(call: ast.Call) -> list[str]:
    """The field names a call gives a log line: the keywords of ``_event(...)`` and the
    constant keys of an ``extra={...}``."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    names = [kw.arg for kw in call.keywords if kw.arg] if name == "_event" else []
    for kw in call.keywords:
        if kw.arg == "extra" and isinstance(kw.value, ast.Dict):
            names += [
                k.value
                for k in kw.value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
    return names


def test_no_log_field_takes_a_name_of_the_log_record() -> None:
    sources = sorted((ROOT / "messagebox").rglob("*.py")) + sorted((ROOT / "hosts").rglob("*.py"))
    clashes: list[str] = []
    checked = 0
    for path in sources:
        if path.is_symlink() or any(p.is_symlink() for p in path.parents if p != ROOT):
            continue  # messagebox/hosts is hosts/
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fields = _fields(node)
                checked += len(fields)
                clashes += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in fields if n in RESERVED
                ]
    assert checked > 50  # the scan found the log calls
    assert clashes == []


def test_a_clashing_field_is_refused_by_logging() -> None:
    """What the test above guards against."""
    with pytest.raises(KeyError, match="thread"):
        logging.getLogger("messagebox.test").warning("x", extra={"thread": "t"})
