"""Finding and making convoys (``messagebox.routing.convoys``, the dialect's ``find_convoys`` and
``create_convoys``), on both backends: a new pair gets a new instance and keeps it, an
existing pair is only read, keys of any text come back as they went in, and more pairs
than one statement takes are all answered."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from messagebox import MessageBox
from messagebox.routing import convoys
from messagebox.storage import schema, store_clock


def _resolve(box: MessageBox, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    with box.store.transaction(serial=True) as conn:
        return convoys.resolve_convoys(conn, box.store.dialect, pairs, store_clock.now(conn))


def _find(box: MessageBox, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    with box.store.transaction() as conn:
        return convoys.find_convoys(conn, box.store.dialect, pairs)


def _rows(box: MessageBox) -> dict[tuple[str, str], str]:
    c = schema.convoy
    with box.store.transaction() as conn:
        rows = conn.execute(sa.select(c.c.service, c.c.key, c.c.instance_id)).all()
    return {(r.service, r.key): r.instance_id for r in rows}


def test_new_pairs_get_instances_that_stay_theirs(box: MessageBox) -> None:
    first = _resolve(box, [("pick", "a"), ("pick", "b"), ("pack", "a")])
    assert sorted(first) == [("pack", "a"), ("pick", "a"), ("pick", "b")]
    assert len(set(first.values())) == 3
    assert _rows(box) == first
    # a pair asked for again, beside a new one: the old one is read, not made again
    again = _resolve(box, [("pick", "a"), ("pick", "c")])
    assert again[("pick", "a")] == first[("pick", "a")]
    assert again[("pick", "c")] not in first.values()
    assert _rows(box) == {**first, **again}


def test_find_answers_only_pairs_that_exist(box: MessageBox) -> None:
    made = _resolve(box, [("pick", "a"), ("pack", "b")])
    # the same key under another service, and a service with another key, are not found
    found = _find(box, [("pick", "a"), ("pick", "b"), ("pack", "a"), ("pack", "b"), ("x", "y")])
    assert found == made
    assert _find(box, []) == {}


KEYS = [
    'a "quoted" key',
    "back\\slash",
    "comma, and {braces}",
    "é ü 漢字",
    "NULL",
    "",
    " spaces ",
    '["json",1]',
]


def test_keys_of_any_text_come_back_as_they_went_in(box: MessageBox) -> None:
    pairs = [("svc", k) for k in KEYS] + [('s"v,c', k) for k in KEYS[:3]]
    made = _resolve(box, pairs)
    assert sorted(made) == sorted(pairs)
    assert _find(box, pairs) == made
    assert _resolve(box, pairs) == made


def test_more_pairs_than_one_statement_takes(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(convoys, "_CHUNK", 7)
    early = _resolve(box, [("svc", f"k{i:03d}") for i in range(0, 50, 3)])
    pairs = [("svc", f"k{i:03d}") for i in range(50)]
    made = _resolve(box, pairs)
    assert sorted(made) == pairs
    assert all(made[p] == early[p] for p in early)  # the chunks that held old pairs read them
    assert len(set(made.values())) == 50
    assert _find(box, pairs) == made == _rows(box)
