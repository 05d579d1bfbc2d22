"""A URL naming several PostgreSQL servers, read as the engine reads it wherever the
code makes a connection string or compares stores; lost connections told from failing
statements; an outage logged once (docs/howto-postgresql.md, High availability)."""

from __future__ import annotations

import logging

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from messagebox.errors import BackendUnavailable, StorageError
from messagebox.storage.dialects.postgresql import PostgreSQLDialect, Standby
from messagebox.storage.outage import Outage

PAIR = (
    "postgresql+psycopg://mb:pw@/orders?host=db1:5432&host=db2:5433&target_session_attrs=read-write"
)


@pytest.mark.parametrize(
    "url",
    [
        PAIR,
        "postgresql://mb:pw@/orders?host=db1,db2&port=5432,5433&target_session_attrs=read-write",
    ],
)
def test_the_listen_connection_names_every_server(url: str) -> None:
    found = conninfo_to_dict(PostgreSQLDialect().listen_dsn(sa.make_url(url)))
    assert found == {
        "host": "db1,db2",
        "port": "5432,5433",
        "target_session_attrs": "read-write",
        "dbname": "orders",
        "user": "mb",
        "password": "pw",
    }


def test_a_single_server_url_keeps_its_options() -> None:
    url = sa.make_url("postgresql://mb@db1:6432/orders?options=-csearch_path%3Dshop")
    found = conninfo_to_dict(PostgreSQLDialect().listen_dsn(url))
    assert (found["host"], found["port"], found["options"]) == ("db1", "6432", "-csearch_path=shop")


@pytest.mark.parametrize(
    ("other", "same"),
    [
        ("postgresql://mb@db1:5432/orders", True),  # the primary alone
        ("postgresql+psycopg://x@db2:5433/orders", True),  # the standby alone
        ("postgresql://mb@db2:5432/orders", False),  # another port
        ("postgresql://mb@db1:5432/other", False),
        ("postgresql://mb@db1:5432/orders?options=-csearch_path%3Dshop", False),
        ("duckdb:///orders.duckdb", False),
    ],
)
def test_urls_name_the_same_store_by_a_server_in_common(other: str, same: bool) -> None:
    assert PostgreSQLDialect().same_database(sa.make_url(PAIR), sa.make_url(other)) is same


@pytest.mark.parametrize(
    "error",
    [
        psycopg.OperationalError("consuming input failed: server closed the connection"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.ConnectionFailure("connection failure"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
    ],
)
def test_a_lost_connection_is_backend_unavailable(error: psycopg.Error) -> None:
    dialect = PostgreSQLDialect()
    before = dialect._lost_at
    assert isinstance(dialect.translate(error, "SELECT 1"), BackendUnavailable)
    assert dialect._lost_at > before  # the pool replaces the connections made before


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
    ],
)
def test_a_failing_statement_is_not_an_outage(error: psycopg.Error) -> None:
    translated = PostgreSQLDialect().translate(error, "SELECT 1")
    assert type(translated) is StorageError


def test_a_standby_is_refused_saying_so() -> None:
    error = Standby("the server at db2:5433 is a standby in recovery (read-only): ...")
    wrapped = sa.exc.OperationalError(None, None, error)
    translated = PostgreSQLDialect().translate(wrapped)
    assert isinstance(translated, BackendUnavailable)
    assert str(translated).startswith("postgresql: the server at db2:5433 is a standby")


def test_an_outage_is_logged_once_and_its_end_with_its_length(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="messagebox.store")
    outage = Outage("postgresql+psycopg://mb@/orders")
    outage.used_by("shipping@m1:12:ab", "shipping")
    outage.answered()  # nothing was lost
    for _ in range(3):
        outage.failed(BackendUnavailable("cannot reach PostgreSQL: refused"))
    outage.answered()
    outage.answered()
    events = [(r.levelname, getattr(r, "event", None)) for r in caplog.records]
    assert events == [("ERROR", "store-lost"), ("INFO", "store-back")]
    lost, back = caplog.records
    assert getattr(lost, "host_instance", None) == "shipping@m1:12:ab"
    assert getattr(back, "outage_seconds", -1.0) >= 0.0
