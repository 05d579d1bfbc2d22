"""Hand-written SQL, by dialect and name.

Each ``<dialect>.sql`` file holds statements under ``-- name: <name> --`` headers;
``common.sql`` holds the ones every dialect shares. :func:`load` returns one by name,
the dialect's own version first. A line ``-- include: <name>`` in a statement stands
for the dialect's fragment of that name (a clause several statements share);
``-- include: <name>(param=value, ...)`` puts each ``value`` for the fragment's
``%(param)s`` (a function's argument, where the fragment is part of its body).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_]+) --\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^-- include: ([a-z_]+)(?:\(([a-z_=, ]*)\))?\s*$", re.MULTILINE)


@cache
def _parse(filename: str) -> dict[str, str]:
    text = resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")
    pieces = _HEADER.split(text)
    return {name: body.strip() for name, body in zip(pieces[1::2], pieces[2::2], strict=True)}


def load(dialect: str, name: str) -> str:
    """The statement ``name`` for ``dialect`` (falling back to ``common.sql``)."""
    for filename in (f"{dialect}.sql", "common.sql"):
        try:
            queries = _parse(filename)
        except FileNotFoundError:
            continue
        if name in queries:
            return _INCLUDE.sub(lambda m: _include(dialect, m), queries[name])
    raise KeyError(f"no SQL statement {name!r} for dialect {dialect!r}")


def _include(dialect: str, m: re.Match[str]) -> str:
    text = load(dialect, m.group(1))
    for pair in filter(None, (m.group(2) or "").split(",")):
        param, _, value = (part.strip() for part in pair.partition("="))
        placeholder = f"%({param})s"
        if not value or placeholder not in text:
            raise KeyError(f"include {m.group(1)!r} has no parameter {param!r} to set")
        text = text.replace(placeholder, value)
    return text
