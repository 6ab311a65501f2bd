"""``python -m bench.hop_cost``: the CPU a message costs to cross from one broker process to another, the
number docs/decisions/more-than-one-core.md's model assumed (1.5 µs a side) before building queue shards.

What crosses in that design is what a shard already holds: a publish's raw frames (method, content header,
body: S2's 1 KiB message), tagged with the target queue's id, handed over in batches per event-loop turn (as
the syncer batches fsyncs), never a task or a future per message. Two processes joined by a unix stream socket:

- the *sender* (the connection's shard) appends each message to the turn's batch (a 4-byte length, a 4-byte
  queue id, the frames) and writes the batch with one ``sendall``;
- the *receiver* (the queue's owner) reads into one buffer and cuts it into (queue id, frames) views, as it
  would hand each to the queue (``memoryview`` slices: no copy of the body), without parsing the frames.

Each side measures its own CPU time (``time.process_time``) over the whole run, so the figure is CPU per
message, which machine load inflates far less than a rate. Prints one JSON object.

    python -m bench.hop_cost [--messages 500000] [--batch 256] [--size 1024]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import struct
import time
from typing import Any

from pamqp import body, commands, frame, header

HEAD = struct.Struct("<II")  # length of the frames, target queue id


def publish_frames(size: int) -> bytes:
    """A basic.publish as it came off the wire: method, content header and body frames on channel 1."""
    return b"".join((frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1),
                     frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1),
                     frame.marshal(body.ContentBody(b"x" * size), 1)))


def _sender(sock: socket.socket, frames: bytes, messages: int, batch: int, out: Any) -> None:
    head = HEAD.pack
    n = len(frames)
    cpu0, t0 = time.process_time(), time.perf_counter()
    sent = 0
    while sent < messages:
        parts: list[bytes] = []
        append = parts.append
        for i in range(min(batch, messages - sent)):
            append(head(n, (sent + i) & 1023))
            append(frames)
        sock.sendall(b"".join(parts))
        sent += len(parts) // 2
    sock.shutdown(socket.SHUT_WR)
    out.put({"side": "sender", "cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - t0})


def _receiver(sock: socket.socket, messages: int, out: Any) -> None:
    unpack_from = HEAD.unpack_from
    size = HEAD.size
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    have = 0
    got = 0
    checksum = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while True:
        n = sock.recv_into(view[have:])
        if n == 0:
            break
        have += n
        at = 0
        while have - at >= size:
            length, queue_id = unpack_from(buf, at)
            end = at + size + length
            if end > have:
                break
            message = view[at + size:end]  # what the owner hands to queue ``queue_id``
            checksum += queue_id + len(message)
            got += 1
            at = end
        if at:  # keep the partial message at the front
            view[:have - at] = view[at:have]
            have -= at
    out.put({"side": "receiver", "cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - t0,
             "messages": got, "checksum": checksum})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hop_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--batch", type=int, default=256, help="messages per loop turn (one sendall)")
    ap.add_argument("--size", type=int, default=1024, help="body bytes (S2: 1024)")
    args = ap.parse_args(argv)
    frames = publish_frames(args.size)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_sender, args=(a, frames, args.messages, args.batch, out)),
             ctx.Process(target=_receiver, args=(b, args.messages, out))]
    for p in procs:
        p.start()
    a.close()
    b.close()
    results = {r["side"]: r for r in (out.get(timeout=300), out.get(timeout=300))}
    for p in procs:
        p.join()
    received = results["receiver"]["messages"]
    assert received == args.messages, (received, args.messages)
    report = {
        "messages": args.messages, "batch": args.batch, "frame_bytes": len(frames),
        "sender_cpu_us_per_message": round(results["sender"]["cpu_s"] / args.messages * 1e6, 3),
        "receiver_cpu_us_per_message": round(results["receiver"]["cpu_s"] / args.messages * 1e6, 3),
        "rate_msg_s": round(args.messages / max(results["sender"]["wall_s"], results["receiver"]["wall_s"])),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
