"""The schema version stored in the database: additive upgrades run on open, anything
else is refused with a clear error (both backends)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.errors import StorageError
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.conftest import claim


def make_version_3(conn: sa.Connection) -> None:
    """Turn a fresh database into what version 3 made: no correlation column, no
    convoys or timers, and the old service-instance table."""
    conn.execute(sa.text("DROP TABLE mb_convoy"))
    conn.execute(sa.text("DROP TABLE mb_timer"))
    conn.execute(sa.text("DROP TABLE mb_service_instance"))
    conn.execute(
        sa.text(
            "CREATE TABLE mb_service_instance (id TEXT PRIMARY KEY, service TEXT NOT NULL, "
            "state TEXT NOT NULL, created_at TIMESTAMP WITH TIME ZONE NOT NULL, "
            "completed_at TIMESTAMP WITH TIME ZONE)"
        )
    )
    conn.execute(sa.text("ALTER TABLE mb_subscription DROP COLUMN correlation"))


def set_version(box: MessageBox, version: str, *, old_tables: bool = False) -> None:
    with box.store.transaction() as conn:
        pg = box.store.dialect.name == "postgresql"
        if old_tables and pg:  # before 22: no per-key order
            conn.execute(sa.text("DROP FUNCTION mb_claim_keyed"))
            conn.execute(sa.text("ALTER TABLE mb_queue DROP COLUMN key_lease"))  # its index too
            conn.execute(sa.text("ALTER TABLE mb_queue DROP COLUMN key_last"))
        if old_tables:  # (dropping order_key drops its indexes on PostgreSQL)
            conn.execute(sa.text("ALTER TABLE mb_queue DROP COLUMN order_key"))
            conn.execute(sa.text("ALTER TABLE mb_suspended DROP COLUMN order_key"))
            conn.execute(sa.text("ALTER TABLE mb_suspended DROP COLUMN holds_key"))
            conn.execute(sa.text("ALTER TABLE mb_subscription DROP COLUMN ordered_by"))
        if old_tables and pg:  # version 19's plain index: keyed entries were not there
            conn.execute(
                sa.text(
                    "CREATE INDEX mb_queue_plain ON mb_queue (host, priority DESC, id) "
                    "WHERE state = 'ready' AND NOT ordered AND instance_id IS NULL"
                )
            )
        if old_tables and version not in ("20", "21"):  # before 20: no users, no sessions
            conn.execute(sa.text("DROP TABLE mb_session"))
            conn.execute(sa.text("DROP TABLE mb_user"))
        if old_tables and version != "21":  # before 21: no tracked messages, no publish-time index
            conn.execute(sa.text("DROP TABLE mb_tracked_message"))
            if box.store.dialect.name == "postgresql":
                conn.execute(sa.text("DROP INDEX mb_spool_published"))
        if old_tables and version not in (
            "19",
            "20",
            "21",
        ):  # before 19: no expiry, no due-time index
            if box.store.dialect.name == "postgresql":
                conn.execute(sa.text("DROP INDEX mb_queue_due"))
                conn.execute(sa.text("DROP INDEX mb_queue_expiry"))
            conn.execute(sa.text("ALTER TABLE mb_queue DROP COLUMN expires_at"))
            conn.execute(sa.text("ALTER TABLE mb_subscription DROP COLUMN on_expiry"))
        if (
            old_tables
            and version not in ("18", "19", "20", "21")
            and box.store.dialect.name == "postgresql"
        ):  # < 18
            conn.execute(sa.text("DROP FUNCTION mb_publish_prelude"))
        if (
            old_tables
            and version not in ("17", "18", "19", "20", "21")
            and box.store.dialect.name == "postgresql"
        ):
            conn.execute(sa.text("DROP FUNCTION mb_ordered_heads"))
            conn.execute(sa.text("ALTER TABLE mb_queue DROP COLUMN run_lease"))  # its index too
        if old_tables and version == "15" and box.store.dialect.name == "postgresql":
            # version 15's functions let instance heads of an ordered subscription go
            # and its run pass over instances (any bodies will do)
            conn.execute(
                sa.text(
                    "CREATE OR REPLACE FUNCTION mb_ordered_run(p_host text, p_sub bigint, "
                    "p_n bigint) RETURNS SETOF bigint LANGUAGE plpgsql AS $$ BEGIN "
                    "RETURN QUERY SELECT q.id FROM mb_queue q WHERE q.host = p_host "
                    "AND q.sub = p_sub ORDER BY q.id LIMIT p_n; END $$"
                )
            )
        if old_tables and version in ("14", "15", "16") and box.store.dialect.name == "postgresql":
            # version 14's instance-head function probed leased heads (any body will do)
            conn.execute(
                sa.text(
                    "CREATE OR REPLACE FUNCTION mb_instance_heads(p_host text, p_n bigint) "
                    "RETURNS TABLE (head_id bigint, head_instance text, head_priority integer) "
                    "LANGUAGE plpgsql AS $$ BEGIN RETURN QUERY SELECT q.id, q.instance_id, "
                    "q.priority FROM mb_queue q WHERE q.host = p_host "
                    "AND q.instance_id IS NOT NULL ORDER BY q.id LIMIT p_n; END $$"
                )
            )
        elif (
            old_tables
            and version not in ("17", "18", "19", "20", "21")
            and box.store.dialect.name == "postgresql"
        ):
            conn.execute(sa.text("DROP FUNCTION mb_instance_heads"))
        if old_tables and version == "12" and box.store.dialect.name == "postgresql":
            # version 12's claim function was SQL, its queue's fillfactor 50
            conn.execute(
                sa.text(
                    "CREATE OR REPLACE FUNCTION mb_claimable(p_host text, p_n bigint, "
                    "p_skip bigint[]) RETURNS SETOF bigint LANGUAGE sql AS "
                    "$$ SELECT id FROM mb_queue WHERE host = p_host LIMIT p_n $$"
                )
            )
            conn.execute(sa.text("ALTER TABLE mb_queue SET (fillfactor = 50)"))
        if (
            old_tables
            and version not in ("12", "13", "14", "15", "16", "17", "18", "19", "20", "21")
            and box.store.dialect.name == "postgresql"
        ):  # before 12
            conn.execute(sa.text("DROP FUNCTION mb_claimable, mb_ordered_run"))
            conn.execute(sa.text("DROP INDEX mb_queue_plain"))
        if (
            old_tables
            and version
            not in ("9", "10", "11", "12", "13", "14", "15", "16", "17", "18", "19", "20", "21")
            and box.store.dialect.name == "postgresql"
        ):
            conn.execute(sa.text("CREATE INDEX mb_queue_lease ON mb_queue (lease_owner)"))
            conn.execute(
                sa.text(
                    "ALTER TABLE mb_queue RESET (fillfactor, autovacuum_vacuum_scale_factor, "
                    "autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, "
                    "autovacuum_vacuum_insert_threshold)"
                )
            )
        if old_tables and version in ("2", "3", "4", "5", "6", "7", "8", "9", "10"):
            conn.execute(sa.text("DROP TABLE mb_config_version"))
        if old_tables and version in ("2", "3", "4", "5", "6", "7", "8", "9"):
            conn.execute(sa.text("DROP TABLE mb_audit"))
            conn.execute(sa.text("DROP TABLE mb_rollup"))
        if old_tables and version in ("2", "3", "4", "5", "6", "7"):
            conn.execute(sa.text("DROP TABLE mb_routing_change"))
        if old_tables and version in ("2", "3", "4", "5", "6"):
            for column in ("charges", "interrupted", "started_by", "crashed_by"):
                conn.execute(sa.text(f"ALTER TABLE mb_queue DROP COLUMN {column}"))
        if old_tables and version in ("2", "3", "4", "5"):
            conn.execute(sa.text("ALTER TABLE mb_queue DROP COLUMN claimed_at"))
        if old_tables and version in ("2", "3", "4"):
            conn.execute(sa.text("DROP TABLE mb_tracking"))
        if old_tables and version in ("2", "3"):
            make_version_3(conn)
        if old_tables and version == "2":
            conn.execute(sa.text("DROP TABLE mb_receipt"))
        conn.execute(
            mb_schema.meta.update()
            .where(mb_schema.meta.c.key == "schema_version")
            .values(value=version)
        )


def stored_version(box: MessageBox) -> str | None:
    with box.store.transaction() as conn:
        return conn.execute(
            sa.select(mb_schema.meta.c.value).where(mb_schema.meta.c.key == "schema_version")
        ).scalar()


@pytest.mark.parametrize(
    "old",
    [str(v) for v in range(2, 22)],
)
def test_an_older_database_is_upgraded_in_place_on_open(backend_url: str, old: str):
    # Given a database as version 2 (no receipts), 3 (no convoys), 4 (no tracking),
    # 5 (no first-claim time), 6 (no crash accounting), 7 (no routing versions), 8
    # (an index on lease_owner), 9 (no audit, no rollups), 10 (no routing versions), 11
    # (no claim functions on PostgreSQL), 12 (SQL claim functions, fillfactor 50), 13
    # (no instance-head function), 14 (one that probed leased heads) or 15 (instance
    # heads of ordered subscriptions claimed beside their runs) or 16 (ordered claims
    # by an aggregate of the ordered backlog) or 17 (publishes that take no routing
    # fence) or 18 (no expiry, no scheduled-delivery index) or 19 (no users, no sessions)
    # or 20 (no tracked messages, no publish-time index) or 21 (no per-key order) left
    # it, with data
    with MessageBox(backend_url) as box:
        box.create_host("kept")
        box.subscribe("svc", host="kept", filter=P("a.B") == 1, name="sub")
        [queued] = box.publish([Message(b"q", promoted={"a.B": 1})])
        # and, as version 5 could leave, a resumable entry of a removed subscription
        box.subscribe("gone", host="kept", filter=P("a.B") == 3, name="gone")
        box.publish([Message(b"o", promoted={"a.B": 3})])
        box.set_service_state("gone", "unenlisted")
        with box.store.transaction() as conn:
            conn.execute(sa.text("DELETE FROM mb_subscription WHERE name = 'gone'"))
        set_version(box, old, old_tables=True)
    # When it is opened again
    with MessageBox(backend_url) as box:
        # Then it is the current version, with every table, and its data is kept
        assert stored_version(box) == mb_schema.SCHEMA_VERSION == "23"
        if box.store.dialect.name == "postgresql":  # claims can update rows in place
            with box.store.transaction() as conn:
                indexes = (
                    conn.execute(
                        sa.text(
                            "SELECT indexname FROM pg_indexes WHERE tablename = 'mb_queue' "
                            "AND schemaname = current_schema()"
                        )
                    )
                    .scalars()
                    .all()
                )
                spool_indexes = (
                    conn.execute(
                        sa.text(
                            "SELECT indexname FROM pg_indexes WHERE tablename = 'mb_spool' "
                            "AND schemaname = current_schema()"
                        )
                    )
                    .scalars()
                    .all()
                )
                options: list[str] = conn.execute(
                    sa.text("SELECT reloptions FROM pg_class WHERE oid = 'mb_queue'::regclass")
                ).scalar_one()
                languages: dict[str, str] = dict(
                    conn.execute(
                        sa.text(
                            "SELECT p.proname, l.lanname FROM pg_proc p JOIN pg_language l "
                            "ON l.oid = p.prolang WHERE p.proname LIKE 'mb\\_%' "
                            "AND p.pronamespace = current_schema()::regnamespace"
                        )
                    ).all()
                )
                bodies: dict[str, str] = dict(
                    conn.execute(
                        sa.text(
                            "SELECT proname, prosrc FROM pg_proc WHERE proname IN "
                            "('mb_instance_heads', 'mb_ordered_run') "
                            "AND pronamespace = current_schema()::regnamespace"
                        )
                    ).all()
                )
            heads_sql = bodies["mb_instance_heads"]
            assert "q.lease_expires < now()" in heads_sql  # leased heads passed over (15)
            assert "NOT q.ordered" in heads_sql  # ordered entries go with their runs (16)
            assert "mb_suspended" in bodies["mb_ordered_run"]  # runs obey instances (16)
            assert languages == {  # claims by index; PL/pgSQL keeps their plans
                "mb_claimable": "plpgsql",
                "mb_ordered_run": "plpgsql",
                "mb_instance_heads": "plpgsql",
                "mb_ordered_heads": "plpgsql",  # ordered heads by index (17)
                "mb_publish_prelude": "plpgsql",  # takes the routing fence (18)
                "mb_claim_keyed": "plpgsql",  # keyed runs by index (20), leased by it (23)
            }
            assert "mb_queue_run_lease" in set(indexes)
            assert {"mb_queue_due", "mb_queue_expiry"} <= set(indexes)  # 19
            keyed = {"mb_queue_keyed", "mb_queue_keyed_claim", "mb_queue_key_lease"}
            assert keyed <= set(indexes)  # 20
            assert "expires_at" in heads_sql  # expired heads passed over (19)
            assert "mb_spool_published" in spool_indexes  # a search's order (21)
            assert "mb_queue_lease" not in set(indexes)
            assert "mb_queue_plain" in set(indexes)
            assert f"fillfactor={mb_schema.QUEUE_FILLFACTOR}" in options
            assert "autovacuum_vacuum_scale_factor=0" in options
        assert box.receipts("port/location", ["k"]) == {}
        assert [h.name for h in box.hosts()] == ["kept"]
        [sub] = box.subscriptions()
        assert sub.name == "sub"
        [orphan] = box.suspended()
        # 6 to 16 could not leave it resumable
        if old not in [str(v) for v in range(6, 22)]:
            assert (orphan.reason, orphan.resumable) == ("subscription-removed", False)
        assert sub.correlation == ()
        assert sub.on_expiry == "suspend"  # 19: the column's default
        box.subscribe("conv", host="kept", filter=P("a.B") == 2, correlation=["a.C"])
        routed = box.publish([Message(b"x", promoted={"a.B": 2, "a.C": "k"})])
        assert routed[0].subscriptions
        box.configure_tracking(True)
        box.publish([Message(b"y", promoted={"a.B": 2, "a.C": "k"})])
        assert [e.event for e in box.tracked(event="published")] == ["published"]
        assert len(box.search("a.B == 2").found) == 2  # 21: mb_tracked_message searched too
        # and the entry queued before the upgrade is claimed, as a first claim
        claims = claim(box, "kept", n=5)
        assert [c.msg for c in claims] == [queued.message_id]
        assert claims[0].waited is not None
        assert claims[0].waited >= 0
        assert (claims[0].charges, claims[0].interrupted) == (0, False)
        # and a service instance's head is claimed (mb_instance_heads on PostgreSQL),
        # its second message held behind it
        heads = claim(box, "kept", n=5, instances=True)
        assert [c.msg for c in heads] == [routed[0].message_id]
        # and a message with an expiry is stored with it, one with a delay as scheduled
        [expiring] = box.publish([Message(b"e", promoted={"a.B": 1}, ttl=60)])
        box.publish([Message(b"s", promoted={"a.B": 1})], delay=3600)
        assert len(box.scheduled(host="kept")) == 1
        assert [c.msg for c in claim(box, "kept", n=5)] == [expiring.message_id]
        # and users and their sessions are kept (20)
        box.add_user("alice", "reader", "correct horse battery")
        token = box.open_session("alice", "reader", lifetime=3600)
        assert box.find_session(token, idle=3600) is not None
        # and a subscription ordered by a property keys its entries, kept apart from the
        # plain ones (on PostgreSQL by mb_queue_plain's predicate, made again)
        box.subscribe("keyed", host="kept", filter=P("a.B") == 4, ordered_by="a.C")
        [keyed_msg] = box.publish([Message(b"k", promoted={"a.B": 4, "a.C": "x"})])
        assert claim(box, "kept", n=5) == []
        claims, _ = box.consumer("kept", "o").claim(
            5, 30.0, ordered=False, instances=False, keyed=5, keyed_only=True
        )
        assert [(c.msg, c.key) for c in claims] == [(keyed_msg.message_id, "sx")]


def test_an_unknown_version_is_refused(backend_url: str):
    # Given a database stamped with a version this code does not know
    with MessageBox(backend_url) as box:
        set_version(box, "1")
    # When it is opened, then the error names both versions
    with pytest.raises(StorageError, match="schema version 1 is not the 23"):
        MessageBox(backend_url)
