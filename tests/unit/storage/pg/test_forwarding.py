"""The PostgreSQL side of node-local queues across a cluster (storage/pg/forwarding.py), on a real PostgreSQL:
the directory's claims (one queue per name cluster-wide; a stale row of a gone member taken over, a durable
one kept), bindings and their cascade, a member's whole set replaced, the reaper of gone members' rows, the
doorbell; and the forward table: one INSERT per burst whatever the number of messages, confirms after the
commit, the target's batches in order, a failed delivery taken again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from storage.pg import schema
from storage.pg.forwarding import Forwarded, Owner, PgDirectory, PgForwarding

pytest_plugins = ["pg_fixtures"]


@pytest.fixture
async def admin(admin: asyncpg.Connection) -> asyncpg.Connection:
    """pg_fixtures' session, with the schema made: these tests write the tables directly."""
    await schema.migrate(admin)
    return admin


async def live(admin: asyncpg.Connection, *names: str) -> None:
    """Node rows that make ``names`` live members (as storage/pg/cluster.py registers them)."""
    for name in names:
        await admin.execute("INSERT INTO leveret.node (epoch, name, lease_pid, lease_until) "
                            "VALUES (nextval('leveret.node_epoch'), $1, 0, now() + interval '1 hour')", name)


@pytest.fixture
async def directory(pg_dsn: str, admin: asyncpg.Connection):
    made: list[PgDirectory] = []

    def make(node: str) -> PgDirectory:
        d = PgDirectory(pg_dsn, node, timeout=5.0)
        made.append(d)
        return d

    yield make
    for d in made:
        await d.close()


async def until(pred: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_name_is_claimed_once_cluster_wide(admin, directory) -> None:
    await live(admin, "a", "b")
    a, b = directory("a"), directory("b")
    assert await a.claim("/", "q", True, False) is None  # a's now
    assert await a.claim("/", "q", True, False) is None  # a redeclare by its owner
    assert await b.claim("/", "q", False, False) == Owner("a", True, False)
    assert await b.lookup("/", "q") == Owner("a", True, False)
    assert await b.lookup("/", "nothing") is None
    a.release("/", "q")  # fire and forget, in order with a's later calls
    assert await a.lookup("/", "q") is None
    assert await b.claim("/", "q", False, True) is None


async def test_many_names_are_claimed_in_one_statement_as_one_by_one(admin, directory) -> None:
    """claim_many (a definitions import's slice): each name answered as claim() answers it — ours (new, or
    ours already), another live member's, a gone member's non-durable row taken over — in one statement."""
    await live(admin, "a", "b")
    gone, a, b = directory("gone"), directory("a"), directory("b")
    assert await b.claim("/", "b-durable", True, False) is None
    assert await gone.claim("/", "stale", False, False) is None
    assert await a.claim("/", "mine", True, False) is None
    answers = await a.claim_many("/", [("new-1", True, False), ("b-durable", True, False), ("stale", True, False),
                                       ("mine", True, False), ("new-2", False, False), ("new-1", True, False)])
    assert answers == {"new-1": None, "b-durable": Owner("b", True, False), "stale": None, "mine": None,
                       "new-2": None}
    rows = await admin.fetch("SELECT name, node, durable FROM leveret.local_queue WHERE vhost = '/' ORDER BY name")
    assert [tuple(r) for r in rows] == [("b-durable", "b", True), ("mine", "a", True), ("new-1", "a", True),
                                        ("new-2", "a", False), ("stale", "a", True)]
    written = await admin.fetchval("SELECT count(DISTINCT xmin::text) FROM leveret.local_queue "
                                   "WHERE name IN ('new-1', 'new-2', 'stale')")
    assert written == 1, "the rows written by one transaction"
    assert await a.claim_many("/", []) == {}


async def test_binds_made_while_the_session_is_busy_are_one_statement_in_call_order(admin, directory) -> None:
    """Binding rows written without waiting join the write submitted last while it has not started (one statement
    for a burst), never across another call: bind, unbind, bind of one key leaves the row."""
    await live(admin, "a")
    a = directory("a")
    assert await a.claim("/", "q", True, False) is None
    async with admin.transaction():  # the session is held up: everything below queues behind it
        await admin.execute("LOCK TABLE leveret.local_binding IN ACCESS EXCLUSIVE MODE")
        a.bind("/", "x", "q", "k1", "h", b"", "direct")
        for i in range(2, 200):
            a.bind("/", "x", "q", f"k{i}", "h", b"", "direct")
        a.bind("/", "x", "q", "k1", "h", b"again", "direct")  # the same key twice in one statement: the last wins
        a.unbind("/", "x", "q", "k2", "h")
        a.bind("/", "x", "q", "k2", "h", b"back", "direct")
        a.unbind("/", "x", "q", "k3", "h")
        assert len(a._calls) == 4, "the 200 binds are one call, then unbind, bind, unbind"
    await committed(a)
    assert await a.lookup("/", "q") is not None  # after the fire-and-forget unbind
    rows = {r[0]: (bytes(r[1]), r[2]) for r in await admin.fetch(
        "SELECT routing_key, arguments, xmin::text FROM leveret.local_binding")}
    assert len(rows) == 198 and "k3" not in rows
    assert rows["k1"][0] == b"again" and rows["k2"][0] == b"back"
    assert len({xmin for key, (_args, xmin) in rows.items() if key != "k2"}) == 1, "one statement's rows"


async def test_the_calls_do_not_block_the_loop(admin, directory) -> None:
    """claim, lookup and has_binding (what a channel's method or an HTTP handler awaits, broker/topology.py
    "Answers that come later") leave the caller's loop serving while PostgreSQL has not answered (held here by a
    lock on the row's table)."""
    await live(admin, "a", "b")
    a, b = directory("a"), directory("b")
    assert await a.claim("/", "q", True, False) is None
    a.bind("/", "ex", "q", "k", "h", b"", "direct")
    await committed(a)
    assert await b.has_binding("/", "ex", "q", "k", "h") is True
    assert await b.has_binding("/", "ex", "q", "other", "h") is False
    async with admin.transaction():
        await admin.execute("LOCK TABLE leveret.local_queue IN ACCESS EXCLUSIVE MODE")
        claiming = asyncio.ensure_future(a.claim("/", "q2", False, False))
        ticks = 0
        for _ in range(20):  # the loop turns while the claim waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 20 and not claiming.done()
    assert await claiming is None
    assert await b.lookup("/", "q2") == Owner("a", False, False)


async def test_a_gone_members_non_durable_row_is_taken_over_its_durable_one_kept(admin, directory) -> None:
    await live(admin, "b")  # "gone" has no live node row (crashed and reaped, or stopped)
    gone, b = directory("gone"), directory("b")
    assert await gone.claim("/", "reply", False, True) is None
    assert await gone.claim("/", "durable", True, False) is None
    assert await b.claim("/", "reply", False, False) is None  # stale: b's now
    assert await b.claim("/", "durable", True, False) == Owner("gone", True, False)


async def committed(directory) -> None:
    """Wait until the rows the directory wrote without waiting are in."""
    wait = directory.committed()
    if wait is not None:
        await wait


async def test_bindings_are_written_and_go_with_their_queue(admin, directory, pg_dsn) -> None:
    await live(admin, "a", "b")
    a = directory("a")
    fw = await forwarding(pg_dsn, "b")
    try:
        await a.claim("/", "q", False, False)
        a.bind("/", "x", "q", "k.*", "h1", b"args", "topic")
        a.bind("/", "x", "not-mine", "k", "h2", b"", "direct")  # no queue row of a's: not written
        await committed(a)  # bind writes without waiting; a bind-ok waits for this (storage/commits.py)
        queues, bindings = await fw.others()
        assert [(r.name, r.node) for r in queues] == [("q", "a")]
        assert [(r.source, r.queue, r.routing_key, bytes(r.arguments), r.routing) for r in bindings] == [
            ("x", "q", "k.*", b"args", "topic")]
        a.unbind("/", "x", "q", "k.*", "h1")
        a.bind("/", "y", "q", "", "h3", b"", "fanout")
        a.unbind_source("/", "y")
        a.bind("/", "z", "q", "", "h4", b"", "fanout")
        await committed(a)
        assert await a.lookup("/", "q") is not None  # after the fire-and-forget calls
        assert [r.source for r in (await fw.others())[1]] == ["z"]
        a.release("/", "q")
        assert await a.lookup("/", "q") is None
        assert await fw.others() == ([], [])  # the binding went with its queue
    finally:
        await fw.close()


async def test_replace_own_and_drop_transient_own(admin, directory) -> None:
    await live(admin, "a")
    a = directory("a")
    await a.claim("/", "old", False, True)
    await a.replace_own([("/", "kept", True, False), ("/", "temp", False, False)],
                        [("/", "x", "kept", "", "h", b"", "fanout")])
    rows = await admin.fetch("SELECT name FROM leveret.local_queue ORDER BY name")
    assert [r[0] for r in rows] == ["kept", "temp"]
    assert await admin.fetchval("SELECT count(*) FROM leveret.local_binding") == 1
    await a.drop_transient_own()
    assert [r[0] for r in await admin.fetch("SELECT name FROM leveret.local_queue")] == ["kept"]


async def test_the_reaper_drops_non_durable_rows_of_members_that_are_gone(admin, directory, pg_dsn) -> None:
    await live(admin, "a", "b")
    a = directory("a")
    await a.claim("/", "durable", True, False)
    await a.claim("/", "excl", False, True)
    fw = await forwarding(pg_dsn, "b")
    try:
        fw.add("a", "/", "durable", b"for-a", True)
        fw.add("nobody", "", "amq.rabbitmq.reply-to.x", b"to-no-member", False)
        await fw.flushed()
        assert await fw.reap() == 0  # a is alive
        assert await admin.fetchval("SELECT array_agg(target) FROM leveret.forward") == ["a"]  # nobody's: gone
        await admin.execute("UPDATE leveret.node SET dead_at = now() WHERE name = 'a'")
        assert await fw.reap() == 1
        assert [r.name for r in (await fw.others())[0]] == ["durable"]
        assert await admin.fetchval("SELECT count(*) FROM leveret.forward") == 1  # waits for a's durable queue
        await admin.execute("DELETE FROM leveret.local_queue")
        await fw.reap()
        assert await admin.fetchval("SELECT count(*) FROM leveret.forward") == 0
    finally:
        await fw.close()


async def test_a_directory_change_rings_the_other_members(admin, directory, pg_dsn) -> None:
    await live(admin, "a", "b")
    rung = asyncio.Event()
    fw = await forwarding(pg_dsn, "b", on_directory=rung.set)
    try:
        await directory("a").claim("/", "q", False, False)
        await asyncio.wait_for(rung.wait(), 5)
    finally:
        await fw.close()


async def forwarding(dsn: str, node: str, deliver: Callable[[list[Forwarded]], Awaitable[None]] | None = None,
                     on_confirm: Callable[[list[Any], bool], None] | None = None,
                     on_directory: Callable[[], None] | None = None) -> PgForwarding:
    async def nothing(rows: list[Forwarded]) -> None:
        raise AssertionError("nothing should be forwarded here")

    fw = PgForwarding(dsn, node, lambda m: m, on_confirm or (lambda c, ok: None), deliver or nothing,
                      on_directory or (lambda: None))
    await fw.start()
    return fw


async def test_a_burst_is_one_insert_confirmed_after_commit_and_taken_in_order(admin, pg_dsn) -> None:
    await live(admin, "a", "b")
    confirmed: list[tuple[list[Any], bool]] = []
    taken: list[Forwarded] = []

    async def deliver(rows: list[Forwarded]) -> None:
        taken.extend(rows)

    b = await forwarding(pg_dsn, "b", on_confirm=lambda c, ok: confirmed.append((c, ok)))
    a = await forwarding(pg_dsn, "a", deliver=deliver)
    try:
        for i in range(1000):
            b.add("a", "/", "q", b"m%d" % i, True, ("pub", i))
        fan = b"fan"
        b.add("a", "/", "q1", fan, False, ("pub", "f1"))
        b.add("a", "/", "q2", fan, False, ("pub", "f2"))  # the same message, next queue: one row
        b.add("a", "/", "q1", fan, False)  # the same object published again: a row of its own
        await b.flushed()
        assert b.inserts == 1 and b.inserted == 1002
        assert confirmed == [([("pub", i) for i in range(1000)] + [("pub", "f1"), ("pub", "f2")], True)]
        deadline = time.monotonic() + 5
        while len(taken) < 1002:
            assert time.monotonic() < deadline, len(taken)
            await asyncio.sleep(0.02)
        assert [bytes(r.body) for r in taken[:1000]] == [b"m%d" % i for i in range(1000)]
        assert (taken[-2].queues, taken[-2].persistent) == (["q1", "q2"], False)
        assert taken[-1].queues == ["q1"]
        assert [r.id for r in taken] == sorted(r.id for r in taken)
        assert await admin.fetchval("SELECT count(*) FROM leveret.forward") == 0
    finally:
        await a.close()
        await b.close()


async def test_a_failed_delivery_leaves_the_batch_to_be_taken_again(admin, pg_dsn) -> None:
    await live(admin, "a", "b")
    attempts: list[list[bytes]] = []

    async def deliver(rows: list[Forwarded]) -> None:
        attempts.append([bytes(r.body) for r in rows])
        if len(attempts) == 1:
            raise RuntimeError("the local store failed")

    b = await forwarding(pg_dsn, "b")
    b.add("a", "/", "q", b"x", True)
    b.add("a", "/", "q", b"y", True)
    await b.flushed()
    a = await forwarding(pg_dsn, "a", deliver=deliver)
    try:
        deadline = time.monotonic() + 5
        while len(attempts) < 2:
            assert time.monotonic() < deadline, attempts
            await asyncio.sleep(0.02)
        assert attempts[:2] == [[b"x", b"y"], [b"x", b"y"]]
        await until(lambda: _empty(admin))
    finally:
        await a.close()
        await b.close()


async def _empty(admin: asyncpg.Connection) -> bool:
    return await admin.fetchval("SELECT count(*) FROM leveret.forward") == 0


async def test_a_failed_insert_fails_its_confirms(admin, pg_dsn) -> None:
    confirmed: list[tuple[list[Any], bool]] = []
    b = await forwarding(pg_dsn, "b", on_confirm=lambda c, ok: confirmed.append((c, ok)))
    try:
        await admin.execute("ALTER TABLE leveret.forward ADD CONSTRAINT no_big CHECK (length(body) < 10)")
        b.add("a", "/", "q", b"far too long a body", True, "token")
        await b.flushed()
        assert confirmed == [(["token"], False)]
        b.add("a", "/", "q", b"short", True, "next")  # the publisher reconnects and goes on
        await b.flushed()
        assert confirmed[-1] == (["next"], True)
    finally:
        await b.close()


async def test_the_owners_lag_is_read_again_on_demand_not_only_at_the_poll(admin, pg_dsn) -> None:
    """Between two reads the lag estimate only grows (each commit adds its rows); a publisher paused on it must
    not wait for the 2 s poll while the owner keeps up: refresh_owner_lag reads the table now and tells on_lag
    (the member then lets its publishers go: broker/clustering/cluster_forwarding.py)."""
    await live(admin, "a", "b")
    taken: list[Forwarded] = []

    async def deliver(rows: list[Forwarded]) -> None:
        taken.extend(rows)

    told: list[dict[str, int]] = []
    b = PgForwarding(pg_dsn, "b", lambda m: m, lambda c, ok: None, deliver, lambda: None,
                     on_lag=lambda: told.append(dict(b.owner_lag)))
    await b.start()
    a = await forwarding(pg_dsn, "a", deliver=deliver)
    try:
        for i in range(300):
            b.add("a", "/", "q", b"m%d" % i, True)
        await b.flushed()
        assert b.owner_lag.get("a") == 300  # counted at the commit
        await until(lambda: _empty(admin))  # the owner took them all (the estimate learns it at a read)
        b.refresh_owner_lag()
        b.refresh_owner_lag()  # one read at a time
        await until(lambda: _told(told))  # (the poll reads too, but never tells on_lag)
        assert told == [{}] and b.owner_lag.get("a", 0) == 0
    finally:
        await a.close()
        await b.close()


async def _told(told: list[dict[str, int]]) -> bool:
    return bool(told)
