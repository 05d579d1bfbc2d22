"""Did you mean …?": the known name nearest a misspelt one (:mod:`difflib`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` closest to ``name``, when one is close enough."""
    close = difflib.get_close_matches(name, [k for k in known if k != name], n=1)
    return close[0] if close else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the name of ``known`` nearest ``name``, or ``""``."""
    close = nearest(name, known)
    return "" if close is None else f"; did you mean {close!r}?"
