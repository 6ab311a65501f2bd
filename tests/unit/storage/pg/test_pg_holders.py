"""Ending a hung node's sessions (storage/pg/cluster.py ``HOLDERS``) must stay inside the cluster's own
database. pg_locks lists the advisory locks of every database on the server, and every cluster's database numbers
its epochs from 1: before, a member ending the sessions of its hung peer of epoch N also ended the sessions of
epoch N of any other cluster sharing the PostgreSQL server (which then reconnected and was fenced). Real
PostgreSQL (tests/pg_server.py), two databases, sessions holding the key as a node's sessions do."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from storage.pg.cluster import HOLDERS, LEASE_KEY

pytest_plugins = ["pg_fixtures"]

EPOCH = 1  # the first node's epoch in any fresh cluster database


@pytest.fixture
def other_dsn(postgres) -> str:
    """A second database on the same server: another cluster's."""
    from pg_fixtures import create_database

    return create_database(postgres)


async def holding_the_key(dsn: str) -> asyncpg.Connection:
    """A session holding ``(LEASE_KEY, EPOCH)`` shared, as each of a node's four sessions does."""
    conn = await asyncpg.connect(dsn)
    await conn.execute("SELECT pg_advisory_lock_shared($1, $2)", LEASE_KEY, EPOCH)
    return conn


async def alive(conn: asyncpg.Connection, pid: int) -> bool:
    """Whether backend ``pid`` still runs (pg_stat_activity lists every database's backends)."""
    return bool(await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid))


async def test_ending_a_hung_epochs_sessions_spares_another_databases_namesake(pg_dsn, other_dsn) -> None:
    hung = await holding_the_key(pg_dsn)  # the hung peer, in this cluster's database
    namesake = await holding_the_key(other_dsn)  # another cluster's node of the same epoch number
    reaper = await asyncpg.connect(pg_dsn)
    try:
        ended = await reaper.fetch(HOLDERS, LEASE_KEY, EPOCH)
        assert len(ended) == 1  # one session of this database held the key
        deadline = time.monotonic() + 5
        while await alive(reaper, hung.get_server_pid()):  # ended: the key is free for the reaper's next round
            assert time.monotonic() < deadline, "the hung epoch's session was not ended"
            await asyncio.sleep(0.02)
        assert await alive(reaper, namesake.get_server_pid())  # the other database's session lives on
        assert await namesake.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted") == 1
    finally:
        hung.terminate()
        for conn in (namesake, reaper):
            await conn.close()
