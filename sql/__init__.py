"""Hand-written SQL, by dialect and name.

Each ``<dialect>.sql`` file holds statements under ``-- name: <name> --`` headers;
``common.sql`` holds the ones every dialect shares. :func:`load` returns one by name,
the dialect's own version first.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_]+) --\s*$", re.MULTILINE)


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
            return queries[name]
    raise KeyError(f"no SQL statement {name!r} for dialect {dialect!r}")
