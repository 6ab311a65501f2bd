"""The planner's statistics of ``leveret.message`` are kept fresh by the members (storage/pg/planner_statistics.py;
issue 15: "statistics kept fresh by Leveret"): a table that grew or shrank tenfold since its last ANALYZE is
analysed at once, not at autovacuum's next look (a minute away), so that prepared statements turned generic are
not planned on the statistics of an empty table."""

from __future__ import annotations

import asyncio

from storage.pg import planner_statistics
from storage.pg.planner_statistics import drifted

pytest_plugins = ["pg_fixtures"]


def test_drift_is_tenfold_and_ten_thousand_rows() -> None:
    assert drifted(-1, 10_000) and drifted(0, 10_000)  # never analysed, now a backlog
    assert not drifted(-1, 9_999)  # small tables: autovacuum's threshold is enough
    assert drifted(2_000, 20_001) and not drifted(2_000, 20_000)
    assert drifted(200_000, 19_999) and not drifted(200_000, 20_000)  # shrunk tenfold
    assert not drifted(10_500, 1_000)  # tenfold, but fewer than 10,000 rows apart
    assert not drifted(1_000_000, 1_500_000)


async def planner_view(admin) -> tuple[int, int]:
    """(reltuples, manual ANALYZE count) of the table; autovacuum's analyses count elsewhere."""
    row = await admin.fetchrow("SELECT c.reltuples::bigint, coalesce(s.analyze_count, 0) FROM pg_class c "
                               "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                               "WHERE c.oid = 'leveret.message'::regclass")
    return int(row[0]), int(row[1])


async def flush_stats(admin) -> None:
    """This session's row counts to the statistics collector now (PostgreSQL 15: else within 1 to 10 s)."""
    await admin.execute("SELECT pg_stat_force_next_flush()")
    await admin.execute("SELECT 1")


async def until(predicate, timeout: float = 10.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_a_table_grown_or_shrunk_tenfold_is_analysed(nodes, admin, monkeypatch) -> None:
    monkeypatch.setattr(planner_statistics, "CHECK_INTERVAL", 0.2)
    a = await nodes("a")
    keeper = a.planner_statistics
    assert keeper is not None
    assert (await planner_view(admin))[1] == 0
    # Only the keeper may analyse here: autovacuum's own look (the test server's naptime is short) would move
    # reltuples first on a loaded machine, and the drift the keeper watches for would be gone.
    await admin.execute("ALTER TABLE leveret.message SET (autovacuum_enabled = false)")
    qid = await admin.fetchval("INSERT INTO leveret.queue (vhost, name) VALUES ('/', 'backlog') RETURNING queue_id")
    await admin.execute("INSERT INTO leveret.message (seq, queue_id, priority, state, persistent, size, body) "
                        "SELECT g, $1, 0, 0, true, 1, '\\x00'::bytea FROM generate_series(1, 30000) g", qid)
    await flush_stats(admin)

    async def analysed(times: int, low: int, high: int) -> bool:
        tuples, count = await planner_view(admin)
        return keeper.analyzed == times and count == times and low <= tuples <= high

    assert await until(lambda: analysed(1, 29_000, 31_000)), (keeper.analyzed, await planner_view(admin))

    await admin.execute("DELETE FROM leveret.message WHERE queue_id = $1", qid)
    await flush_stats(admin)
    assert await until(lambda: analysed(2, 0, 0)), (keeper.analyzed, await planner_view(admin))

    # In step with the table: no more ANALYZE, however often it looks.
    await asyncio.sleep(1.0)
    assert keeper.analyzed == 2 and (await planner_view(admin))[1] == 2
