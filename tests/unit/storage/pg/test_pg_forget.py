"""Forgetting a member (storage/pg/forget.py) against a start of the same name and a running member: a start
waits for a forget of its name in progress (both take the name's advisory lock), and a member whose row was
removed under it fences itself at its next heartbeat instead of running on unseen by its peers."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from storage.pg import schema
from storage.pg.forget import NAME_LOCK_CLASS, NotForgettable, forget_member

pytest_plugins = ["pg_fixtures"]


async def test_a_start_waits_for_a_forget_of_its_name(pg_dsn: str, nodes) -> None:
    holder = await asyncpg.connect(pg_dsn)
    try:
        await schema.migrate(holder)
        tx = holder.transaction()
        await tx.start()  # a forget of "x" in progress holds the name's lock until it commits
        await holder.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", NAME_LOCK_CLASS, "x")
        join = asyncio.ensure_future(nodes("x"))
        await asyncio.sleep(1.0)
        assert not join.done(), "the start went ahead under a forget of its name"
        await tx.rollback()
        node = await asyncio.wait_for(join, 10)
        assert not node.fenced
    finally:
        await holder.close()


async def test_a_running_member_is_refused_and_one_whose_row_is_gone_fences_itself(pg_dsn: str, nodes) -> None:
    y = await nodes("y", lease_seconds=1.5)
    other = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(NotForgettable, match="running"):
            await forget_member(other, "y")
        with pytest.raises(NotForgettable, match="not a member"):
            await forget_member(other, "nobody")
        # Its row removed from under it (as a forget that raced a start could once do): it must not go on.
        await other.execute("DELETE FROM leveret.node WHERE name = 'y'")
        deadline = time.monotonic() + 5
        while not y.fenced:
            assert time.monotonic() < deadline, "the member ran on without its node row"
            await asyncio.sleep(0.05)
        assert "row is gone" in y.fence_reason
    finally:
        await other.close()


async def test_a_forget_makes_its_runs_reservations_ready_and_counts_rows(pg_dsn: str, nodes) -> None:
    y = await nodes("y")
    q = y.open_queue("/", "q")
    for i in range(3):
        q.publish(b"m%d" % i, 2, True)
    await y.wait_idle()
    epoch = y.epoch
    await y.close()
    other = await asyncpg.connect(pg_dsn)
    try:
        # Rows still reserved by a stopped run (as when its requeue at stop never committed).
        await other.execute("UPDATE leveret.message SET state = 1, owner = $1 WHERE body <> 'm2'", epoch)
        gone = await forget_member(other, "y")
        assert (gone.runs, gone.requeued) == (1, 2)
        queue_id = await other.fetchval("SELECT DISTINCT queue_id FROM leveret.message")
        assert gone.requeued_in == {queue_id}
        got = await other.fetch("SELECT body, state, owner, redelivered FROM leveret.message ORDER BY seq")
        assert [tuple(r) for r in got] == [(b"m0", 0, None, True), (b"m1", 0, None, True), (b"m2", 0, None, False)]
    finally:
        await other.close()
