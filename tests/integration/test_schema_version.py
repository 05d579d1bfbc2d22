"""The schema version stored in the database: additive upgrades run on open, anything
else is refused with a clear error (both backends)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from messagebox import MessageBox
from messagebox import schema as mb_schema
from messagebox.errors import StorageError


def set_version(box: MessageBox, version: str, *, drop_receipts: bool = False) -> None:
    with box.store.transaction() as conn:
        if drop_receipts:
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


def test_a_version_2_database_is_upgraded_in_place_on_open(backend_url: str):
    # Given a database as version 2 left it: no receipts table
    with MessageBox(backend_url) as box:
        box.create_host("kept")
        set_version(box, "2", drop_receipts=True)
    # When it is opened again
    with MessageBox(backend_url) as box:
        # Then it is version 3, with the receipts table, and its data is kept
        assert stored_version(box) == mb_schema.SCHEMA_VERSION == "3"
        assert box.receipts("port/location", ["k"]) == {}
        assert [h.name for h in box.hosts()] == ["kept"]


def test_an_unknown_version_is_refused(backend_url: str):
    # Given a database stamped with a version this code does not know
    with MessageBox(backend_url) as box:
        set_version(box, "1")
    # When it is opened, then the error names both versions
    with pytest.raises(StorageError, match="schema version 1 is not the 3"):
        MessageBox(backend_url)
