"""The store and what runs inside its transactions: ``store.Store`` (opening a
database, transactions, driver errors, after-commit wake-ups), the dialects
(``dialects/``: DuckDB, PostgreSQL) and their capabilities, the schema and its
upgrades, the store's clock, what this process keeps per database, and the
modules of functions run inside the caller's transaction that the store and
every layer above share: ids, spool, subscriptions, the routing index and fence,
suspension, expiry, tracking, rollups, the audit log, the consistency check.

Imports nothing of ``routing``, ``delivery``, ``config`` or ``ops``
(docs/architecture.md).
"""
