"""The definitions feed's doorbell (storage/pg/definitions_store.py DEFINITIONS_BELL, storage/pg/bell.py): every
transaction that changed a definition notifies, and a member's follower (broker/clustering/cluster_definitions.py) reads the
feed when it hears it, not at its next poll (issue 15: "a change made on one node is seen on the others within a
second (LISTEN/NOTIFY as a doorbell, plus polling)"). The follower here polls once a minute, so only the bell
can bring the change within the test's second; its session cut by the server, the bell listens again."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import asyncpg
import pytest

from broker.clustering.cluster_definitions import DefinitionsFollower
from storage.pg import bell as bell_module
from storage.pg.definitions_store import Change, PgDefinitionsStore

pytest_plugins = ["pg_fixtures"]


async def until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


# Issue 15's "within a second" is a latency promise: measured in the serial pass, not beside three workers that
# a 2-core CI machine runs at a load of 6-10.
@pytest.mark.serial
async def test_a_change_reaches_a_follower_at_the_ring_not_at_its_poll(pg_dsn, monkeypatch) -> None:
    monkeypatch.setattr(bell_module, "RETRY_FIRST", 0.05)
    here = await PgDefinitionsStore.open(pg_dsn, "here@test", 5.0)
    there = await PgDefinitionsStore.open(pg_dsn, "there@test", 5.0)
    follower = DefinitionsFollower(None, SimpleNamespace(shared=here), interval=60.0)
    follower.version = here.version_at_open
    seen: list[Change] = []

    def record(changes: list[Change]) -> int:  # the replay itself is the broker's (tested with real members)
        for c in changes:
            if c.version > follower.version:
                follower.version = c.version
                seen.append(c)
        return len(changes)

    monkeypatch.setattr(follower, "_apply", record)
    follower.start()
    try:
        assert await until(follower.bell.listening.is_set, 30)
        started = time.monotonic()
        there.put("vhost", "v1", {"description": "made elsewhere"})  # (committed by its journal: no wait here)
        assert await until(lambda: [c.key for c in seen] == ["v1"], 1.0), seen
        assert time.monotonic() - started < 1.0
        reads = follower.bell.rings
        await there.changes_since(0)  # a read rings nothing
        await asyncio.sleep(0.2)
        assert follower.bell.rings == reads

        # The server ends the bell's session: it listens again, and the next change still comes at once.
        admin = await asyncpg.connect(pg_dsn)
        try:
            cut = await admin.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE pid <> pg_backend_pid() AND query LIKE 'LISTEN%'")
        finally:
            await admin.close()
        assert cut == 1
        assert await until(lambda: not follower.bell.listening.is_set(), 30)
        assert await until(follower.bell.listening.is_set, 30)
        there.delete("vhost", "v1")
        assert await until(lambda: [c.key for c in seen] == ["v1", "v1"] and seen[-1].value is None, 1.0), seen
    finally:
        await follower.stop()
        here.close()
        there.close()
