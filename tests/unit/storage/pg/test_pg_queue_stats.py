"""The shared queues' message counters and rates in PostgreSQL (storage/pg/queue_stats.py), on a real
PostgreSQL: every member's counters summed; a flush repeated adds nothing; a member that restarts or stops
keeps its counts in the totals; rates from samples timed by PostgreSQL's clock, the same for two readers of
the same slot and close to the real rate; a member that stops writing leaves the rates; a queue a member no
longer has loses every member's rows."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from storage.pg import schema
from storage.pg.queue_figures import PgQueueFigures, Snapshot
from storage.pg.queue_stats import COUNTERS, PgQueueStatsWriter

pytest_plugins = ["pg_fixtures"]


@pytest.fixture
async def admin(admin: asyncpg.Connection) -> asyncpg.Connection:
    """pg_fixtures' session, with the schema made and two shared queues registered."""
    await schema.migrate(admin)
    for name in ("q1", "q2"):
        await admin.execute("INSERT INTO leveret.queue (vhost, name) VALUES ('/', $1)", name)
    return admin


class Counters:
    """One member's counters of one queue (the broker's QueueStats stands here: an object with counts)."""

    def __init__(self, *values: int) -> None:
        self.values = list(values) + [0] * (len(COUNTERS) - len(values))

    def read(self) -> list[int]:
        return list(self.values)


def member(pg_dsn: str, node: str, queues: dict[str, Counters], slot_ms: int = 5000,
           every: float | None = None) -> PgQueueStatsWriter:
    return PgQueueStatsWriter(pg_dsn, node, lambda: [("/", name, c, c.read()) for name, c in queues.items()],
                              slot_ms=slot_ms, every=every)


async def read(pg_dsn: str, slot_ms: int = 5000) -> Snapshot:
    figures = PgQueueFigures(pg_dsn, max_age=0, rate_slot_ms=slot_ms)
    try:
        snap = await figures.snapshot()
        assert snap is not None
        return snap
    finally:
        await figures.close()


def counts(snap: Snapshot, name: str) -> tuple[int, ...]:
    c = snap.activity("/", name).counts
    return tuple(c[k] for k in COUNTERS)


async def test_totals_are_every_members_sum_and_survive_restarts_and_deaths(admin, pg_dsn) -> None:
    on_a, on_b = {"q1": Counters(5, 3, 1, 0, 4)}, {"q1": Counters(2, 0, 0, 1, 0), "q2": Counters(7)}
    a, b = member(pg_dsn, "a", on_a), member(pg_dsn, "b", on_b)
    try:
        assert await a.flush() and await b.flush()
        snap = await read(pg_dsn)
        assert counts(snap, "q1") == (7, 3, 1, 1, 4)
        assert counts(snap, "q2") == (7, 0, 0, 0, 0)
        # The same counters again (a flush whose answer was lost, sent again): nothing added.
        assert await a.flush() and await a.flush()
        assert counts(await read(pg_dsn), "q1") == (7, 3, 1, 1, 4)
        # Growth is added.
        on_a["q1"].values[0] = 9
        assert await a.flush()
        assert counts(await read(pg_dsn), "q1") == (11, 3, 1, 1, 4)
        # a restarts: its counters start from zero again (a new process, new queue objects); its earlier
        # counts stay in the totals and the new ones add to them.
        await a.close()
        a = member(pg_dsn, "a", {"q1": Counters(1, 1)})
        assert await a.flush()
        assert counts(await read(pg_dsn), "q1") == (12, 4, 1, 1, 4)
        # b dies (no clean stop, no more flushes): what it counted stays.
        b._drop()
        b = member(pg_dsn, "c", {})
        assert counts(await read(pg_dsn), "q2") == (7, 0, 0, 0, 0)
        assert await admin.fetchval("SELECT count(*) FROM leveret.queue_stats") == 3  # (q1, a) (q1, b) (q2, b)
    finally:
        await a.close()
        await b.close()


async def test_a_queue_a_member_no_longer_has_loses_every_members_rows(admin, pg_dsn) -> None:
    on_a, on_b = {"q1": Counters(5), "q2": Counters(1)}, {"q1": Counters(3)}
    a, b = member(pg_dsn, "a", on_a), member(pg_dsn, "b", on_b)
    try:
        assert await a.flush() and await b.flush()
        assert counts(await read(pg_dsn), "q1") == (8, 0, 0, 0, 0)
        del on_a["q1"]  # deleted on a (b has not heard yet)
        assert await a.flush()
        snap = await read(pg_dsn)
        assert counts(snap, "q1") == (0, 0, 0, 0, 0) and counts(snap, "q2") == (1, 0, 0, 0, 0)
        # Declared anew on a: another queue object, counted from zero (the old counts are not brought back).
        on_a["q1"] = Counters(2)
        assert await a.flush()
        assert counts(await read(pg_dsn), "q1") == (2, 0, 0, 0, 0)
        on_a["q1"] = Counters(1)  # and once more, within one flush: the old one's rows go first
        assert await a.flush()
        assert counts(await read(pg_dsn), "q1") == (1, 0, 0, 0, 0)
    finally:
        await a.close()
        await b.close()


async def test_rates_are_the_same_for_readers_of_one_slot_and_follow_the_traffic(admin, pg_dsn) -> None:
    # A sample's counts are read on the member's clock a moment before PostgreSQL stamps it (now()); under a
    # loaded machine that moment varies by up to ~0.15 s, an error of that over the slot. One second keeps it
    # within the bounds below (400 ms once gave 148 for 100 during a full suite run).
    slot_ms = 1000
    t0 = time.monotonic()

    class Steady(Counters):
        """Counts that grow with time: ``per_s`` publishes and acks a second."""

        def __init__(self, per_s: float) -> None:
            super().__init__()
            self.per_s = per_s

        def read(self) -> list[int]:
            n = int(self.per_s * (time.monotonic() - t0))
            return [n, n, 0, 0, n]

    on_a, on_b = {"q1": Steady(100)}, {"q1": Steady(50)}
    a, b = member(pg_dsn, "a", on_a, slot_ms, every=0.1), member(pg_dsn, "b", on_b, slot_ms, every=0.1)
    a.start()
    b.start()
    try:
        await asyncio.sleep(3 * slot_ms / 1000 + 0.2)  # two samples of each member before the current slot
        agreed = 0
        for _ in range(20):
            s1, s2 = await asyncio.gather(read(pg_dsn, slot_ms), read(pg_dsn, slot_ms))
            if s1.rate_slot != s2.rate_slot:
                continue  # read across a slot boundary
            r1, r2 = s1.activity("/", "q1").rates, s2.activity("/", "q1").rates
            assert r1 == r2
            assert 120 <= r1["publish"] <= 180, r1  # a's 100 and b's 50 a second, summed
            assert r1["ack"] == r1["publish"] and r1["deliver_get"] == r1["deliver"] and r1["get"] == 0
            agreed += 1
            await asyncio.sleep(0.05)
        assert agreed >= 10
        # b stops writing (killed): after two slots it is out of the rates, its counts stay in the totals.
        await b.halt()
        before = counts(await read(pg_dsn, slot_ms), "q1")[0]
        await asyncio.sleep(3 * slot_ms / 1000 + 0.1)
        snap = await read(pg_dsn, slot_ms)
        assert 70 <= snap.activity("/", "q1").rates["publish"] <= 130
        assert counts(snap, "q1")[0] > before
        # a member whose samples are of another slot length is not mixed in
        assert (await read(pg_dsn, slot_ms * 3)).activity("/", "q1").rates["publish"] == 0
    finally:
        await a.close()
        await b.close()


async def test_samples_are_kept_for_a_few_slots_only(admin, pg_dsn) -> None:
    on_a = {"q1": Counters(1), "q2": Counters(2)}
    a = member(pg_dsn, "a", on_a, slot_ms=100, every=0.05)
    a.start()
    try:
        await asyncio.sleep(1.5)  # 15 slots
        kept = await admin.fetchval("SELECT count(DISTINCT slot) FROM leveret.queue_stats_sample")
        assert 2 <= kept <= 7  # KEEP_SLOTS back and the current one, give or take a flush
    finally:
        await a.close()
