"""A store whose connections all die at once (a failover, a restart: here the server
ends them, ``pg_terminate_backend``) fails one transaction, as ``BackendUnavailable``,
replaces every pooled connection made before it without trying them (the one that
failed under the driver's own cursor is dropped, not rolled back: no error logged by
the pool), and logs the outage once: ``store-lost``, then ``store-back`` with its
length."""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest

from messagebox import BackendUnavailable, Message, MessageBox
from messagebox.predicates import P
from messagebox.storage.dialects import postgresql
from tests.conftest import PG_DSN

pytestmark = pytest.mark.postgres


def terminate(application: str) -> int:
    """End every session of ``application``; how many there were."""
    dsn = PG_DSN.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            [application],
        ).fetchone()
        while conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s", [application]
        ).fetchone():
            pass  # until the server has ended them
    return int(ended[0]) if ended else 0


def test_one_transaction_fails_and_the_pool_is_replaced(
    pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a pooled connection is used as it is (no test of idle ones): the dead ones fail
    monkeypatch.setattr(postgresql, "PING_AFTER_IDLE_SECONDS", 3600.0)
    application = f"mb-lost-{uuid.uuid4().hex[:8]}"
    with MessageBox(f"{pg_url}&application_name={application}") as box:
        box.create_host("h")
        box.subscribe("s", host="h", filter=P("t.N") >= 0)
        [first] = box.publish([Message(b"x", promoted={"t.N": 0})])
        with box.store.transaction(), box.store.transaction(), box.store.transaction():
            pass  # three connections in the pool
        assert terminate(application) >= 3
        caplog.set_level(logging.INFO, logger="messagebox.store")
        with pytest.raises(BackendUnavailable, match="cannot reach PostgreSQL"):
            box.read_messages([first.message_id])  # on the driver's own cursor
        for n in range(1, 4):  # each on a fresh connection
            box.publish([Message(b"x", promoted={"t.N": n})])
        assert sum(q.depth for q in box.queue_depth()) == 4
    assert [r.getMessage() for r in caplog.records if r.name.startswith("sqlalchemy")] == []
    lines = [r for r in caplog.records if r.name == "messagebox.store"]
    assert [getattr(r, "event", None) for r in lines] == ["store-lost", "store-back"]
    assert float(getattr(lines[1], "outage_seconds", -1)) >= 0
