"""A live broker fed mutated valid sessions (issue 17, "fuzzing and faults that stay").

One valid client session (protocol header, login, tune, open, a channel with confirms, declare, bind,
publish with headers and a two-frame body, qos, consume, cancel, closes) is recorded as frames. Each fuzz
connection sends it with 1-3 mutations: bytes flipped or overwritten, a length, type or channel changed,
frames dropped, duplicated, swapped, cut short, or random bytes put between them. Many run at once.

What must hold throughout and after:

* every connection.close the broker sends carries a reply code the spec defines (541 INTERNAL_ERROR, an
  unexpected exception, fails the test), and comes within a second of the bytes that caused it (95th
  percentile; every one within 3 s, as the machine is shared); the others end with our close-ok, a socket
  close where the spec wants no close (bad protocol header, anything before login), or wait for bytes a
  mutated length still announces;
* a healthy client publishing with confirms and getting its messages back never fails;
* the broker's log has no traceback and no "internal error";
* after the fuzz connections are gone, its file descriptors are back to the baseline and its RSS within
  50 MB of it.

50,000 frames in the default run; 1,000,000 behind ``-m long``.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import threading
import time
from dataclasses import dataclass, field

import pika
import pytest
import soak_report
from rawamqp import PROTOCOL_HEADER, body_frame, commands, content_header_frame, method_frame, plain_response

pytestmark = [pytest.mark.leveret_only]

SPEC_CODES = frozenset({320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506, 530, 540})
CONCURRENCY = 24  # below the broker's cap of unfinished handshakes per source (64)
QUIET_AFTER = 1.0  # seconds without an answer after which a connection is taken as waiting for bytes


def session_frames(n: int) -> list[bytes]:
    """The valid session, frame by frame (the protocol header first)."""
    q = f"fz-{n}"
    props = commands.Basic.Properties(content_type="text/plain", delivery_mode=2,
                                      headers={"k": "v", "n": 1, "t": {"a": [1, 2]}})
    return [
        PROTOCOL_HEADER,
        method_frame(0, commands.Connection.StartOk(client_properties={"product": "fuzz", "capabilities": {
            "authentication_failure_close": True, "publisher_confirms": True}}, mechanism="PLAIN",
            response=plain_response("guest", "guest"), locale="en_US")),
        method_frame(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)),
        method_frame(0, commands.Connection.Open(virtual_host="/")),
        method_frame(1, commands.Channel.Open()),
        method_frame(1, commands.Confirm.Select()),
        method_frame(1, commands.Queue.Declare(queue=q, exclusive=True, arguments={"x-max-length": 100})),
        method_frame(1, commands.Queue.Bind(queue=q, exchange="amq.topic", routing_key="a.#")),
        method_frame(1, commands.Basic.Publish(exchange="amq.topic", routing_key="a.b")),
        content_header_frame(1, 10, props),
        body_frame(1, b"hello"),
        body_frame(1, b"world"),
        method_frame(1, commands.Basic.Qos(prefetch_count=10)),
        method_frame(1, commands.Basic.Consume(queue=q, consumer_tag="c")),
        method_frame(1, commands.Basic.Cancel(consumer_tag="c")),
        method_frame(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)),
        method_frame(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)),
    ]


def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    """1-3 mutations of the session; the protocol header is left alone nine times in ten."""
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        low = 0 if rng.random() < 0.1 else 1
        i = rng.randrange(low, len(frames))
        f = bytearray(frames[i])
        kind = rng.randrange(10)
        if kind == 0 and f:  # flip a bit
            j = rng.randrange(len(f))
            f[j] ^= 1 << rng.randrange(8)
        elif kind == 1 and f:  # overwrite a byte
            f[rng.randrange(len(f))] = rng.randrange(256)
        elif kind == 2 and len(f) >= 7:  # a new length: near the old one, or anything
            size = struct.unpack_from(">I", f, 3)[0]
            size = max(0, size + rng.randint(-8, 8)) if rng.random() < 0.7 else rng.randrange(2**32)
            struct.pack_into(">I", f, 3, size)
        elif kind == 3 and f:  # a new frame type
            f[0] = rng.choice([0, 1, 2, 3, 4, 8, 9, 0xCE, rng.randrange(256)])
        elif kind == 4 and len(f) >= 3:  # a new channel
            struct.pack_into(">H", f, 1, rng.choice([0, 1, 2, 65535, rng.randrange(65536)]))
        elif kind == 5:
            del frames[i]
            continue
        elif kind == 6:
            frames.insert(i, bytes(f))
        elif kind == 7 and i + 1 < len(frames):
            frames[i], frames[i + 1] = frames[i + 1], frames[i]
            continue
        elif kind == 8 and f:  # cut short
            del f[rng.randrange(len(f)):]
        else:  # random bytes after it
            f += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        frames[i] = bytes(f)
    return frames


@dataclass
class Outcome:
    closes: list[tuple[int, float]] = field(default_factory=list)  # (reply code, seconds to the close)
    close_ok: int = 0
    socket_closed: int = 0
    waiting: int = 0
    frames: int = 0


def find_close(data: bytes) -> tuple[str, int] | None:
    """("close", code) for a connection.close in the bytes the broker sent, ("close-ok", 0) for close-ok."""
    pos = 8 if data.startswith(b"AMQP") else 0
    while len(data) - pos >= 7:
        ftype, channel, size = struct.unpack_from(">BHI", data, pos)
        end = pos + 7 + size
        if end >= len(data):
            return None
        if ftype == 1 and channel == 0 and size >= 4:
            index = struct.unpack_from(">I", data, pos + 7)[0]
            if index == (10 << 16) | 50 and size >= 6:
                return "close", struct.unpack_from(">H", data, pos + 11)[0]
            if index == (10 << 16) | 51:
                return "close-ok", 0
        pos = end + 1
    return None


async def one_session(host: str, port: int, frames: list[bytes], outcome: Outcome) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"".join(frames))
        outcome.frames += len(frames)
        sent = time.monotonic()
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        got = b""
        while True:
            left = QUIET_AFTER - (time.monotonic() - sent)
            try:
                chunk = await asyncio.wait_for(reader.read(65536), max(left, 0.001))
            except TimeoutError:
                outcome.waiting += 1
                return
            except (ConnectionError, OSError):
                chunk = b""
            if not chunk:
                outcome.socket_closed += 1
                return
            got += chunk
            found = find_close(got)
            if found is None:
                continue
            if found[0] == "close-ok":
                outcome.close_ok += 1
            else:
                outcome.closes.append((found[1], time.monotonic() - sent))
                try:
                    writer.write(struct.pack(">BHI", 1, 0, 4) + struct.pack(">HH", 10, 51) + b"\xce")
                except (ConnectionError, OSError):
                    pass
            return
    finally:
        writer.transport.abort()


async def fuzz(host: str, port: int, total_frames: int, seed: int) -> Outcome:
    rng = random.Random(seed)
    outcome = Outcome()
    n = 0
    pending: set[asyncio.Task] = set()
    while outcome.frames < total_frames or pending:
        while len(pending) < CONCURRENCY and outcome.frames + 20 * len(pending) < total_frames:
            n += 1
            pending.add(asyncio.ensure_future(one_session(host, port, mutate(session_frames(n), rng), outcome)))
        if not pending:
            break
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    return outcome


class Canary(threading.Thread):
    """A healthy client: publish with confirms, then get the message back, over and over."""

    def __init__(self, broker, queue: str) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.queue = queue
        self.stop = threading.Event()
        self.rounds = 0
        self.errors: list[str] = []
        self.slowest = 0.0

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(self.broker.pika_params(heartbeat=0, blocked_connection_timeout=30))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(self.queue, exclusive=True)
            while not self.stop.is_set():
                started = time.monotonic()
                body = f"canary-{self.rounds}".encode()
                ch.basic_publish("", self.queue, body)
                _m, _p, got = ch.basic_get(self.queue, auto_ack=True)
                if got != body:
                    self.errors.append(f"round {self.rounds}: got {got!r}")
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.rounds += 1
                self.stop.wait(0.05)
            conn.close()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def wait_for_fds(pid: int, at_most: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        n = fd_count(pid)
        if n <= at_most or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


@pytest.mark.parametrize("total_frames", [
    pytest.param(50_000, marks=[pytest.mark.timeout(240)], id="50k"),
    pytest.param(1_000_000, marks=[pytest.mark.long, pytest.mark.timeout(7200)], id="1M"),
])
def test_mutated_sessions_are_refused_with_spec_codes_and_the_broker_keeps_serving(start_broker, uid,
                                                                                    total_frames):
    b = start_broker("--set", "log.console.level=warning")
    canary = Canary(b, f"{uid}-canary")
    canary.start()
    while canary.rounds < 3 and not canary.errors:
        time.sleep(0.02)
    fds_before = fd_count(b.pid)
    rss_before = rss_kb(b.pid)
    started = time.monotonic()
    outcome = asyncio.run(fuzz(b.host, b.port, total_frames, seed=total_frames))
    elapsed = time.monotonic() - started
    canary.stop.set()
    canary.join(30)
    fds_after = wait_for_fds(b.pid, fds_before, 10.0)
    rss_after = rss_kb(b.pid)

    codes = sorted({code for code, _ in outcome.closes})
    delays = sorted(d for _, d in outcome.closes)
    p95 = delays[int(len(delays) * 0.95)] if delays else 0.0
    summary = (f"{outcome.frames} frames in {elapsed:.1f}s: {len(outcome.closes)} closes {codes}, "
               f"{outcome.close_ok} close-ok, {outcome.socket_closed} socket closes, {outcome.waiting} waiting; "
               f"close p95 {p95 * 1000:.0f} ms max {delays[-1] * 1000 if delays else 0:.0f} ms; canary "
               f"{canary.rounds} rounds, slowest {canary.slowest * 1000:.0f} ms; fds {fds_before}->{fds_after}; "
               f"RSS {rss_before // 1024}->{rss_after // 1024} MiB")
    print(summary)
    soak_report.record(f"live fuzz ({total_frames} frames)", outcome.frames, canary.rounds, len(canary.errors), 0,
                       note=f"canary rounds as confirmed, its failures as lost; {len(outcome.closes)} closes {codes}")
    assert outcome.frames >= total_frames
    assert not canary.errors, (canary.errors, summary)
    assert canary.rounds > 10, summary
    assert set(codes) <= SPEC_CODES, summary
    assert len(outcome.closes) > outcome.frames // 100, summary  # the mutations did reach the parser
    assert p95 < 1.0 and (not delays or delays[-1] < 3.0), summary
    assert fds_after <= fds_before, summary
    assert rss_after - rss_before < 50 * 1024, summary
    log = b.log_text()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


def test_a_bad_frame_in_the_first_read_still_gets_start_and_a_close(broker):
    """Found by this fuzzer: the protocol header, a valid start-ok and a bad frame in one read used to be
    dropped silently (the start-ok was taken before the connection had started, and the 501 went nowhere).
    The connection starts, logs in, and the bad frame gets its 501."""
    from rawamqp import RawAMQPClient

    frames = session_frames(0)
    bad = bytearray(frames[2])
    bad[-1] = 0x00  # tune-ok's frame-end octet
    with RawAMQPClient.for_broker(broker, timeout=5.0) as c:
        c.send_raw(frames[0] + frames[1] + bytes(bad))
        c.expect_method(commands.Connection.Start, 0)
        c.expect_method(commands.Connection.Tune, 0)
        code, text, class_id, method_id = c.expect_connection_close(2.0)
        assert code == 501 and text.startswith("FRAME_ERROR")
        assert (class_id, method_id) == (0, 0)
