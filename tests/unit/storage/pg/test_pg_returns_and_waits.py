"""Quorum-queue semantics that must hold cluster-wide (issue 15: the integration suite's quorum tests against two
members): the returns behind ``x-delivery-count`` and the delivery limit are PostgreSQL's (``delivery_count``),
so a message requeued on one node and delivered by another carries the right count; a prefix handed back
undelivered does not count; a basic.get waits for one reservation round (``when_fetched``) and a declare-ok for
one recount (``when_counted``) rather than answering from what the node happens to hold; another node's
publish rings the doorbell and the queue is recounted at once. Two PgCluster nodes in one event loop on a
real PostgreSQL (tests/pg_server.py)."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from storage.pg import workers as workers_module
from storage.pg.backing_queue import PgBackingQueue
from storage.pg.cluster import PgCluster
from tests.unit.storage.pg.test_pg_cluster import fetch_wait

pytest_plugins = ["pg_fixtures"]


async def publish_committed(node: PgCluster, q: PgBackingQueue, *bodies: bytes) -> list[int]:
    seqs = [q.publish(b, len(b), True) for b in bodies]
    await node.wait_idle()
    return seqs


async def delivery_counts(admin: asyncpg.Connection) -> list[int]:
    return [r[0] for r in await admin.fetch("SELECT delivery_count FROM leveret.message ORDER BY seq")]


async def test_returns_are_counted_whichever_node_delivered_the_message(nodes) -> None:
    a, b = await nodes("a"), await nodes("b")
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    (seq,) = await publish_committed(a, qa, b"m")
    seen = []
    for i in range(4):  # delivered by b, a, b, a: each requeues it
        node, q = (b, qb) if i % 2 == 0 else (a, qa)
        got = await fetch_wait(q)
        assert got[0] == seq
        seen.append((got[2], q.returns(seq)))
        q.requeue([seq])
        await node.wait_idle()
    assert seen == [(False, 0), (True, 1), (True, 2), (True, 3)]
    assert qa.returns(seq + 1) == 0  # only the message just fetched has a count to tell


async def test_a_prefix_handed_back_undelivered_is_not_a_return(nodes, admin) -> None:
    a, b = await nodes("a"), await nodes("b")
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    s1, s2 = await publish_committed(a, qa, b"one", b"two")
    assert (await fetch_wait(qa))[0] == s1  # a reserved both: "two" waits in its prefix
    assert await delivery_counts(admin) == [1, 1]
    qa.release_buffer()  # nobody takes it here: back to the shared queue, undelivered
    await a.wait_idle()
    assert await delivery_counts(admin) == [1, 0]
    got = await fetch_wait(qb)
    assert got == (s2, b"two", False)
    assert qb.returns(s2) == 0


async def test_a_delivered_publish_requeued_before_its_insert_counts_one_return(nodes) -> None:
    a, b = await nodes("a"), await nodes("b")
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    seq = qa.publish_delivered(b"d", 1, True)  # handed to a consumer at once, not inserted yet
    qa.requeue([seq])  # and returned before the publisher took it
    await a.wait_idle()
    got = await fetch_wait(qb)
    assert got == (seq, b"d", True)
    assert qb.returns(seq) == 1


async def test_a_get_waits_for_one_reservation_round(nodes, monkeypatch) -> None:
    # What answers the waiter must be the round when_fetched starts at once, not its 1 s limit nor the
    # fetcher's poll. Told apart by events, not wall time (a loaded CI machine can take more than the 1 s limit
    # for a PostgreSQL round): the poll is put off past the test (POLL_INTERVAL, read at each use), and
    # _tell_fetched records whether a round (its number) or the limit (None) told the waiter.
    monkeypatch.setattr(workers_module, "POLL_INTERVAL", 600.0)
    a, b = await nodes("a"), await nodes("b")
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    await b.wait_idle()
    tellers: list[int | None] = []
    tell_fetched = qb._tell_fetched

    def recorded(rounds: int | None) -> None:
        if qb._fetch_waiters and (rounds is None or any(w[0] < rounds for w in qb._fetch_waiters)):
            tellers.append(rounds)
        tell_fetched(rounds)

    qb._tell_fetched = recorded  # type: ignore[method-assign]
    a.ring = lambda queue_ids: None  # no doorbell: b knows nothing of a's publish
    (seq,) = await publish_committed(a, qa, b"m")
    assert qb.fetch(True) is None  # nothing at hand on b
    told = asyncio.Event()
    assert qb.when_fetched(told.set)
    await asyncio.wait_for(told.wait(), 30)
    assert tellers and tellers[0] is not None, tellers  # the round itself, not the 1 s limit (None)
    assert qb.fetch(True) == (seq, b"m", False)
    # On an empty queue the round finds nothing and says so just as soon.
    qb.ack([seq])
    await b.wait_idle()
    told.clear()
    tellers.clear()
    assert qb.when_fetched(told.set)
    await asyncio.wait_for(told.wait(), 30)
    assert tellers and tellers[0] is not None, tellers
    assert qb.fetch(True) is None
    b.fence("test")
    assert not qb.when_fetched(told.set)  # PostgreSQL out of reach: answer at once


async def test_a_declare_ok_waits_for_a_recount(nodes) -> None:
    a, b = await nodes("a"), await nodes("b")
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    await b.wait_idle()
    a.ring = lambda queue_ids: None  # no doorbell: only a recount tells b
    await publish_committed(a, qa, b"x", b"y", b"z")
    assert qb.len() == 0  # b's estimate, before it recounts
    told = asyncio.Event()
    assert qb.when_counted(told.set)
    await asyncio.wait_for(told.wait(), 5)
    assert qb.len() == 3
    qb.close()
    assert not qb.when_counted(told.set)


async def test_another_nodes_publish_rings_and_the_queue_is_recounted(nodes) -> None:
    a, b = await nodes("a"), await nodes("b")
    qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
    await b.wait_idle()
    b.last_recount = time.monotonic() + 60  # no periodic recount during the test
    await publish_committed(a, qa, b"x", b"y")
    deadline = time.monotonic() + 30  # only the ring can recount it: the periodic recount is 60 s away
    while qb.len() != 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert qb.len() == 2
