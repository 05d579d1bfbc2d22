"""The publish path's optional compiled helpers (``messagebox/_native.c``), loaded once.

Built at install time where a C compiler is found; where they are not, or with
``MESSAGEBOX_NATIVE=0``, each caller does the same work in Python (its reference)."""

from __future__ import annotations

import os

__all__ = ["NATIVE", "native"]

try:
    from messagebox import _native as native
except ImportError:  # pragma: no cover (an install without a compiler)
    native = None  # type: ignore[assignment]

NATIVE = native is not None and os.environ.get("MESSAGEBOX_NATIVE", "1") != "0"
"""Whether the callers use the compiled helpers."""
