"""How an older database's schema is upgraded in place on open (``Store._upgrade``)."""

from __future__ import annotations

UPGRADES: dict[str, tuple[str, tuple[str, ...]]] = {
    "2": ("3", ()),
    "3": (
        "4",
        (
            "ALTER TABLE mb_subscription ADD COLUMN correlation TEXT",
            # version 3 never wrote this table; it is made again with its new columns
            "DROP TABLE mb_service_instance",
        ),
    ),
    "4": ("5", ()),  # adds mb_tracking
    "5": (
        "6",
        (
            "ALTER TABLE mb_queue ADD COLUMN claimed_at TIMESTAMP WITH TIME ZONE",
            # version 5 could leave a resumable entry of a removed subscription: it can
            # only be re-routed
            "UPDATE mb_suspended SET reason = 'subscription-removed', resumable = false "
            "WHERE resumable AND sub NOT IN (SELECT id FROM mb_subscription)",
        ),
    ),
    "6": (
        "7",
        (
            "ALTER TABLE mb_queue ADD COLUMN charges INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE mb_queue ADD COLUMN interrupted BOOLEAN NOT NULL DEFAULT false",
            "ALTER TABLE mb_queue ADD COLUMN started_by TEXT",
            "ALTER TABLE mb_queue ADD COLUMN crashed_by TEXT",
            # version 6 counted every delivery, RetryLater's too, against max_attempts:
            # waiting entries start with no charge (a failing one gets its attempts again)
        ),
    ),
    "7": ("8", ()),  # mb_routing_change is created; routing indexes start from a full load
    # claims update the queue in place: no index on lease_owner (PostgreSQL also sets
    # the queue's fillfactor when it creates the schema)
    "8": ("9", ("DROP INDEX IF EXISTS mb_queue_lease",)),
    "9": ("10", ()),  # adds mb_audit and mb_rollup
    "10": ("11", ()),  # adds mb_config_version
    # PostgreSQL: adds mb_claimable, mb_ordered_run (claims by index) and mb_queue_plain
    "11": ("12", ()),
    # PostgreSQL: the queue's fillfactor 40 (new pages) and the claim functions in
    # PL/pgSQL, both set again as the schema is created
    "12": ("13", ()),
    # PostgreSQL: adds mb_instance_heads (instance claims by index)
    "13": ("14", ()),
    # PostgreSQL: mb_instance_heads passes over leased heads in its scan (set again)
    "14": ("15", ()),
    # PostgreSQL: an ordered subscription's entries of a service instance go with its
    # run, which obeys their instances (mb_ordered_run, mb_instance_heads; set again)
    "15": ("16", ()),
    # PostgreSQL: the queue's run_lease (a generated column, indexed) and
    # mb_ordered_heads: ordered claims by index, not by the whole ordered backlog
    "16": ("17", ()),
    # PostgreSQL: mb_publish_prelude takes the routing fence (messagebox/storage/fence.py)
    "17": ("18", ()),
    # scheduled delivery and expiry: the queue's expires_at (the claim functions, set
    # again, pass expired entries over), a subscription's on_expiry; PostgreSQL adds
    # mb_queue_due and mb_queue_expiry
    "18": (
        "19",
        (
            "ALTER TABLE mb_queue ADD COLUMN expires_at TIMESTAMP WITH TIME ZONE",
            "ALTER TABLE mb_subscription ADD COLUMN on_expiry TEXT NOT NULL DEFAULT 'suspend'",
        ),
    ),
    "19": ("20", ()),  # adds mb_user and mb_session (the console's users and sessions)
    # search: adds mb_tracked_message; PostgreSQL adds mb_spool_published (built as the
    # schema is created: on a large spool, opening the store waits for it)
    "20": ("21", ()),
    # per-key order (ordered_by): a subscription's property, each entry's key, a
    # suspended entry's key and whether it holds it; mb_queue_plain leaves keyed
    # entries out (made again); PostgreSQL adds mb_queue_keyed, mb_queue_keyed_claim,
    # mb_suspended_key, the queue's key_lease and mb_keyed_runs
    "21": (
        "22",
        (
            "ALTER TABLE mb_subscription ADD COLUMN ordered_by TEXT",
            "ALTER TABLE mb_queue ADD COLUMN order_key TEXT",
            "ALTER TABLE mb_suspended ADD COLUMN order_key TEXT",
            "ALTER TABLE mb_suspended ADD COLUMN holds_key BOOLEAN NOT NULL DEFAULT false",
            "DROP INDEX IF EXISTS mb_queue_plain",
        ),
    ),
    # PostgreSQL: keyed runs are leased by the function that reads them (mb_claim_keyed
    # replaces mb_keyed_runs): a run's last entry could commit unseen by the claiming
    # statement and go unleased, the key's run in hand without its lease
    "22": ("23", ()),
}
"""How an older database is upgraded on open: version → (next version, statements run
before the missing tables and indexes are created). Upgrades chain up to
``SCHEMA_VERSION``: every step's statements run, then the schema is created once."""
