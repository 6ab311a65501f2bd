"""The planner's statistics of ``leveret.message``, kept fresh by Leveret (docs/decisions/postgres-cluster.md:
a generic plan costed on stale statistics drifted the ack DELETE to a whole-queue scan).

Why: asyncpg prepares every statement, and after five executions PostgreSQL may switch a prepared statement to
a generic plan costed on the table's statistics *of that moment*. A queue table fills in seconds (a backlog of a
million rows in half a minute), while autovacuum looks at it once per ``autovacuum_naptime`` (a minute by
default): measurements before the cluster was built saw an ack DELETE planned while the table was nearly empty scan the whole queue on every
call (0.5 → 17 ms an ack; throughput 3.5k → 200 msg/s, one run in three). The primary key ``seq`` alone
removes that case (schema.py, SCHEMA.md); the reservation and recount statements still read the queue's index
on ``(queue_id, priority, seq)``, whose choice rests on the row count the planner believes.

What: every :data:`CHECK_INTERVAL` seconds a member compares the planner's row count (``pg_class.reltuples``;
-1 before the first ANALYZE) with the live rows the statistics collector counts (``pg_stat_user_tables
.n_live_tup``, a few seconds behind at most), one cheap statement on its lease session. When they differ by
more than :data:`FACTOR` times and by at least :data:`FLOOR` rows (:func:`drifted`), it runs ``ANALYZE
leveret.message`` on a session of its own (a sample of the table, bounded by :data:`ANALYZE_TIMEOUT`), so the
lease's heartbeat never waits for it. Several members may notice the same drift; the first ANALYZE moves
``reltuples`` and the others then find nothing to do.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg

from storage.pg.connections import close_connection, stop_tasks

log = logging.getLogger("leveret.pg.planner_statistics")

CHECK_INTERVAL = 5.0  # seconds between two looks at the counts
FACTOR = 10  # the planner's count is stale once the live rows are this many times more, or fewer
FLOOR = 10_000  # ... and at least this many rows apart (autovacuum's own analyze threshold on the table)
ANALYZE_TIMEOUT = 60.0  # seconds an ANALYZE may take (it samples: well under a second on this machine)
CONNECT_TIMEOUT = 5.0

COUNTS = """
SELECT c.reltuples::bigint, coalesce(s.n_live_tup, 0)
  FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.oid = 'leveret.message'::regclass
"""


def drifted(planned: int, live: int) -> bool:
    """Whether the planner's row count ``planned`` (-1: never analysed) is stale against ``live`` rows."""
    base = max(planned, 0)
    if abs(live - base) < FLOOR:
        return False
    return live > FACTOR * base or live * FACTOR < base


class PlannerStatistics:
    """One member's keeper of the table's statistics (see the module's docstring)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.analyzed = 0  # ANALYZEs this member ran (logs and tests)
        self._last_check = 0.0
        self._task: asyncio.Task[None] | None = None

    async def check(self, conn: asyncpg.Connection) -> None:
        """The look, on ``conn`` (the lease session), when one is due; an ANALYZE started if the counts
        drifted and none of this member's is under way."""
        now = time.monotonic()
        if now - self._last_check < CHECK_INTERVAL or (self._task is not None and not self._task.done()):
            return
        self._last_check = now
        row = await conn.fetchrow(COUNTS)
        if row is None or not drifted(int(row[0]), int(row[1])):
            return
        log.info("pg cluster: leveret.message has about %d rows, the planner believes %d: analysing",
                 int(row[1]), int(row[0]))
        self._task = asyncio.get_running_loop().create_task(self._analyze())

    async def _analyze(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
            await conn.execute("ANALYZE leveret.message", timeout=ANALYZE_TIMEOUT)
            self.analyzed += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the next check tries again; autovacuum remains)
            log.warning("pg cluster: ANALYZE leveret.message failed: %s", exc)
        finally:
            await close_connection(conn)

    async def close(self) -> None:
        """An ANALYZE under way is cancelled (its session closed with it)."""
        task, self._task = self._task, None
        await stop_tasks(task, timeout=CONNECT_TIMEOUT)
