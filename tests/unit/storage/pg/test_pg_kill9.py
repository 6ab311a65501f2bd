"""kill -9 of a process holding a PgCluster: a peer notices that none of its sessions remains (the epoch's
advisory key is free) and requeues every row it had reserved, delivered or only buffered, as redelivered."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

from storage.pg.cluster import PgCluster

pytest_plugins = ["pg_fixtures"]

ROOT = Path(__file__).resolve().parents[4]


async def test_a_killed_node_s_reservations_come_back_redelivered(pg_dsn: str) -> None:
    n = 20
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("pg_kill9_node.py")), pg_dsn, str(n),
        cwd=ROOT, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    b = await PgCluster.connect(pg_dsn, "survivor")
    admin = await asyncpg.connect(pg_dsn)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("ready "), line
        epoch = int(line.split()[1])
        assert await admin.fetchval("SELECT count(*) FROM leveret.message WHERE state = 1 AND owner = $1",
                                    epoch) == n
        await b.reap()
        assert epoch not in b.reaped  # alive: its key is held
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
        killed = time.monotonic()
        while epoch not in b.reaped:  # b's own reaper runs every 0.5 s
            assert time.monotonic() - killed < 10, "the dead node was not reaped"
            await asyncio.sleep(0.02)
        detected = time.monotonic() - killed
        print(f"reaped {detected * 1000:.0f} ms after SIGKILL")
        q = b.open_queue("/", "q")
        available = asyncio.Event()
        q.on_available = available.set
        got = []
        while len(got) < n:
            f = q.fetch(True)
            if f is None:
                await asyncio.wait_for(available.wait(), 5)
                available.clear()
            else:
                got.append(f)
        assert [(m, d) for _, m, d in got] == [(b"m%d" % i, True) for i in range(n)]
        assert await admin.fetchval("SELECT dead_at IS NOT NULL FROM leveret.node WHERE epoch = $1", epoch)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await admin.close()
        await b.close()
