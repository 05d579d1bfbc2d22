"""Schema creation shared by the dialects: idempotent ``CREATE … IF NOT EXISTS``."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex, CreateSequence, CreateTable


def create_all(conn: sa.Connection, metadata: sa.MetaData, *, indexes: bool) -> None:
    """Create sequences, tables and (optionally) secondary indexes that do not exist yet."""
    for seq in metadata._sequences.values():
        conn.execute(CreateSequence(seq, if_not_exists=True))
    for table in metadata.sorted_tables:
        conn.execute(CreateTable(table, if_not_exists=True))
        if indexes:
            for index in sorted(table.indexes, key=lambda i: str(i.name)):
                conn.execute(CreateIndex(index, if_not_exists=True))
