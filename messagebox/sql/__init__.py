"""Hand-written SQL, by dialect and name.

Each ``<dialect>.sql`` file holds statements under ``-- name: <name> --`` headers;
``common.sql`` holds the ones every dialect shares. :func:`load` returns one by name,
the dialect's own version first. A line ``-- include: <name>`` in a statement stands
for the dialect's fragment of that name (a clause several statements share).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_]+) --\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^-- include: ([a-z_]+)\s*$", re.MULTILINE)


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
            return _INCLUDE.sub(lambda m: load(dialect, m.group(1)), queries[name])
    raise KeyError(f"no SQL statement {name!r} for dialect {dialect!r}")
