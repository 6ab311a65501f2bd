"""Credit flow (issue 4, "Flow"): a publisher floods a queue whose store is slowed; the broker's resident
memory stays bounded, and a second connection consuming from another queue keeps its rate.

The broker runs with the test hook ``LEVERET_TEST_FSYNC_DELAY_MS`` (storage/syncer.py): its fsync thread
sleeps that long before each fsync round, as a slow disk would, so persistent publishes wait long for their
fsync. Credit flow (broker/queues/queue_process.py, ``FLOW_HIGH`` / ``FLOW_LOW``) must then stop reading the
flooding connection's socket once ``FLOW_HIGH`` of the queue's publishes await their fsync.

* Connection A (raw socket, confirm mode) floods 4 KiB persistent messages into durable queue QA from
  ``CHANNELS`` channels, each allowing ``WINDOW`` unconfirmed publishes, for ``FLOOD`` seconds: 40 000
  unconfirmed publishes in all, ten times the credit, so the client's window is never what holds A back.
* Connection B publishes small transient messages at ``B_RATE``/s to non-durable queue QB and consumes them
  (auto-ack) on the same connection, timing each from publish to delivery.
* A sampler reads the broker's VmRSS from /proc, and how many of A's publishes are inside the broker
  (unconfirmed, minus those still unsent in this process or queued in either kernel's socket buffers).

Asserted:

* A was throttled by credit flow: the publishes the broker had read but not confirmed never exceeded the
  credit (4000) by more than a read's worth of slack, and so A's confirm rate was bounded by the slowed
  disk: at most that many per fsync round. Without credit flow the broker reads A as fast as it can parse
  (measured: ~30 000 publishes inside it, ~32 000 confirms/s with group commit), so both fail.
* A was let go again each time (FLOW_LOW): it kept being confirmed throughout, nothing was nacked.
* Resident memory stayed under idle + ``RSS_HEADROOM``.
* B kept ≥ 90 % of its offered rate in every 2-second window of the flood, lost nothing, and its p99
  latency stayed under 200 ms.

No memory watermark is configured: paging and the memory alarm would hold A back by other means (the
alarm blocks publishers outright), and this test is about credit flow alone.
"""

from __future__ import annotations

import itertools
import select
import socket
import struct
import threading
import time
from typing import NamedTuple

import pika
import pytest
from rawamqp import RawAMQPClient, body_frame, commands, content_header_frame, method_frame

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(60)]

MIB = 1 << 20
# 500 ms rather than 200: the broker's fsync is a group commit, so without credit flow the confirm rate is
# not bounded by the disk at all and only the unconfirmed backlog grows, by ingest rate × fsync round. At
# 200 ms that is ~13 000 here, close enough to the credit that a slower machine could pass without credit
# flow; at 500 ms it is ~30 000, far from it.
FSYNC_DELAY_MS = 500
FLOOD = 8.0  # seconds A floods
MSG_SIZE = 4096
CHANNELS = 4
WINDOW = 10_000  # unconfirmed publishes per channel of A
# broker/queues/queue_process.py FLOW_HIGH: the publishes a queue lets wait for their fsync before it stops
# reading its publishers (written here, not imported, so the test fails if the broker's credit grows).
CREDIT = 4000
# What the broker may read beyond the credit: the frames already read when it pauses the socket (a read is
# at most 256 KiB, ~60 publishes) and sampling skew (the sample's parts are not read at one instant; samples
# with a confirm in flight are left out, see Flooder.sample): a quarter of the credit.
CREDIT_SLACK = 1000
B_RATE = 1000  # messages/s B offers to QB
B_WINDOW = 2.0  # B's rate is checked in windows of this length
B_MIN_FRACTION = 0.9  # of B_RATE, over the whole flood
B_MIN_WINDOW_FRACTION = 0.6  # of B_RATE, in every 2 s window
B_P99_MS = 200.0
# Resident memory above idle. What may legitimately be in the broker while A is throttled: the credit's
# worth of publishes awaiting their fsync (4000 × 4 KiB = 16 MiB of bodies, ~32 MiB as Python objects), the
# queue's RAM head (16 MiB by default for a queue nobody consumes, mostly the same messages), read and
# write buffers, the allocator's slack: ~50 MiB. Measured +22..35 MiB; 100 MiB leaves room for noise and is
# still less than A's 40 000 unconfirmed publishes (160 MiB of bodies) were the broker to hold them all.
RSS_HEADROOM = 100 * MIB


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class TcpQueues(NamedTuple):
    """One loopback connection's kernel queues, from /proc/net/tcp."""

    client_unsent: int  # A's publishes its kernel holds unsent or unacknowledged
    broker_unread: int  # A's publishes the broker's kernel has received and the broker not yet read
    broker_unsent: int  # confirms the broker's kernel holds on their way to A
    client_unread: int  # confirms A's kernel has received and A not yet read


def tcp_queues(broker_port: int, client_port: int) -> TcpQueues | None:
    """The four queues of one loopback connection; None if either end is not listed."""
    bp, cp = f"{broker_port:04X}", f"{client_port:04X}"
    client = broker = None
    with open("/proc/net/tcp") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 5 or ":" not in parts[1]:
                continue
            local, remote = parts[1].split(":")[1], parts[2].split(":")[1]
            tx, rx = (int(v, 16) for v in parts[4].split(":"))
            if local == cp and remote == bp:
                client = (tx, rx)
            elif local == bp and remote == cp:
                broker = (tx, rx)
    if client is None or broker is None:
        return None
    return TcpQueues(client_unsent=client[0], broker_unread=broker[1], broker_unsent=broker[0],
                     client_unread=client[1])


class Flooder:
    """Connection A: a raw socket in confirm mode. One thread sends, keeping up to ``WINDOW`` publishes
    unconfirmed on each channel; one reads basic.ack / basic.nack."""

    def __init__(self, broker, queue: str) -> None:
        self.client = RawAMQPClient.for_broker(broker, timeout=10)
        c = self.client
        c.handshake(heartbeat=0)
        assert c.frame_max == 0 or c.frame_max >= MSG_SIZE + 8
        props = commands.Basic.Properties(delivery_mode=2)
        self.frames = {}
        for ch in range(1, CHANNELS + 1):
            c.open_channel(ch)
            c.send_method(ch, commands.Confirm.Select())
            c.expect_method(commands.Confirm.SelectOk, ch)
            self.frames[ch] = (method_frame(ch, commands.Basic.Publish(exchange="", routing_key=queue))
                               + content_header_frame(ch, MSG_SIZE, props) + body_frame(ch, b"a" * MSG_SIZE))
        self.frame_len = len(self.frames[1])
        self.sent = dict.fromkeys(self.frames, 0)
        self.confirmed = dict.fromkeys(self.frames, 0)
        self.nacked = 0
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.sock: socket.socket = c.sock
        self.sock.settimeout(None)
        self.broker_port = broker.port
        self.client_port = self.sock.getsockname()[1]
        self.unsent = 0  # bytes of the batch being sent not yet handed to the kernel
        self.send_blocked = 0.0  # seconds spent in sends that took longer than 50 ms
        self.max_unconfirmed = 0
        self.max_in_broker = 0
        self.in_broker_samples = 0  # samples taken with no confirm in flight
        self.found_in_proc = 0  # samples that found A's connection in /proc/net/tcp
        self.partial_frame = 0  # bytes A has read of a frame not yet complete
        self.confirmed_series: list[tuple[float, int]] = []  # (time, total confirmed), from the sampler

    def total_confirmed(self) -> int:
        return sum(self.confirmed.values())

    def unconfirmed(self) -> int:
        return sum(self.sent.values()) - self.total_confirmed()

    def sample(self) -> None:
        """Publishes inside the broker (read from its socket, not yet confirmed): A's unconfirmed ones
        minus those still in this process or in either kernel's socket buffers.

        A confirm on its way back makes the broker look fuller than it is (it confirms a whole fsync round
        at once, with ``multiple``, and reads on at once): a sample is taken only while no confirm is in
        flight — none in either kernel's buffers, and none read by A and not yet counted (the reader
        receives and counts under ``cond``, which the sample holds)."""
        with self.cond:
            unconfirmed = self.unconfirmed()
            queues = tcp_queues(self.broker_port, self.client_port)
            unsent = self.unsent
            partial = self.partial_frame
            self.confirmed_series.append((time.monotonic(), self.total_confirmed()))
        self.max_unconfirmed = max(self.max_unconfirmed, unconfirmed)
        if queues is None:
            return
        self.found_in_proc += 1
        if queues.broker_unsent or queues.client_unread or partial:
            return
        self.in_broker_samples += 1
        in_kernels = unsent + queues.client_unsent + queues.broker_unread
        self.max_in_broker = max(self.max_in_broker, unconfirmed - in_kernels // self.frame_len)

    def send_loop(self) -> None:
        try:
            chans = list(self.frames)
            while not self.stop.is_set():
                batch = []
                with self.cond:
                    room = {}
                    while not self.stop.is_set():
                        room = {ch: WINDOW - (self.sent[ch] - self.confirmed[ch]) for ch in chans}
                        if any(r >= 64 for r in room.values()):
                            break
                        self.cond.wait(0.05)
                    for ch in chans:
                        n = min(64, room.get(ch, 0))
                        if n > 0:
                            batch.append(self.frames[ch] * n)
                            self.sent[ch] += n
                    data = memoryview(b"".join(batch))
                    self.unsent = len(data)
                t = time.monotonic()
                while data:
                    n = self.sock.send(data)
                    data = data[n:]
                    self.unsent = len(data)
                dt = time.monotonic() - t
                if dt > 0.05:
                    self.send_blocked += dt
        except BaseException as e:  # noqa: BLE001 - reported by the test
            if not self.stop.is_set():
                self.error = e

    def recv_loop(self) -> None:
        """Waits for the socket outside ``cond`` and receives and counts under it, so a sample never
        sees confirms out of the kernel and not yet counted."""
        try:
            buf = bytearray()
            while not self.stop.is_set():
                readable, _, _ = select.select([self.sock], [], [], 0.1)
                if not readable:
                    continue
                with self.cond:
                    try:
                        data = self.sock.recv(65536, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
                    if not data:
                        raise ConnectionError("the broker closed connection A")
                    buf += data
                    acks = []
                    while len(buf) >= 7:
                        ftype, ch, size = struct.unpack_from(">BHI", buf)
                        if len(buf) < 8 + size:
                            break
                        if ftype == 1:
                            cls, meth = struct.unpack_from(">HH", buf, 7)
                            if cls == 60 and meth in (80, 120):  # basic.ack / basic.nack
                                tag, _bits = struct.unpack_from(">QB", buf, 11)
                                acks.append((ch, tag, meth == 120))
                            elif cls in (10, 20) and meth == 40:  # connection.close / channel.close
                                raise ConnectionError(f"the broker closed A: {bytes(buf[7:8 + size])!r}")
                        del buf[:8 + size]
                    self.partial_frame = len(buf)
                    for ch, tag, nack in acks:
                        # One queue, so confirms come in order: a tag confirms every tag before it
                        # whether or not "multiple" is set.
                        self.confirmed[ch] = max(self.confirmed[ch], tag)
                        self.nacked += nack
                    if acks:
                        self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001
            if not self.stop.is_set():
                self.error = e


class RateProbe:
    """Connection B: publishes ``B_RATE`` transient messages/s to QB and consumes them (auto-ack) on the
    same connection; records each message's receive time and its latency from publish to delivery."""

    def __init__(self, broker, queue: str) -> None:
        self.conn = pika.BlockingConnection(broker.pika_params())
        self.ch = self.conn.channel()
        self.queue = queue
        self.received: list[tuple[float, float]] = []  # (receive time, latency in s)
        self.sent = 0
        self.t0 = 0.0
        self.error: BaseException | None = None
        self.ch.basic_consume(queue, self._on_message, auto_ack=True)

    def _on_message(self, _ch, _method, _props, body: bytes) -> None:
        now = time.monotonic()
        self.received.append((now, now - float(body[:20])))

    def run(self, duration: float) -> None:
        try:
            self.t0 = t0 = time.monotonic()
            while (now := time.monotonic()) - t0 < duration:
                due = int((now - t0) * B_RATE)
                while self.sent < due:  # on schedule, catching up if this loop was late
                    self.ch.basic_publish("", self.queue, b"%20.6f" % time.monotonic() + b"b" * 80)
                    self.sent += 1
                self.conn.process_data_events(time_limit=0.001)
            end = time.monotonic() + 3.0  # let the last ones arrive
            while len(self.received) < self.sent and time.monotonic() < end:
                self.conn.process_data_events(time_limit=0.05)
        except BaseException as e:  # noqa: BLE001
            self.error = e


class Sampler(threading.Thread):
    def __init__(self, pid: int, flooder: Flooder, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.flooder = flooder
        self.interval = interval
        self.peak_rss = 0
        self.sampling_flood = False
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.peak_rss = max(self.peak_rss, rss(self.pid))
            except OSError:
                return
            if self.sampling_flood:
                self.flooder.sample()
            time.sleep(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


@pytest.mark.serial  # B's rate per 2 s window is the measure: the parallel pass beside it starves B, not the broker
def test_flooding_publisher_is_throttled_and_others_keep_their_rate(start_broker, monkeypatch, uid):
    monkeypatch.setenv("LEVERET_TEST_FSYNC_DELAY_MS", str(FSYNC_DELAY_MS))
    b = start_broker()
    qa, qb = f"{uid}.qa", f"{uid}.qb"
    setup = pika.BlockingConnection(b.pika_params())
    sch = setup.channel()
    sch.queue_declare(qa, durable=True)
    sch.queue_declare(qb, durable=False)
    setup.close()

    probe = RateProbe(b, qb)
    flooder = Flooder(b, qa)
    time.sleep(0.5)
    idle = rss(b.pid)
    sampler = Sampler(b.pid, flooder)
    sampler.start()

    # B alone for a second, then A floods while B goes on.
    lead = 1.0
    probe_thread = threading.Thread(target=probe.run, args=(lead + FLOOD,), daemon=True)
    probe_thread.start()
    time.sleep(lead)
    threads = [threading.Thread(target=flooder.recv_loop, daemon=True),
               threading.Thread(target=flooder.send_loop, daemon=True)]
    t_flood = time.monotonic()
    sampler.sampling_flood = True
    for t in threads:
        t.start()
    time.sleep(FLOOD)
    sampler.sampling_flood = False
    flooder.stop.set()
    t_end = time.monotonic()
    probe_thread.join(15)
    sampler.stop()
    sent_a, confirmed_a = sum(flooder.sent.values()), flooder.total_confirmed()
    flooder.client.close()
    for t in threads:
        t.join(5)
    assert flooder.error is None, f"connection A failed: {flooder.error!r}"
    assert not probe_thread.is_alive(), "connection B did not finish"
    assert probe.error is None, f"connection B failed: {probe.error!r}"
    probe.conn.close()

    # -- B: rate per window of the flood, latency ---------------------------------------------------------
    flood_start = t_flood - probe.t0
    windows = [0] * int(FLOOD // B_WINDOW)
    for t, _lat in probe.received:
        k = int((t - probe.t0 - flood_start) // B_WINDOW)
        if 0 <= k < len(windows):
            windows[k] += 1
    rates = [n / B_WINDOW for n in windows]
    lats = sorted(lat for t, lat in probe.received if t - probe.t0 >= flood_start)
    p50 = lats[len(lats) // 2] * 1000 if lats else float("inf")
    p99 = lats[int(len(lats) * 0.99)] * 1000 if lats else float("inf")
    worst = lats[-1] * 1000 if lats else float("inf")

    # -- A: confirms per second, at most the credit per fsync round -----------------------------------------
    flood = t_end - t_flood
    confirm_rate = confirmed_a / flood
    max_confirm_rate = (CREDIT + CREDIT_SLACK) / (FSYNC_DELAY_MS / 1000)
    series = flooder.confirmed_series
    # Confirmed in each second of the flood, and the longest time without a confirm: A must have been let
    # go again every time (FLOW_LOW), so confirms go on at about one fsync round's pace.
    per_second = []
    for sec in range(int(flood)):
        inside = [c for t, c in series if sec <= t - t_flood < sec + 1]
        per_second.append(inside[-1] - inside[0] if inside else 0)
    changes = [t_flood] + [t for (_t0, c0), (t, c) in itertools.pairwise(series) if c != c0] + [t_end]
    max_gap = max(t1 - t0 for t0, t1 in itertools.pairwise(changes))

    peak = sampler.peak_rss
    report = (f"A: sent {sent_a}, confirmed {confirmed_a} ({confirm_rate:.0f}/s, bound {max_confirm_rate:.0f}/s; "
              f"per second {per_second}, longest gap {max_gap:.2f} s), nacked {flooder.nacked}, max unconfirmed {flooder.max_unconfirmed}, "
              f"max inside the broker {flooder.max_in_broker} ({flooder.in_broker_samples} of {flooder.found_in_proc} samples; credit {CREDIT} + {CREDIT_SLACK}), blocked in "
              f"send {flooder.send_blocked:.1f} s of {flood:.1f}; RSS idle {idle / MIB:.1f} MiB, peak "
              f"{peak / MIB:.1f} MiB (+{(peak - idle) / MIB:.1f}, bound +{RSS_HEADROOM / MIB:.0f}); B: sent "
              f"{probe.sent}, received {len(probe.received)}, rate per {B_WINDOW:.0f} s window of the flood "
              f"{[round(r) for r in rates]}/s (offered {B_RATE}/s), latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
              f"max {worst:.0f} ms")
    print(report)

    # A was throttled by credit flow, and released again.
    assert flooder.found_in_proc > 50, f"A's connection not found in /proc/net/tcp: {report}"
    assert flooder.in_broker_samples > 50, f"too few samples without a confirm in flight: {report}"
    assert flooder.max_in_broker <= CREDIT + CREDIT_SLACK, f"the broker read past its credit: {report}"
    assert confirm_rate <= max_confirm_rate, f"A's confirms outran the slowed disk: {report}"
    assert flooder.nacked == 0, report
    assert max_gap < 4 * FSYNC_DELAY_MS / 1000, f"A stopped being confirmed (not released?): {report}"
    # Memory stayed bounded.
    assert peak - idle < RSS_HEADROOM, f"resident memory grew too much: {report}"
    # B kept its rate.
    assert len(probe.received) == probe.sent, f"B lost messages: {report}"
    # Over the flood B is served at its offered rate; a single 2 s window may dip (a pause of a few hundred
    # ms on a 2-core machine, caught up in the next window: seen as [1000, 823, 1176, 998]/s in a quiet CI
    # run), but not collapse (starvation would show as windows near 0).
    assert sum(rates) / len(rates) >= B_RATE * B_MIN_FRACTION, f"B's rate fell: {report}"
    assert min(rates) >= B_RATE * B_MIN_WINDOW_FRACTION, f"B was starved for a while: {report}"
    assert p99 < B_P99_MS, f"B's latency grew: {report}"
