"""The hand-written SQL files: statements by name, fragments included, with the
arguments an include puts for a fragment's parameters."""

from __future__ import annotations

import pytest

from messagebox import sql


def test_an_include_puts_the_fragment_and_its_arguments() -> None:
    plain = sql.load("postgresql", "claim")
    assert "lease_owner = %(owner)s" in plain  # the fragment, its parameters kept
    body = sql.load("postgresql", "keyed_runs_function")
    assert "lease_owner = p_owner" in body  # the function's arguments put in
    assert "make_interval(secs => p_lease)" in body
    assert "-- include:" not in body
    assert "%(" not in body


def test_an_include_naming_a_parameter_the_fragment_lacks_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = sql._parse("postgresql.sql")
    monkeypatch.setattr(
        sql,
        "_parse",
        lambda filename: {**real, "bad": "UPDATE t\n-- include: claim_set(owner=x, nope=y)"},
    )
    with pytest.raises(KeyError, match="'claim_set' has no parameter 'nope'"):
        sql.load("postgresql", "bad")


def test_an_unknown_statement_is_refused_naming_it() -> None:
    with pytest.raises(KeyError, match="no SQL statement 'nothing' for dialect 'postgresql'"):
        sql.load("postgresql", "nothing")
