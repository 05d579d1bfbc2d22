"""The compact column forms of ``Dialect.insert`` read as the lists they stand for."""

from __future__ import annotations

import pytest

from messagebox.storage.dialects import Indexed, Same


@pytest.mark.parametrize(
    ("column", "plain"),
    [
        (Same("x", 3), ["x", "x", "x"]),
        (Same(None, 0), []),
        (Indexed(["a", "b", "c"], [2, 0, 2, 1]), ["c", "a", "c", "b"]),
        (Indexed([], []), []),
    ],
)
def test_a_compact_column_reads_as_its_list(
    column: Same[str] | Indexed[str], plain: list[str]
) -> None:
    assert len(column) == len(plain)
    assert list(column) == plain
    assert [column[i] for i in range(-len(plain), len(plain))] == plain + plain
    assert column[1:3] == plain[1:3]
    assert column[::-1] == plain[::-1]
    with pytest.raises(IndexError):
        column[len(plain)]
