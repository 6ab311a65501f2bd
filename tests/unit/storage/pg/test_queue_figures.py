"""The shared queues' figures as PostgreSQL counts them (storage/pg/queue_figures.py), on a real PostgreSQL:
ready and reserved rows per queue (every priority of a queue counted together), bytes, a queue without rows
absent (zero), the live members, one statement per second however many callers (and one as a rate slot
begins), and the last count kept while PostgreSQL does not answer; and the questions between members
(storage/pg/forwarding.py ask)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest

from storage.pg import schema
from storage.pg.forwarding import PgDirectory, PgForwarding
from storage.pg.queue_figures import ZERO, PgQueueFigures, QueueCounts

pytest_plugins = ["pg_fixtures"]


@pytest.fixture
async def admin(admin: asyncpg.Connection) -> asyncpg.Connection:
    """pg_fixtures' session, with the schema made: these tests write the tables directly."""
    await schema.migrate(admin)
    return admin


async def node(admin: asyncpg.Connection, name: str, *, alive: bool = True) -> int:
    return int(await admin.fetchval(
        "INSERT INTO leveret.node (epoch, name, lease_pid, lease_until, stopped_at) VALUES "
        "(nextval('leveret.node_epoch'), $1, 0, now() + interval '1 hour', CASE WHEN $2 THEN NULL ELSE now() END) "
        "RETURNING epoch", name, alive))


async def queue(admin: asyncpg.Connection, vhost: str, name: str) -> int:
    return int(await admin.fetchval("INSERT INTO leveret.queue (vhost, name) VALUES ($1, $2) RETURNING queue_id",
                                    vhost, name))


_seq = iter(range(1, 1_000_000))


async def rows(admin: asyncpg.Connection, qid: int, n: int, size: int, state: int = 0, owner: int | None = None,
               priority: int = 0) -> None:
    for _ in range(n):
        await admin.execute(
            "INSERT INTO leveret.message (seq, queue_id, priority, state, owner, persistent, size, body) "
            "VALUES ($1, $2, $3, $4, $5, true, $6, '\\x00')", next(_seq), qid, priority, state, owner, size)


async def test_counts_per_queue_and_state(admin, pg_dsn) -> None:
    a = await node(admin, "a")
    await node(admin, "b")
    await node(admin, "gone", alive=False)
    q1, q2 = await queue(admin, "/", "q1"), await queue(admin, "other", "q1")
    await queue(admin, "/", "empty")
    await rows(admin, q1, 5, 10)
    await rows(admin, q1, 2, 7, priority=3)
    await rows(admin, q1, 3, 100, state=1, owner=a)
    await rows(admin, q2, 1, 1, state=1, owner=a)
    figures = PgQueueFigures(pg_dsn)
    try:
        snap = await figures.snapshot()
        assert snap is not None
        assert snap.counts("/", "q1") == QueueCounts(7, 3, 64, 300)
        assert snap.counts("other", "q1") == QueueCounts(0, 1, 0, 1)
        assert snap.counts("/", "empty") == ZERO
        assert snap.counts("/", "nowhere") == ZERO
        assert snap.members == ("a", "b")
    finally:
        await figures.close()


# A rate slot of 23 days (ms, PostgreSQL's int): none ends during a test, so only max_age renews a count.
NO_SLOT_END = 2_000_000_000


async def test_one_statement_a_second_for_every_caller_and_the_last_count_while_down(admin, pg_dsn) -> None:
    qid = await queue(admin, "/", "q")
    await rows(admin, qid, 4, 1)
    figures = PgQueueFigures(pg_dsn, max_age=0.5, rate_slot_ms=NO_SLOT_END)
    try:
        snaps = await asyncio.gather(*(figures.snapshot() for _ in range(20)))
        assert figures.counts_taken == 1
        assert all(s is snaps[0] for s in snaps)
        await rows(admin, qid, 1, 1)
        assert (await figures.snapshot()).counts("/", "q").ready == 4  # type: ignore[union-attr]  # cached
        await asyncio.sleep(0.6)
        assert (await figures.snapshot()).counts("/", "q").ready == 5  # type: ignore[union-attr]
        assert figures.counts_taken == 2
        # PostgreSQL out of reach (its session killed, then connections refused): the last count stands.
        figures.dsn = pg_dsn.rsplit("/", 1)[0] + "/no_such_database"
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        await asyncio.sleep(0.6)
        snap = await figures.snapshot()
        assert snap is not None and snap.counts("/", "q").ready == 5
        assert figures.counts_taken == 2
    finally:
        await figures.close()


async def test_a_count_is_not_answered_past_the_end_of_its_rate_slot(admin, pg_dsn) -> None:
    """A count's rates are of the slot it was read in: answered again within that slot, counted anew as the
    next begins however young (else a member would answer the previous slot's rates for up to max_age into
    the next, beside a member that read the new slot). PostgreSQL's clock is this machine's."""
    figures = PgQueueFigures(pg_dsn, max_age=60.0, rate_slot_ms=2000)
    try:
        # The connection first (its set-up took over 1.7 s on a loaded machine, carrying the first count into the
        # next slot): the counts below are one round trip each.
        assert await figures.snapshot() is not None
        taken = figures.counts_taken
        await asyncio.sleep(2.05 - time.time() % 2.0)  # just after a slot began
        first = await figures.snapshot()
        assert first is not None
        await asyncio.sleep(0.25)
        assert await figures.snapshot() is first and figures.counts_taken == taken + 1  # the same slot: not again
        await asyncio.sleep(2.05 - time.time() % 2.0)  # just after the next slot began
        second = await figures.snapshot()
        assert second is not first and figures.counts_taken == taken + 2
        assert second.rate_slot == first.rate_slot + 1  # type: ignore[union-attr]
    finally:
        await figures.close()


async def test_a_member_answers_questions_about_its_queues(admin, pg_dsn) -> None:
    await node(admin, "a")
    await node(admin, "b")
    await node(admin, "stopped", alive=False)
    asked: list[tuple[Any, Any]] = []

    def answer(vhost: str | None, names: list[str] | None) -> list[Any]:
        asked.append((vhost, names))
        if names is None:  # many rows: the answer travels in several notifications
            return [["/", f"q{i}", {"count": i, "pad": "x" * 200}] for i in range(300)]
        return [["/", n, {"count": 7}] for n in names]

    fw = PgForwarding(pg_dsn, "a", bytes, lambda c, ok: None, lambda rows: None, lambda: None, answer)
    await fw.start()
    d = PgDirectory(pg_dsn, "b", timeout=5.0)
    try:
        assert await d.ask("a", "/", ["x"], 2.0) == [["/", "x", {"count": 7}]]
        many = await d.ask("a", None, None, 2.0)
        assert many is not None and len(many) == 300 and many[299][2]["count"] == 299
        assert asked == [("/", ["x"]), (None, None)]
        # A member that is not live is not asked (no wait); one that does not answer costs the timeout.
        assert await d.ask("stopped", "/", ["x"], 2.0) is None
        await node(admin, "mute")
        assert await d.ask("mute", "/", ["x"], 0.3) is None
        assert len(asked) == 2
    finally:
        await d.close()
        await fw.close()

