"""Run by test_kill9.py as a separate process: recover a durable queue, then publish persistent messages
with confirm ids for ever, printing each confirmed id once its fsync completed, until killed."""

from __future__ import annotations

import asyncio
import sys

from storage.node_storage import NodeStorage


async def main(data_dir: str, first_id: int) -> None:
    loop = asyncio.get_running_loop()
    ns = NodeStorage(data_dir, loop)
    vq = ns.open_queue("/", "q", True)
    ns.finish_recovery()
    out = sys.stdout

    def on_confirm() -> None:
        out.write("".join(f"{i}\n" for i in vq.drain_confirmed()))
        out.flush()

    vq.on_confirm = on_confirm
    print(f"recovered {vq.len()}", flush=True)
    i = first_id
    while True:
        for _ in range(40):
            size = 6000 if i % 7 == 0 else 100
            vq.publish(b"%d:" % i + b"x" * size, size, True, confirm=i)
            i += 1
        await asyncio.sleep(0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
