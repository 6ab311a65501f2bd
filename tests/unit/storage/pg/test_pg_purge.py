"""A purge across members (storage/pg/purge.py): the statements on a real PostgreSQL (tests/pg_server.py), and the
purging member's wait for the holders' answers on an event loop. The whole path with two broker processes is
tests/integration/cluster/test_cluster_purge.py."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from storage.pg import purge, schema
from storage.pg.workers import PURGE
from tests.unit.storage.pg.test_pg_cluster import fetch_wait

pytest_plugins = ["pg_fixtures"]

A, B = 1, 2  # the purging member's epoch, the holder's
QID = 7


async def filled(conn: asyncpg.Connection) -> None:
    """Queue QID: seqs 1-3 ready, 4-6 reserved by B (4 delivered, 5 and 6 in its prefix), 7 reserved by A."""
    await schema.migrate(conn)
    rows = [(1, 0, None), (2, 0, None), (3, 0, None), (4, 1, B), (5, 1, B), (6, 1, B), (7, 1, A)]
    await conn.executemany("INSERT INTO leveret.message (seq, queue_id, state, owner, persistent, size, body) "
                           "VALUES ($1, $4, $2, $3, true, 1, 'x')", [(*r, QID) for r in rows])


async def states(conn: asyncpg.Connection) -> dict[int, tuple[int, int | None]]:
    return {r[0]: (r[1], r[2]) for r in await conn.fetch("SELECT seq, state, owner FROM leveret.message")}


async def test_the_mark_and_the_answer_remove_what_the_holder_had_not_delivered(pg_dsn) -> None:
    conn = await asyncpg.connect(pg_dsn)
    answers: list[str] = []
    try:
        await filled(conn)
        await conn.add_listener(purge.PURGED_BELL, lambda *args: answers.append(args[3]))
        async with conn.transaction():
            await conn.execute(purge.LOCK_QUEUES, purge.PURGE_LOCK_CLASS, [QID], [True])
            deleted = await conn.execute(PURGE, QID, -32768, 32767, A, [])
            holders = [r[0] for r in await conn.fetch(purge.MARK, QID, -32768, 32767, A)]
        assert deleted == "DELETE 3" and holders == [B]
        assert await states(conn) == {4: (2, B), 5: (2, B), 6: (2, B), 7: (1, A)}
        # A release of a marked row leaves it marked (the answer deletes it).
        await conn.execute("UPDATE leveret.message SET state = 0, owner = NULL WHERE seq = 6 AND owner = $1 "
                           "AND state = 1", B)
        async with conn.transaction():
            await conn.execute(purge.LOCK_QUEUES, purge.PURGE_LOCK_CLASS, [QID], [False])
            await conn.execute(purge.ANSWER, QID, -32768, 32767, B, [4], purge.PURGED_BELL, f"t1 {B} ")
        for _ in range(100):
            if answers:
                break
            await asyncio.sleep(0.01)
        assert await states(conn) == {4: (1, B), 7: (1, A)} and answers == [f"t1 {B} 2"]
    finally:
        await conn.close()


async def test_a_purge_waits_for_a_marked_rows_release_in_flight(pg_dsn) -> None:
    """Another acker's transaction holding the queue's key (shared) releases B's row: the purge's exclusive key
    waits for it to commit, so the released row is deleted as ready rather than left ready after the purge."""
    holder = await asyncpg.connect(pg_dsn)
    purger = await asyncpg.connect(pg_dsn)
    try:
        await filled(holder)
        tx = holder.transaction()
        await tx.start()
        await holder.execute(purge.LOCK_QUEUES, purge.PURGE_LOCK_CLASS, [QID], [False])
        await holder.execute("UPDATE leveret.message SET state = 0, owner = NULL WHERE seq = 5")

        async def purging() -> tuple[str, list[int]]:
            async with purger.transaction():
                await purger.execute(purge.LOCK_QUEUES, purge.PURGE_LOCK_CLASS, [QID], [True])
                status = await purger.execute(PURGE, QID, -32768, 32767, A, [])
                return status, [r[0] for r in await purger.fetch(purge.MARK, QID, -32768, 32767, A)]

        task = asyncio.ensure_future(purging())
        await asyncio.sleep(0.3)
        assert not task.done(), "the purge did not wait for the acker transaction holding the queue's key"
        await tx.commit()
        status, holders = await asyncio.wait_for(task, 10)
        assert status == "DELETE 4" and holders == [B]
        assert await states(holder) == {4: (2, B), 6: (2, B), 7: (1, A)}
    finally:
        await holder.close()
        await purger.close()


async def test_purge_ok_waits_for_every_holder_or_the_deadline(monkeypatch) -> None:
    loop = asyncio.get_running_loop()
    waits = purge.Waits(loop, lambda: 3)
    got: list[int] = []
    token = waits.token()
    assert token == "3.1" and waits.token() == "3.2"
    waits.expect(token, (5, 6))
    waits.wait(token, got.append)
    waits.answered(f"{token} 5 4")
    waits.answered(f"{token} 9 100")  # not a holder asked
    waits.answered("3.2 6 100")  # another purge's
    assert got == []
    waits.answered(f"{token} 6 1")
    assert got == [5]
    waits.expect("none", ())
    waits.wait("none", got.append)
    assert got == [5, 0]
    monkeypatch.setattr(purge, "ANSWER_WAIT", 0.05)
    waits.expect("late", (5, 6))
    waits.wait("late", got.append)
    waits.answered("late 5 2")
    await asyncio.sleep(0.2)
    assert got == [5, 0, 2]
    waits.expect("fenced", (5,))
    waits.wait("fenced", got.append)
    waits.finish_all()
    assert got == [5, 0, 2, 0]
    assert purge.Request.parse(purge.Request(QID, 0, 0, "3.9", (5, 6)).payload()) == purge.Request(
        QID, 0, 0, "3.9", (5, 6))


async def test_answers_that_come_before_the_purges_commit_returned_are_counted() -> None:
    """The request goes out at the purge's commit; the holders' answers can arrive before that commit's reply
    does. They count, and purge-ok goes at once when the commit returns (before: dropped, purge-ok waited the
    deadline and left them out)."""
    waits = purge.Waits(asyncio.get_running_loop(), lambda: 3)
    got: list[int] = []
    waits.expect("early", (5, 6))
    waits.answered("early 5 4")
    waits.answered("early 6 1")
    assert got == []  # not committed yet: purge-ok waits for the commit
    waits.wait("early", got.append)
    assert got == [5]
    waits.expect("half", (5, 6))
    waits.answered("half 5 2")
    waits.wait("half", got.append)
    assert got == [5]
    waits.answered("half 6 3")
    assert got == [5, 5]
    waits.expect("rolled back", (5,))
    waits.forget("rolled back")
    waits.answered("rolled back 5 9")
    waits.wait("rolled back", got.append)  # (a wait of a forgotten purge answers with nothing)
    assert got == [5, 5, 0]


async def until(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("commit_reply", ["prompt", "after_the_answer"])
async def test_two_nodes_a_purge_counts_the_other_nodes_prefix_and_leaves_its_deliveries(nodes, admin,
                                                                                        commit_reply) -> None:
    """b reserved five rows and delivered two (one acked): a's purge deletes the three in b's prefix and the
    ready ones, counts them, and b's delivered one stays; b delivers nothing more. ``after_the_answer``: a's acker
    goes on from the purge's commit only once b's answer has come (as a loaded machine can order them; CI
    met it, counting 3): purge-ok still counts b's three."""
    a, b = await nodes("a"), await nodes("b")
    if commit_reply == "after_the_answer":
        wait = a.purge_waits.wait

        async def late(token: str, callback) -> None:
            await until(lambda: b.acker.idle() and not b.acker.answers)
            await asyncio.sleep(0.5)  # b's notice on its way to a's listening connection
            wait(token, callback)

        a.purge_waits.wait = lambda token, callback: asyncio.ensure_future(late(token, callback))
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    for i in range(8):
        qa.publish(b"m%d" % i, 2, True)
    await a.wait_idle()
    qb.set_room(lambda most: min(most, 5))
    first = await fetch_wait(qb)
    second = qb.fetch(True)
    assert second is not None and len(qb.buffer) == 3
    qb.ack([first[0]])
    counted: list[int] = []
    qa.purge()
    assert qa.when_purged(counted.append)
    # purge-ok comes within purge.ANSWER_WAIT (5 s) and a statement: waiting only those same 5 s raced the
    # purge's own timer (failed once under the suite's load with nothing counted yet). A late answer from b still
    # fails the test: the count would then leave out b's three.
    await until(lambda: bool(counted), timeout=purge.ANSWER_WAIT + 10)
    await b.wait_idle()
    assert counted == [6] and not qb.buffer and qb.fetch(True) is None
    assert [r[0] for r in await admin.fetch("SELECT seq FROM leveret.message")] == [second[0]]
    assert (await admin.fetchrow("SELECT state, owner FROM leveret.message"))[0] == 1


async def test_a_node_whose_consumers_have_no_room_reads_the_head_rather_than_reserving_it(nodes, admin) -> None:
    """a's consumers have no room: its TTL judgement reads the head's expiries (no row reserved, so b's
    consumers miss none), and only the rows it judges expired are reserved, to be dropped."""
    a, b = await nodes("a"), await nodes("b")
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    now = 1_000_000
    for i, expiry in enumerate((now - 2, now - 1, now + 50, now + 60)):
        qb.publish(b"m%d" % i, 2, True, expiry=expiry)
    await b.wait_idle()
    qa.set_room(lambda most: 0)
    available = asyncio.Event()
    qa.on_available = available.set
    await until(lambda: qa.head_expiry() is not None)  # (asked for while not at hand; a recount may call first)
    assert qa.head_expiry() == now - 2
    assert await admin.fetchval("SELECT count(*) FROM leveret.message WHERE state <> 0") == 0
    available.clear()
    dropped, _ = qa.dropwhile(lambda e: e is not None and e <= now)
    assert dropped == 0  # the expired rows are reserved next, only they
    await asyncio.wait_for(available.wait(), 5)
    assert len(qa.buffer) == 2
    dropped, head = qa.dropwhile(lambda e: e is not None and e <= now)
    await a.wait_idle()
    assert dropped == 2 and head is None
    assert [r[0] for r in await admin.fetch("SELECT expiry FROM leveret.message WHERE state = 0 ORDER BY seq")] == [
        now + 50, now + 60]
