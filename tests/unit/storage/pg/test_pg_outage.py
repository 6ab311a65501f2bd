"""PostgreSQL out of reach and back (issue 15: "PostgreSQL unavailable: publishes to PostgreSQL queues are
nacked or blocked, never confirmed and lost; consumers resume when it is back"): a PgCluster fences itself
when its sessions die, fails what it has not committed, reconnects with backoff under a *new* epoch, and
its old epoch's reservations come back redelivered; an ack made under the old epoch matches nothing even
when the node has reserved the same row again. The definitions store refuses writes at once while the
server is down and works again once its feed is read, and never holds the event loop for a server that does not
answer. Real servers (tests/pg_server.py); the
restart tests halt a server of their own (``pg_ctl stop -m immediate``) and start it on the same port."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg
import pytest
from pg_server import PgServer

from storage.metadata_store import MetadataStoreError, MetadataWriteError
from storage.pg.backing_queue import Op, PgBackingQueue
from storage.pg.cluster import PgCluster
from storage.pg.definitions_store import PgDefinitionsStore
from tests.unit.storage.pg.test_pg_cluster import fetch_wait, rows

pytest_plugins = ["pg_fixtures"]


async def until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)


async def publish_outcome(q: PgBackingQueue, body: bytes, token: int, timeout: float = 10.0) -> str:
    """Publish one persistent message with a confirm token: "confirmed" or "failed" (its publisher nacked)."""
    signalled = asyncio.Event()
    q.on_confirm = signalled.set
    q.publish(body, len(body), True, confirm=token)
    deadline = time.monotonic() + timeout
    while True:
        confirmed, failed = q.drain_confirmed(), q.drain_failed()
        assert not (confirmed and failed)
        if confirmed:
            assert confirmed == [token]
            return "confirmed"
        if failed:
            assert failed == [token]
            return "failed"
        remaining = deadline - time.monotonic()
        assert remaining > 0, "neither confirmed nor failed"
        await asyncio.wait_for(signalled.wait(), remaining)
        signalled.clear()


@pytest.mark.slow
async def test_a_node_survives_a_postgresql_restart_under_a_new_epoch(own_postgres: PgServer) -> None:
    dsn = own_postgres.dsn()  # a server of the test's own: its default database
    a = await PgCluster.connect(dsn, "a")
    fenced: list[str] = []
    reconnected: list[int] = []
    a.on_fenced = fenced.append
    a.on_reconnected = reconnected.append
    try:
        q = a.open_queue("/", "q")
        for i in range(3):
            assert await publish_outcome(q, b"m%d" % i, i) == "confirmed"
        seq0, m, redelivered = await fetch_wait(q)  # m0 delivered, m1 and m2 in the prefix: all reserved
        assert (m, redelivered) == (b"m0", False)
        old = a.epoch

        await asyncio.to_thread(own_postgres.halt, "immediate")
        # Down: a publish is failed (its publisher nacked), never confirmed; the node fences itself.
        assert await publish_outcome(q, b"lost?", 100) == "failed"
        await until(lambda: a.fenced, 5, "fenced")
        assert fenced
        assert q.fetch(True) is None
        assert await publish_outcome(q, b"down", 101) == "failed"
        await asyncio.sleep(0.5)  # a few reconnect attempts fail meanwhile (backoff)
        assert a.reconnect_failures >= 1 and a.fenced

        await asyncio.to_thread(own_postgres.resume)
        await until(lambda: not a.fenced, 15, "reconnected")
        assert reconnected == [a.epoch] and a.epoch != old and a.epochs == [old, a.epoch]
        # The delivery made under the old epoch is forgotten: its ack matches nothing ...
        assert q.ack([seq0]) == []
        # ... and every row the old epoch held comes back redelivered, in order.
        got = [await fetch_wait(q, timeout=10) for _ in range(3)]
        assert [(s_m[1], s_m[2]) for s_m in got] == [(b"m0", True), (b"m1", True), (b"m2", True)]
        assert await publish_outcome(q, b"after", 102) == "confirmed"
        assert (await fetch_wait(q))[1:] == (b"after", False)
        q.ack([s for s, _, _ in got])
        await a.wait_idle()
        admin = await asyncpg.connect(dsn)
        try:
            assert await rows(admin) == [(b"after", 1, a.epoch, False)]
            assert await admin.fetchval("SELECT dead_at IS NOT NULL FROM leveret.node WHERE epoch = $1", old)
        finally:
            await admin.close()
    finally:
        await asyncio.wait_for(a.close(), 10)


async def test_an_ack_made_under_the_old_epoch_does_not_touch_the_row_reserved_again(pg_dsn: str) -> None:
    """The node's sessions end (here: terminated one by one by an admin, as a restart ends them); it comes
    back under a new epoch, reaps its old one and reserves the same row again. An ack queued under the old
    epoch and carried out after the reconnect must not delete the new reservation."""
    a = await PgCluster.connect(pg_dsn, "a")
    admin = await asyncpg.connect(pg_dsn)
    try:
        q = a.open_queue("/", "q")
        assert await publish_outcome(q, b"m0", 0) == "confirmed"
        seq, _, _ = await fetch_wait(q)
        old = a.epoch
        await admin.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid",
                            [c.get_server_pid() for c in a.conns])
        # The lease loop's next statement meets a dead session: the node fences itself and reconnects.
        await until(lambda: a.epoch != old and not a.fenced, 10, "reconnected")
        again, m, redelivered = await fetch_wait(q, timeout=10)
        assert (again, m, redelivered) == (seq, b"m0", True)
        assert await rows(admin) == [(b"m0", 1, a.epoch, True)]
        # An ack made before the fence, reaching the acker only now (what fence() and the epoch on every op
        # guard against): dropped, so the row stays reserved under the new epoch.
        q.ops.append(Op("ack", [seq], 0, 0, q.pgen, old))
        a.schedule_ops(q)
        await a.wait_idle()
        assert await rows(admin) == [(b"m0", 1, a.epoch, True)]
        assert q.ack([seq]) == [b"m0"]
        await a.wait_idle()
        assert await rows(admin) == []
    finally:
        await admin.close()
        await asyncio.wait_for(a.close(), 10)


async def test_a_peer_takes_the_rows_of_a_node_that_is_cut_off(pg_dsn: str) -> None:
    """While a node cannot reach PostgreSQL (its reconnects fail), a peer requeues what it held."""
    a = await PgCluster.connect(pg_dsn, "a")
    b = await PgCluster.connect(pg_dsn, "b")
    try:
        qa, qb = a.open_queue("/", "q"), b.open_queue("/", "q")
        assert await publish_outcome(qa, b"m0", 0) == "confirmed"
        await fetch_wait(qa)
        old = a.epoch
        a.dsn = "postgresql://nobody@127.0.0.1:1/none"  # every reconnect attempt is refused
        a.fence("test: cut off", old)
        got = await fetch_wait(qb, timeout=10)  # b's reaper requeued it (a ended its sessions)
        assert got[1:] == (b"m0", True) and old in b.reaped
        await until(lambda: a.reconnect_failures >= 2, 10, "reconnect attempts")
        assert a.fenced
    finally:
        await asyncio.wait_for(a.close(), 10)
        await asyncio.wait_for(b.close(), 10)


async def committed(store: PgDefinitionsStore) -> None:
    """Until the store's writes accepted so far are committed (MetadataWriteError after its timeout)."""
    wait = store.committed()
    if wait is not None:
        await wait


async def read_again(store: PgDefinitionsStore, timeout: float = 10.0) -> None:
    """Until a read of the feed works (the member's poll, every 0.5 s): it makes the session again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await store.changes_since(0)
            return
        except MetadataStoreError:
            assert time.monotonic() < deadline, "the store did not read the feed again"
            await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_the_definitions_store_fails_fast_while_down_and_works_at_once_after(own_postgres: PgServer) -> None:
    dsn = own_postgres.dsn()  # a server of the test's own: its default database
    store = await PgDefinitionsStore.open(dsn, "a", 5.0)
    try:
        store.put("vhost", "v1", {"x": 1})
        await committed(store)
        v1 = (await store.changes_since(0))[-1].version
        await asyncio.to_thread(own_postgres.halt, "immediate")
        started = time.monotonic()
        with pytest.raises(MetadataStoreError):
            await store.changes_since(0)  # the session the server ended: cut
        with pytest.raises(MetadataWriteError):
            store.put("vhost", "v2", {"x": 2})  # refused at once, nothing accepted
        with pytest.raises(MetadataStoreError):
            await store.changes_since(0)  # (the connect refused)
        assert time.monotonic() - started < 3, "an error, not a wait, while the server is down"
        await asyncio.to_thread(own_postgres.resume)
        # The next read of the feed makes a new session; writes are accepted again and committed.
        await read_again(store)
        store.put("vhost", "v3", {"x": 3})
        await committed(store)
        changes = await store.changes_since(v1)
        assert [(c.key, c.value) for c in changes] == [("v3", {"x": 3})]
    finally:
        store.close()


@pytest.mark.slow
async def test_a_server_that_stops_answering_fences_the_node_within_its_lease(own_postgres: PgServer) -> None:
    """No reset, no answer (the server frozen with SIGSTOP): the heartbeat gives up after lease/3 s, so the
    node fences itself, nacks what it could not commit instead of holding it, and comes back once the
    server answers again."""
    a = await PgCluster.connect(own_postgres.dsn(), "a", lease_seconds=3.0)
    try:
        q = a.open_queue("/", "q")
        assert await publish_outcome(q, b"m0", 0) == "confirmed"
        old = a.epoch
        own_postgres.freeze()
        try:
            started = time.monotonic()
            assert await publish_outcome(q, b"m1", 1, timeout=15) == "failed"
            assert a.fenced and time.monotonic() - started < 10
        finally:
            own_postgres.thaw()
        await until(lambda: not a.fenced and a.epoch != old, 30, "reconnected")
        assert await publish_outcome(q, b"m2", 2) == "confirmed"
        # m1 was nacked: it may still have been stored (the frozen server read the INSERT from its socket
        # buffer when it woke, after the node had given up on the session): at least once, never lost.
        got = [(await fetch_wait(q, timeout=10))[1]]
        while got[-1] != b"m2":
            got.append((await fetch_wait(q, timeout=10))[1])
        assert got in ([b"m0", b"m2"], [b"m0", b"m1", b"m2"])
    finally:
        await asyncio.wait_for(a.close(), 10)


@pytest.mark.slow
async def test_the_definitions_store_never_holds_the_loop_for_a_server_that_does_not_answer(
        own_postgres: PgServer) -> None:
    """A frozen server: the event loop turns on throughout; a write is accepted into the journal, and its
    waiter (a client's reply) fails after the store's timeout while the write stays queued; the commit that went
    unanswered cut the session, so the writes after it are refused at once and the feed's reads fail within the
    timeout, until the server answers: then the journal commits what it kept, and writes go again."""
    store = await PgDefinitionsStore.open(own_postgres.dsn(), "a", 1.0)
    loop = asyncio.get_running_loop()
    gaps: list[float] = []

    async def tick() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            gaps.append(loop.time() - last)
            last = loop.time()

    ticking = loop.create_task(tick())
    try:
        store.put("vhost", "v1", {"x": 1})
        await committed(store)
        own_postgres.freeze()
        try:
            store.put("vhost", "v2", {"x": 2})  # accepted: committed once the server answers
            started = time.monotonic()
            with pytest.raises(MetadataWriteError, match="no answer within"):
                await committed(store)
            assert time.monotonic() - started < 3
            await asyncio.sleep(0.3)  # (the journal's try, given up on, cut the session)
            with pytest.raises(MetadataWriteError, match="lost"):
                store.put("vhost", "v2b", {"x": 2})
            started = time.monotonic()
            with pytest.raises(MetadataStoreError):
                await store.changes_since(0)
            assert time.monotonic() - started < 5  # (the journal's try first, then a connect: 1 s each)
        finally:
            own_postgres.thaw()
        await read_again(store)
        store.put("vhost", "v3", {"x": 3})
        await committed(store)
        assert [c.key for c in await store.changes_since(0)] == ["v1", "v2", "v3"]
        assert max(gaps) < 0.25, f"the loop stood still {max(gaps):.2f} s"
    finally:
        ticking.cancel()
        store.close()
