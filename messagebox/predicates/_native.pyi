from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

class Groups:
    """Filed groups compiled by compile(): read by match()."""

    def __len__(self) -> int: ...

def compile(
    groups: Sequence[tuple[Any, Any, tuple[Any, ...]]], bounds: Sequence[Any] | None = ...
) -> Groups: ...
def match(
    packed: dict[str, tuple[Any, ...]], unanchored: Groups | None, properties: Mapping[str, Any]
) -> list[Any]: ...
def match_all(
    packed: dict[str, tuple[Any, ...]], unanchored: Groups | None, batch: list[dict[str, Any]]
) -> tuple[list[Any], list[int]]: ...
def setup(
    family_map: dict[type, int],
    family_fn: Callable[[Any], int],
    key_true: Hashable,
    key_false: Hashable,
    codes: tuple[int, ...],
) -> None: ...
