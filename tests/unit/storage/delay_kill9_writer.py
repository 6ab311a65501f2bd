"""Run by test_delay_kill9.py as a separate process until SIGKILL: open the delay store, append records
due within a few hundred ms, hand out and mark what is due, checkpoint now and then (off the loop). Prints
``A <seq> <body>`` per append, ``D <n>`` when seqs below n are durable, ``H <body>`` per record handed
out and ``M <body>`` once the dispatch log holding its mark is fsynced."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

from storage.background import WorkerThread
from storage.delay import DelayRecord, DelayStore
from storage.syncer import Syncer


class MarkWaiter:
    """Prints the marks of a generation once the syncer says it is on disk."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, list[bytes]]] = []

    def on_synced(self, generation: int) -> bool:
        while self.pending and self.pending[0][0] <= generation:
            for body in self.pending.pop(0)[1]:
                print("M", body.decode())
        sys.stdout.flush()
        return bool(self.pending)

    def on_sync_failed(self, generation: int) -> bool:
        while self.pending and self.pending[0][0] <= generation:
            self.pending.pop(0)
        return bool(self.pending)


async def main(data_dir: str, round_no: int) -> None:
    loop = asyncio.get_running_loop()
    syncer = Syncer(loop)
    # Checkpoints write off the loop, as the broker's do: the kill lands before, during and after them.
    store = DelayStore(data_dir, syncer, lambda: int(time.time() * 1000), bucket_ms=1000,
                       checkpoint_bytes=64 << 10, background=WorkerThread(loop, "delay-checkpoint"))
    out = sys.stdout

    def durable(n: int) -> None:
        out.write(f"D {n}\n")
        out.flush()

    store.on_durable = durable
    marks = MarkWaiter()
    print("READY", flush=True)
    ready = os.environ.get("DELAY_KILL9_READY")
    if ready:  # the test kills a random time after this, not after a start-up whose length depends on load
        os.close(os.open(ready, os.O_CREAT | os.O_WRONLY))  # an empty file; nothing else runs yet
    rng = random.Random(round_no)
    i = 0
    last_checkpoint = time.monotonic()
    while True:
        now = store.now()
        for _ in range(20):
            body = f"{round_no}:{i}"
            i += 1
            seq = store.append(DelayRecord(now + rng.randrange(0, 400), 1 + i % 3, b"k", b"", body.encode()))
            out.write(f"A {seq} {body}\n")
        batch = store.due(50)
        for d in batch:
            out.write(f"H {d.record.body.decode()}\n")
        out.flush()
        if batch:
            store.dispatched(batch)
            if not marks.pending:
                syncer.wait(marks)
            marks.pending.append((syncer.generation, [d.record.body for d in batch]))
        if time.monotonic() - last_checkpoint > 0.15:
            store.checkpoint_soon()
            last_checkpoint = time.monotonic()
        await asyncio.sleep(0.003)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
