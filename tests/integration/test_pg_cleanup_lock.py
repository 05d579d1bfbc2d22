"""PostgreSQL: one cleanup at a time per store, not per database. Stores in two schemas of
one database used to share the cleanup lock, so a long cleanup of one made the other's
skip its turn (seen: a stuck cleanup of one store starved another's for minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from messagebox import Message, MessageBox
from messagebox.predicates import P
from tests.conftest import claim, complete, scratch_url

pytestmark = pytest.mark.postgres


def test_a_cleanup_in_another_schema_does_not_skip_this_one(tmp_path: Path) -> None:
    with (
        scratch_url("postgresql", tmp_path) as url_a,
        scratch_url("postgresql", tmp_path) as url_b,
        MessageBox(url_a) as a,
        MessageBox(url_b) as b,
    ):
        # Given a message of store B that nothing references any more
        b.create_host("h")
        b.subscribe("svc", host="h", filter=P("t.N") >= 0)
        b.publish([Message(b"x", promoted={"t.N": 1})])
        [c] = claim(b, "h")
        complete(b, c)
        # When store A's cleanup holds its lock (a cleanup in progress) while B cleans up
        with a.store.transaction() as conn:
            assert a.store.dialect.try_lock_cleanup(conn)
            report = b.cleanup()
            # Then B's cleanup ran, and deleted the message
            assert not report.skipped
            assert report.messages == 1
            # while a second cleanup of A itself skips its turn
            assert a.cleanup().skipped
