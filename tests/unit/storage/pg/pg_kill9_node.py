"""A Leveret cluster node in a process of its own, for the kill -9 test (test_pg_kill9.py): it joins the
cluster at argv[1], publishes argv[2] messages to queue "q" (confirmed), fetches half of them with acks
required (the batch reserves them all), prints "ready <epoch>" and waits to be killed."""

from __future__ import annotations

import asyncio
import sys

from storage.pg.cluster import PgCluster


async def main(dsn: str, n: int) -> None:
    node = await PgCluster.connect(dsn, "victim")
    q = node.open_queue("/", "q")
    for i in range(n):
        q.publish(b"m%d" % i, 8, True, confirm=i)
    await node.wait_idle()
    assert sorted(q.drain_confirmed()) == list(range(n))
    available = asyncio.Event()
    q.on_available = available.set
    taken = 0
    while taken < n // 2:
        if q.fetch(True) is None:
            await asyncio.wait_for(available.wait(), 10)
            available.clear()
        else:
            taken += 1
    print("ready", node.epoch, flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
