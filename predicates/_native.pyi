from collections.abc import Callable, Hashable, Mapping
from typing import Any

def match(
    packed: dict[str, tuple[Any, ...]], unanchored: dict[int, Any], properties: Mapping[str, Any]
) -> set[Any]: ...
def setup(
    family_map: dict[type, int],
    family_fn: Callable[[Any], int],
    key_true: Hashable,
    key_false: Hashable,
    codes: tuple[int, ...],
) -> None: ...
