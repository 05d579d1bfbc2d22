"""Compiled helpers of the publish path (messagebox/_native.c); ids.py falls back."""

import uuid
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import Any

def setup(uuid_type: type[uuid.UUID], is_safe: uuid.SafeUUID, /) -> None: ...
def uuid7s(ms: int, random: bytes, /) -> list[uuid.UUID]: ...
def uuid_bytes(values: Sequence[object], /) -> bytes: ...
def setup_values(utc: tzinfo, encode_value: Callable[[Any], list[Any]], /) -> None: ...
def typed(props: dict[str, Any], /) -> dict[str, list[Any]]: ...
def context_json(promoted: Any, written: Any, /) -> str | None: ...

_Ints = list[int]
Columns = tuple[list[str], _Ints, list[str], _Ints, _Ints, list[str], _Ints, _Ints, list[Any]]
"""message_columns' columns (spool.message_rows): context, n_parts, body_part; then per
part, its message's position, idx, name, size, n_fragments and first fragment."""

def message_columns(messages: list[Any], fragment_size: int, /) -> Columns | None: ...
def routed(
    cls: type[Any],
    ids: Sequence[uuid.UUID],
    counts: list[int],
    subs: tuple[int, ...],
    routed: Any,
    unmatched: Any,
    /,
) -> list[Any]: ...
