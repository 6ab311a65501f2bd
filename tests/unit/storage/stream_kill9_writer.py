"""Run by test_stream_store.py as a separate process: open a stream through NodeStorage, print the offset
it recovered to, then append for ever, printing N each time ``on_durable(N)`` says offsets < N are on disk,
until killed with SIGKILL. Payloads are a function of the offset, so the test can check every byte."""

from __future__ import annotations

import asyncio
import sys

from storage.node_storage import NodeStorage


def payload(offset: int) -> bytes:
    return b"%d:" % offset + bytes([offset % 251]) * (3000 if offset % 13 == 0 else 40 + offset % 90)


async def main(data_dir: str) -> None:
    loop = asyncio.get_running_loop()
    ns = NodeStorage(data_dir, loop)
    stream = ns.open_stream("/", "s", max_segment_size_bytes=20_000)
    other = ns.open_stream("/", "other", max_segment_size_bytes=20_000)  # shares the message log
    ns.finish_recovery()
    out = sys.stdout

    def durable(n: int) -> None:
        out.write(f"{n}\n")
        out.flush()

    stream.on_durable = durable
    print(f"recovered {stream.next_offset}", flush=True)
    while True:
        for _ in range(30):
            o = stream.next_offset
            assert stream.append(payload(o), 1000 + o) == o
            other.append(b"o" * 100, 1000)
        stream.retain(None, None, 0)
        other.retain(50_000, None, 0)  # the other stream's retention lets message-log segments go
        await asyncio.sleep(0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
