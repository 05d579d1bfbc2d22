"""A publisher for kill tests (``python -m tests.apps.joined_publisher URL START ACKED``):
inserts an order row and publishes its message in one transaction, again and again
(PostgreSQL: the application's own SQLAlchemy transaction, ``publish(connection=)``;
DuckDB: ``box.transaction()``), appending each committed order number to ``ACKED``."""

from __future__ import annotations

import sys

import sqlalchemy as sa

from messagebox import Message, MessageBox


def run(url: str, start: int, acked: str) -> None:
    engine = sa.create_engine(url) if url.startswith("postgresql") else None
    box = MessageBox(url)
    with open(acked, "a", encoding="utf-8") as out:
        for n in range(start, start + 100_000):
            message = Message(f"order {n}".encode(), promoted={"o.Id": n})
            if engine is not None:
                with engine.begin() as conn:
                    conn.exec_driver_sql(f"INSERT INTO app_orders VALUES ({n}, 'o')")
                    box.publish([message], connection=conn)
            else:
                with box.transaction() as conn:
                    conn.exec_driver_sql(f"INSERT INTO app_orders VALUES ({n}, 'o')")
                    box.publish([message], connection=conn)
            out.write(f"{n}\n")
            out.flush()


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), sys.argv[3])
