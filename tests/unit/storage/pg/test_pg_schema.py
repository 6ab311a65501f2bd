"""The leveret schema's migrations (storage/pg/schema.py): made from empty, migrated from older, refused when
newer than this Leveret."""

from __future__ import annotations

import asyncpg
import pytest

from storage.pg import schema
from storage.pg.cluster import PgCluster

pytest_plugins = ["pg_fixtures"]


async def test_a_node_against_an_empty_database_creates_the_schema(pg_dsn: str) -> None:
    node = await PgCluster.connect(pg_dsn, "a")
    await node.close()
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await schema.current_version(conn) == schema.latest_version()
        tables = {r[0] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'leveret'")}
        assert {"schema_version", "queue", "node", "message"} <= tables
        assert await schema.migrate(conn) == schema.latest_version()  # nothing left to do: a no-op
    finally:
        await conn.close()


async def test_an_older_database_is_migrated_in_order(pg_dsn: str) -> None:
    v1 = schema.MIGRATIONS[:1]
    v2 = [*v1, (2, "CREATE TABLE leveret.extra (x int); INSERT INTO leveret.extra VALUES (7)")]
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await schema.migrate(conn, v1) == 0
        assert await schema.current_version(conn) == 1
        assert await schema.migrate(conn, v2) == 1
        assert await schema.current_version(conn) == 2
        assert await conn.fetchval("SELECT x FROM leveret.extra") == 7
        assert [r[0] for r in await conn.fetch("SELECT version FROM leveret.schema_version ORDER BY 1")] == [1, 2]
    finally:
        await conn.close()


async def test_a_newer_database_is_refused_with_a_clear_error(pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        await schema.migrate(conn)
        await conn.execute("INSERT INTO leveret.schema_version (version) VALUES ($1)", schema.latest_version() + 5)
    finally:
        await conn.close()
    with pytest.raises(schema.SchemaTooNew, match="newer than this Leveret"):
        await PgCluster.connect(pg_dsn, "a")
    conn = await asyncpg.connect(pg_dsn)
    try:  # refused before registering: no node row, no epoch's worth of anything
        assert await conn.fetchval("SELECT count(*) FROM leveret.node") == 0
    finally:
        await conn.close()


def test_every_process_knows_the_same_newest_version() -> None:
    """A process that imports only the queue store (as a node subprocess in a test does) must know the
    definitions' migration too: else it refuses a database another process migrated (SchemaTooNew)."""
    import subprocess
    import sys

    from storage.pg import definitions_store  # noqa: F401 - the module whose table is migration 2

    out = subprocess.run([sys.executable, "-c", "from storage.pg import schema; print(schema.latest_version())"],
                         capture_output=True, text=True, check=True).stdout
    assert int(out) == schema.latest_version() >= 2
