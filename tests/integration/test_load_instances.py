"""Loading service instances for their steps (``service_instances.load``, the dialect's
``load_instances``), on both backends: a saved instance comes back as stored, a
convoy's instance whose first step has not committed is reported as such, unknown
ids are left out, and a load of more ids than one statement takes reads them all."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from messagebox import MessageBox
from messagebox.delivery import service_instances
from messagebox.models import InstanceState
from messagebox.properties import encode_value
from messagebox.routing import convoys
from messagebox.storage import schema, store_clock


def _save(box: MessageBox, ids: list[str], completed: set[str]) -> datetime:
    """Store instances (``inst-…``) as steps would have; returns their completion time."""
    done_at = datetime(2026, 11, 28, 12, 30, 15, 123456, tzinfo=UTC)
    n = len(ids)
    with box.store.transaction(serial=True) as conn:
        box.store.dialect.insert(
            conn,
            schema.service_instance,
            {
                "id": ids,
                "service": ["picking"] * n,
                "host": ["h"] * n,
                "state": [
                    (InstanceState.COMPLETED if i in completed else InstanceState.RUNNING).value
                    for i in ids
                ],
                "correlation": [
                    json.dumps({"t.Order": encode_value(k), "t.Lot": encode_value(1.5)})
                    for k in range(n)
                ],
                "data": [json.dumps({"n": k, "tags": ["a", "é"]}) for k in range(n)],
                "version": [k + 1 for k in range(n)],
                "created_at": [done_at - timedelta(hours=1)] * n,
                "updated_at": [done_at] * n,
                "completed_at": [done_at if i in completed else None for i in ids],
            },
        )
    return done_at


def test_saved_instances_and_convoys_come_back_as_stored(box: MessageBox) -> None:
    ids = [f"inst-{k:04d}" for k in range(5)]
    done_at = _save(box, ids, completed={"inst-0003"})
    with box.store.transaction(serial=True) as conn:  # a convoy whose first step is due
        [pending] = convoys.resolve_convoys(
            conn, box.store.dialect, [("picking", "k-9")], store_clock.now(conn)
        ).values()
    with box.store.transaction(autocommit=True) as conn:
        found, pending_ids = service_instances.load(
            conn, box.store.dialect, [*ids, pending, "inst-unknown", ids[0]]
        )
    assert pending_ids == {pending}
    assert sorted(found) == ids
    for k, instance_id in enumerate(ids):
        stored = found[instance_id]
        assert (stored.id, stored.service, stored.host, stored.version) == (
            instance_id,
            "picking",
            "h",
            k + 1,
        )
        assert stored.correlation == {"t.Order": k, "t.Lot": 1.5}
        assert stored.data == {"n": k, "tags": ["a", "é"]}
        if instance_id == "inst-0003":
            assert stored.state is InstanceState.COMPLETED
            assert stored.completed_at == done_at
        else:
            assert (stored.state, stored.completed_at) == (InstanceState.RUNNING, None)


def test_a_load_of_more_ids_than_a_statement_takes_reads_them_all(box: MessageBox) -> None:
    ids = [f"inst-{k:05d}" for k in range(service_instances._CHUNK + 7)]
    _save(box, ids, completed=set())
    with box.store.transaction(autocommit=True) as conn:
        found, pending = service_instances.load(conn, box.store.dialect, ids)
    assert sorted(found) == ids
    assert pending == set()
