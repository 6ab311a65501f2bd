"""Durability against real broker processes (issue 3): what survives a clean restart and a ``kill -9``.

* durable exchanges, queues, queue bindings and exchange-to-exchange bindings come back after a restart;
  non-durable and exclusive ones do not;
* persistent messages in durable queues come back, in order; transient ones and non-durable queues do not;
* with publisher confirms, every confirmed persistent message survives a SIGKILL sent at a random point
  while a publisher is still publishing: present exactly once, in order;
* after a restart, messages that had been delivered (and, after a crash, every recovered message) come
  back with ``redelivered`` set; acked messages stay gone after a clean restart;
* confirms arrive for every kind of publish (persistent, transient, fanned out, unroutable, to a queue
  deleted while its confirms are pending);
* disk use falls back once the messages are acked.

Tests that restart or kill a broker start a Leveret of their own (``start_broker``) and are
``leveret_only``; the confirm tests run against the shared ``broker`` (or RabbitMQ, with
``LEVERET_TEST_AMQP_URL``). Raw-socket publishers pipeline publishes so that a crash round takes a
fraction of a second, and record exactly which delivery tags the broker confirmed.

The kill -9 rounds run 20 times in the default run (``LEVERET_CRASH_ROUNDS``) and 100 times in the long lane
(marker ``long``, ``make soak``; ``LEVERET_CRASH_LONG_ROUNDS``), which records its rounds, confirmed, lost and
duplicated in the soak table (tests/soak_report.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from pathlib import Path

import pika
import pytest
import soak_report
from amqp_helpers import get_all
from pika.exceptions import ChannelClosedByBroker
from rawamqp import (  # tests/ is on sys.path (rootdir conftest)
    ConnectionClosedError,
    FrameTimeout,
    RawAMQPClient,
    body_frame,
    commands,
    content_header_frame,
    method_frame,
)

pytestmark = pytest.mark.timeout(120)

# Rounds of the kill -9 test (the issue asks for at least 20 in CI; each round takes well under a second
# of publishing plus a broker start).
CRASH_ROUNDS = int(os.environ.get("LEVERET_CRASH_ROUNDS", "20"))
# The long lane's rounds (marker ``long``, left out of the default run; ``make soak`` runs it).
CRASH_LONG_ROUNDS = int(os.environ.get("LEVERET_CRASH_LONG_ROUNDS", "100"))


# -- helpers ---------------------------------------------------------------------------------------------


def own_broker(start_broker, *args: str, **kw):
    """A Leveret of the test's own, without HTTP listeners (faster to start, no port clashes)."""
    return start_broker("--management-port", "0", "--prometheus-port", "0", *args, **kw)


@contextlib.contextmanager
def channel(b, confirm: bool = False):
    conn = pika.BlockingConnection(b.pika_params(blocked_connection_timeout=30))
    try:
        ch = conn.channel()
        if confirm:
            ch.confirm_delivery()
        yield ch
    finally:
        if conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                conn.close()


def exists(b, kind: str, name: str) -> bool:
    """Whether a queue or exchange exists (passive declare on a throwaway channel)."""
    with channel(b) as ch:
        try:
            if kind == "queue":
                ch.queue_declare(name, passive=True)
            else:
                ch.exchange_declare(name, passive=True)
            return True
        except ChannelClosedByBroker as e:
            assert e.reply_code == 404, e
            return False


def redeclare_fails(b, fn) -> int | None:
    """Run ``fn(ch)``; the reply code of the channel error it caused, or None."""
    with channel(b) as ch:
        try:
            fn(ch)
            return None
        except ChannelClosedByBroker as e:
            return e.reply_code


def body_of(seq: int, size: int) -> bytes:
    head = b"%010d|" % seq
    return head + b"x" * max(0, size - len(head))


def seq_of(body: bytes) -> int:
    return int(body[:10])


def drain(b, queue: str, *, ack: bool = True, idle: float = 1.5, limit: float = 60.0) -> list[tuple[int, bool]]:
    """Consume everything in ``queue``: ``[(seq, redelivered), ...]`` in delivery order; acked if ``ack``."""
    out: list[tuple[int, bool]] = []
    with channel(b) as ch:
        ch.basic_qos(prefetch_count=500)
        deadline = time.monotonic() + limit
        last_tag = acked_tag = 0
        for method, _props, body in ch.consume(queue, inactivity_timeout=idle):
            if method is None or time.monotonic() > deadline:
                break
            out.append((seq_of(body), bool(method.redelivered)))
            last_tag = method.delivery_tag
            if ack and len(out) % 250 == 0:
                ch.basic_ack(last_tag, multiple=True)
                acked_tag = last_tag
        if ack and last_tag > acked_tag:  # acking a tag twice is a 406, in RabbitMQ as here
            ch.basic_ack(last_tag, multiple=True)
        ch.cancel()
        ch.queue_declare(queue, passive=True)  # a round-trip: the acks above have been processed
    return out


def dir_bytes(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (like ``du``)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


class PipelinedPublisher:
    """Publishes persistent messages with confirms over a raw socket, keeping at most ``window`` of them
    unconfirmed, and records which delivery tags the broker acked or nacked.

    Message ``i`` (1-based, equal to its delivery tag) carries ``seq_base + i`` in its body. A reader
    thread settles tags (``multiple`` acks included); ``run`` (the publishing loop, in its own thread)
    stops when everything is sent, when the broker goes away, or when ``stop`` is called.
    """

    def __init__(self, b, queue: str, n: int, *, window: int = 200, seq_base: int = 0,
                 sizes: tuple[int, ...] = (64, 6000), delivery_mode: int = 2, exchange: str = "") -> None:
        self.n = n
        self.window = window
        self.seq_base = seq_base
        self.sizes = sizes
        self.queue = queue
        self.exchange = exchange
        self.props = commands.Basic.Properties(delivery_mode=delivery_mode)
        self.client = RawAMQPClient.for_broker(b, timeout=10)
        self.client.handshake(heartbeat=0)
        self.client.open_channel(1)
        self.client.send_method(1, commands.Confirm.Select())
        self.client.expect_method(commands.Confirm.SelectOk, 1)
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.sent = 0
        self._low = 1  # every tag below has been settled
        self._cond = threading.Condition()
        self._stop = False
        self.closed = False
        self.error: BaseException | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._writer = threading.Thread(target=self._write, daemon=True)

    def start(self) -> PipelinedPublisher:
        self._reader.start()
        self._writer.start()
        return self

    def _settle(self, tag: int, multiple: bool, ok: bool) -> None:
        target = self.acked if ok else self.nacked
        with self._cond:
            if multiple:
                for t in range(self._low, tag + 1):
                    if t not in self.acked and t not in self.nacked:
                        target.add(t)
            else:
                target.add(tag)
            while self._low in self.acked or self._low in self.nacked:
                self._low += 1
            self._cond.notify_all()

    def _read(self) -> None:
        try:
            while not self._stop:
                try:
                    f = self.client.recv_frame(timeout=1.0)
                except FrameTimeout:
                    continue
                v = getattr(f, "value", None)
                if isinstance(v, commands.Basic.Ack):
                    self._settle(v.delivery_tag, v.multiple, True)
                elif isinstance(v, commands.Basic.Nack):
                    self._settle(v.delivery_tag, v.multiple, False)
                elif isinstance(v, (commands.Connection.Close, commands.Channel.Close)):
                    self.error = AssertionError(f"broker closed: {v!r}")
                    break
        except (ConnectionClosedError, OSError):
            pass
        finally:
            with self._cond:
                self.closed = True
                self._cond.notify_all()

    def _write(self) -> None:
        c = self.client
        pub = method_frame(1, commands.Basic.Publish(exchange=self.exchange, routing_key=self.queue))
        try:
            for i in range(1, self.n + 1):
                with self._cond:
                    while not self._stop and not self.closed and \
                            i - len(self.acked) - len(self.nacked) > self.window:
                        self._cond.wait(0.5)
                    if self._stop or self.closed:
                        return
                body = body_of(self.seq_base + i, self.sizes[i % len(self.sizes)])
                c.send_raw(pub + content_header_frame(1, len(body), self.props) + body_frame(1, body))
                self.sent = i
        except (ConnectionClosedError, OSError):
            pass

    def wait_confirmed(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.acked) + len(self.nacked) < count and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return len(self.acked) + len(self.nacked) >= count

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._writer.join(10)
        self.client.close()
        self._reader.join(10)


# -- 1. definitions --------------------------------------------------------------------------------------


@pytest.mark.leveret_only
def test_durable_definitions_survive_a_clean_restart(start_broker, uid):
    b = own_broker(start_broker)
    dx, src, hx = f"{uid}.dx", f"{uid}.src", f"{uid}.hx"
    dq, argq, adq = f"{uid}.dq", f"{uid}.argq", f"{uid}.adq"
    tx, tq, xq, tx_src = f"{uid}.tx", f"{uid}.tq", f"{uid}.xq", f"{uid}.tx-src"
    keeper = pika.BlockingConnection(b.pika_params())  # owns the exclusive queue until the restart
    ch = keeper.channel()
    ch.exchange_declare(dx, "direct", durable=True)
    ch.exchange_declare(src, "fanout", durable=True)
    ch.exchange_declare(hx, "headers", durable=True)
    ch.queue_declare(dq, durable=True)
    ch.queue_declare(argq, durable=True, arguments={"x-max-length": 5, "x-message-ttl": 600000})
    ch.queue_declare(adq, durable=True, auto_delete=True)
    ch.queue_bind(dq, dx, routing_key="k")
    ch.queue_bind(argq, hx, arguments={"x-match": "all", "color": "blue"})
    ch.exchange_bind(destination=dx, source=src, routing_key="k")
    # What must not survive: a transient exchange and queue, an exclusive (even if durable) queue, and
    # bindings that involve any of them.
    ch.exchange_declare(tx, "direct", durable=False)
    ch.exchange_declare(tx_src, "fanout", durable=False)
    ch.queue_declare(tq, durable=False)
    ch.queue_declare(xq, durable=True, exclusive=True)
    ch.queue_bind(tq, dx, routing_key="k")
    ch.queue_bind(dq, tx, routing_key="k")
    ch.exchange_bind(destination=dx, source=tx_src, routing_key="k")

    b.restart()
    with contextlib.suppress(Exception):
        keeper.close()

    for kind, name in (("exchange", dx), ("exchange", src), ("exchange", hx), ("queue", dq), ("queue", argq)):
        assert exists(b, kind, name), f"durable {kind} {name} lost in a clean restart"
    for kind, name in (("exchange", tx), ("exchange", tx_src), ("queue", tq), ("queue", xq)):
        assert not exists(b, kind, name), f"{kind} {name} survived a restart"
    # RabbitMQ recovers durable auto-delete queues (they are deleted only when a consumer has come and gone).
    assert exists(b, "queue", adq), "durable auto-delete queue lost in a clean restart"

    # Types and arguments came back as they were: a different redeclaration is refused (406).
    assert redeclare_fails(b, lambda c: c.exchange_declare(dx, "fanout", durable=True)) == 406
    assert redeclare_fails(b, lambda c: c.exchange_declare(dx, "direct", durable=True)) is None
    assert redeclare_fails(b, lambda c: c.queue_declare(argq, durable=True)) == 406
    assert redeclare_fails(b, lambda c: c.queue_declare(
        argq, durable=True, arguments={"x-max-length": 5, "x-message-ttl": 600000})) is None
    assert redeclare_fails(b, lambda c: c.queue_declare(dq, durable=True, auto_delete=True)) == 406

    # The bindings work: src -(e2e)-> dx -(k)-> dq, and the headers binding with its arguments.
    with channel(b, confirm=True) as ch:
        ch.basic_publish(src, "k", b"via-e2e")
        ch.basic_publish(dx, "k", b"direct")
        ch.basic_publish(hx, "", b"blue", pika.BasicProperties(headers={"color": "blue"}))
        ch.basic_publish(hx, "", b"red", pika.BasicProperties(headers={"color": "red"}))
        got = []
        while (m := ch.basic_get(dq, auto_ack=True))[0] is not None:
            got.append(m[2])
        assert got == [b"via-e2e", b"direct"]  # no copy through the lost transient exchange binding
        m = ch.basic_get(argq, auto_ack=True)
        assert m[2] == b"blue"
        assert ch.basic_get(argq, auto_ack=True)[0] is None
        # The max-length argument is in force again.
        for i in range(8):
            ch.basic_publish("", argq, b"%d" % i)
        assert ch.queue_declare(argq, passive=True).method.message_count == 5

    # A second restart keeps the same picture (recovery wrote nothing wrong back).
    b.restart()
    assert exists(b, "queue", dq) and exists(b, "exchange", src)
    assert not exists(b, "queue", tq)
    with channel(b, confirm=True) as ch:
        ch.basic_publish(src, "k", b"again")
        assert ch.basic_get(dq, auto_ack=True)[2] == b"again"


@pytest.mark.leveret_only
def test_deleted_durable_objects_stay_deleted(start_broker, uid):
    b = own_broker(start_broker)
    with channel(b) as ch:
        ch.exchange_declare(f"{uid}.x", "direct", durable=True)
        ch.queue_declare(f"{uid}.q", durable=True)
        ch.queue_declare(f"{uid}.q2", durable=True)
        ch.queue_bind(f"{uid}.q", f"{uid}.x", "k")
        ch.queue_bind(f"{uid}.q2", f"{uid}.x", "k")
        ch.queue_unbind(f"{uid}.q2", f"{uid}.x", "k")
        ch.queue_delete(f"{uid}.q")
        ch.exchange_declare(f"{uid}.gone", "topic", durable=True)
        ch.exchange_delete(f"{uid}.gone")
    b.restart()
    assert not exists(b, "queue", f"{uid}.q")
    assert not exists(b, "exchange", f"{uid}.gone")
    assert exists(b, "queue", f"{uid}.q2")
    with channel(b, confirm=True) as ch:
        ch.basic_publish(f"{uid}.x", "k", b"m")
        assert ch.queue_declare(f"{uid}.q2", passive=True).method.message_count == 0


# -- 2. messages across a clean restart -----------------------------------------------------------------


@pytest.mark.leveret_only
def test_persistent_messages_survive_a_clean_restart_in_order(start_broker, uid):
    b = own_broker(start_broker)
    dq, tq = f"{uid}.durable", f"{uid}.transient"
    sizes = (10, 5000, 300, 70000)  # embedded in the queue index and in the message store
    persistent = []
    with channel(b, confirm=True) as ch:
        ch.queue_declare(dq, durable=True)
        ch.queue_declare(tq, durable=False)
        for i in range(60):
            mode = 1 if i % 3 == 2 else 2
            props = pika.BasicProperties(delivery_mode=mode, content_type="application/x-test",
                                         message_id=f"m{i}", headers={"i": i, "s": "é"}, priority=3)
            body = body_of(i, sizes[i % len(sizes)])
            ch.basic_publish("", dq, body, props)
            ch.basic_publish("", tq, body, props)
            if mode == 2:
                persistent.append((i, body))

    b.restart()
    assert not exists(b, "queue", tq)
    with channel(b) as ch:
        assert ch.queue_declare(dq, passive=True).method.message_count == len(persistent)
        for i, body in persistent:
            method, props, got = ch.basic_get(dq, auto_ack=False)
            assert method is not None, f"message {i} lost"
            assert got == body
            assert not method.redelivered  # never delivered, clean stop
            assert props.delivery_mode == 2 and props.message_id == f"m{i}"
            assert props.content_type == "application/x-test" and props.priority == 3
            assert props.headers == {"i": i, "s": "é"}
            ch.basic_ack(method.delivery_tag)
        assert ch.basic_get(dq)[0] is None

    # Acked before a clean stop: gone for good.
    b.restart()
    with channel(b) as ch:
        assert ch.queue_declare(dq, passive=True).method.message_count == 0


@pytest.mark.leveret_only
def test_delivered_messages_come_back_redelivered_after_a_clean_restart(start_broker, uid):
    """Acked: gone. Delivered but unacked when the broker stopped: back, redelivered. Never delivered:
    back, not redelivered. Requeued before the stop: back in its place, redelivered."""
    b = own_broker(start_broker)
    q = f"{uid}.q"
    with channel(b, confirm=True) as ch:
        ch.queue_declare(q, durable=True)
        for i in range(1, 21):
            ch.basic_publish("", q, body_of(i, 100 if i % 2 else 9000), pika.BasicProperties(delivery_mode=2))
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    tags = {}
    for _ in range(10):  # basic.get, so that acks do not make room for more deliveries
        method, _p, body = ch.basic_get(q)
        tags[seq_of(body)] = method.delivery_tag
    assert sorted(tags) == list(range(1, 11))
    for i in (1, 2, 3, 7):
        ch.basic_ack(tags[i])
    ch.basic_nack(tags[4], requeue=True)  # requeued: redelivered flag is set from now on
    ch.queue_declare(q, passive=True)  # round-trip: the acks are in
    b.restart()  # the broker closes the connection; 5, 6, 8, 9, 10 are requeued
    with contextlib.suppress(Exception):
        conn.close()
    got = drain(b, q)
    assert [s for s, _ in got] == [4, 5, 6, 8, 9, 10, *range(11, 21)]
    assert [r for _, r in got] == [True] * 6 + [False] * 10


# -- 3. kill -9 with publisher confirms -----------------------------------------------------------------


def kill9_rounds(start_broker, uid: str, rounds: int) -> None:
    """A publisher with confirms is still publishing when the broker gets SIGKILL; after restart every
    confirmed message is in the queue exactly once and in order; unconfirmed ones may or may not be.

    ``rounds`` rounds on one broker (one data directory). A round that loses, duplicates or reorders does not
    stop the run: every round is counted, the soak report's row is written (tests/soak_report.py), and the
    asserts come after it. A round that cannot run (no confirms, a nack, a broker that does not start) stops
    the run at once, its row still written with what was counted up to there."""
    rng = random.Random(os.environ.get("LEVERET_CRASH_SEED", uid))
    n = 2000
    window = 150
    report = []
    problems: list[str] = []
    confirmed_total = lost_total = dup_total = 0
    note = ""
    try:
        b = own_broker(start_broker)
        for rnd in range(rounds):
            q = f"{uid}.r{rnd}"
            with channel(b) as ch:
                ch.queue_declare(q, durable=True)
            base = rnd * 1_000_000
            pub = PipelinedPublisher(b, q, n, window=window, seq_base=base).start()
            kill_after = rng.randint(1, n - 4 * window)  # well before the end, so the kill lands mid-stream
            assert pub.wait_confirmed(kill_after, timeout=30), \
                f"round {rnd}: only {len(pub.acked)} of {kill_after} confirms within 30 s"
            time.sleep(rng.random() * 0.01)
            b.kill9()
            pub.stop()
            assert pub.error is None, pub.error
            assert not pub.nacked, f"round {rnd}: nacks {sorted(pub.nacked)[:10]}"
            assert len(pub.acked) < n, f"round {rnd}: everything was confirmed before the kill: it tested nothing"
            confirmed = sorted(pub.acked)
            b.start()
            got = drain(b, q)
            seqs = [s - base for s, _ in got]
            missing = sorted(set(confirmed) - set(seqs))
            dups = len(seqs) - len(set(seqs))
            confirmed_total += len(confirmed)
            lost_total += len(missing)
            dup_total += dups
            if missing:
                problems.append(f"round {rnd}: {len(missing)} confirmed messages lost, first {missing[:10]}")
            if dups:
                problems.append(f"round {rnd}: {dups} messages delivered twice")
            if seqs != sorted(seqs):
                problems.append(f"round {rnd}: out of order")
            if not all(1 <= s <= pub.sent for s in seqs):
                problems.append(f"round {rnd}: messages never published")
            # Crash recovery marks every recovered message redelivered (RabbitMQ's rule).
            if not all(r for _, r in got):
                problems.append(f"round {rnd}: recovered messages not marked redelivered")
            report.append((kill_after, len(confirmed), pub.sent, len(seqs)))
            with channel(b) as ch:
                ch.queue_delete(q)
    except BaseException as e:
        note = f"stopped after {len(report)} rounds: {str(e).splitlines()[0][:80] if str(e) else type(e).__name__}"
        raise
    finally:
        soak_report.record(f"kill -9, confirmed publishes ({rounds} rounds)", len(report), confirmed_total,
                           lost_total, dup_total, note)
    print("kill -9 rounds (kill after, confirmed, sent, recovered):", report)
    assert len(report) == rounds
    assert not problems, f"{len(problems)} round(s) failed: {problems[:10]}"


@pytest.mark.leveret_only
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_confirmed_messages_survive_kill9_at_random_points(start_broker, uid):
    kill9_rounds(start_broker, uid, CRASH_ROUNDS)


@pytest.mark.leveret_only
@pytest.mark.long
@pytest.mark.timeout(max(600, CRASH_LONG_ROUNDS * 30))
def test_confirmed_messages_survive_kill9_at_random_points_long(start_broker, uid):
    """The long lane (``make soak``): 100 rounds unless ``LEVERET_CRASH_LONG_ROUNDS`` says otherwise."""
    kill9_rounds(start_broker, uid, CRASH_LONG_ROUNDS)


@pytest.mark.leveret_only
def test_kill9_unacked_messages_come_back_redelivered(start_broker, uid):
    b = own_broker(start_broker)
    q = f"{uid}.q"
    with channel(b, confirm=True) as ch:
        ch.queue_declare(q, durable=True)
        for i in range(1, 31):
            ch.basic_publish("", q, body_of(i, 50 if i % 2 else 8000), pika.BasicProperties(delivery_mode=2))
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    seen = []
    for _ in range(10):
        method, _p, body = ch.basic_get(q)
        seen.append((seq_of(body), method.delivery_tag))
    assert [s for s, _ in seen] == list(range(1, 11))
    ch.basic_ack(seen[2][1], multiple=True)  # 1..3 acked
    ch.queue_declare(q, passive=True)  # a round-trip: the broker has taken the ack
    time.sleep(0.3)
    b.kill9()
    with contextlib.suppress(Exception):
        conn.close()
    b.start()
    got = drain(b, q)
    seqs = [s for s, _ in got]
    # Acks are not promised to be on disk before a crash (RabbitMQ makes no such promise either), so 1..3
    # may come back; everything else must.
    assert seqs == sorted(set(seqs))
    assert set(range(4, 31)) <= set(seqs), sorted(set(range(4, 31)) - set(seqs))
    assert set(seqs) <= set(range(1, 31))
    assert all(r for _, r in got), "after a crash every recovered message is redelivered"
    print("acked messages back after kill -9:", sorted(set(seqs) & {1, 2, 3}))


@pytest.mark.leveret_only
def test_a_confirmed_burst_handed_straight_to_consumers_survives_kill9(start_broker, uid):
    """Persistent publishes that arrive together (one run: broker/amqp/publish_run.py) into an empty durable
    queue with consumers waiting go straight to them (``attempt_delivery``): each is still written before it is
    confirmed, so after a kill -9 every confirmed one is back, those the consumers held without acking too
    (redelivered, as every message recovered after a crash). (A kill -9 keeps the page cache: that the write
    was fsynced first is test_crash_recovery.py's power-cut test's business.)"""
    b = own_broker(start_broker)
    q = f"{uid}.q"
    with channel(b) as ch:
        ch.queue_declare(q, durable=True)
    conn = pika.BlockingConnection(b.pika_params())
    consumers = conn.channel()
    consumers.basic_qos(prefetch_count=3)
    held: list[int] = []
    for tag in ("one", "two"):
        consumers.basic_consume(q, lambda _c, _m, _p, body: held.append(seq_of(body)), consumer_tag=tag)
    count = 40
    publish = method_frame(1, commands.Basic.Publish(exchange="", routing_key=q))
    header = content_header_frame(1, 64, commands.Basic.Properties(delivery_mode=2))
    burst = b"".join(publish + header + body_frame(1, body_of(i, 64)) for i in range(1, count + 1))
    with RawAMQPClient.for_broker(b) as client:
        client.handshake(heartbeat=0)
        client.open_channel(1)
        client.send_method(1, commands.Confirm.Select())
        client.expect_method(commands.Confirm.SelectOk, 1)
        client.send_raw(burst)  # one write: one run
        acked: set[int] = set()
        while len(acked) < count:
            m = client.wait_for(lambda f: f.is_method(commands.Basic.Ack, 1)
                                or f.is_method(commands.Basic.Nack, 1)).value
            assert isinstance(m, commands.Basic.Ack), m
            acked.update(range(1, m.delivery_tag + 1) if m.multiple else (m.delivery_tag,))
    deadline = time.monotonic() + 10
    while len(held) < 6 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert sorted(held) == list(range(1, 7))  # straight to the two consumers, three each; the rest queued
    b.kill9()
    with contextlib.suppress(Exception):
        conn.close()
    b.start()
    got = drain(b, q)
    assert sorted(s for s, _ in got) == list(range(1, count + 1))
    assert all(r for _, r in got), "after a crash every recovered message is redelivered"


@pytest.mark.leveret_only
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill9_with_consumer_acking_concurrently(start_broker, uid):
    """A consumer acks while the publisher publishes; after SIGKILL nothing confirmed-and-unacked is lost,
    order is kept, nothing is duplicated, and no ack the broker had processed is undone."""
    rng = random.Random(os.environ.get("LEVERET_CRASH_SEED", uid))
    b = own_broker(start_broker)
    n = 3000
    came_back = []
    for rnd in range(max(3, CRASH_ROUNDS // 4)):
        q = f"{uid}.r{rnd}"
        with channel(b) as ch:
            ch.queue_declare(q, durable=True)
        acked_seqs: set[int] = set()  # acks sent (written to the socket; maybe never read by the broker)
        acked_sure: set[int] = set()  # acks followed by a completed round-trip on the channel
        stop = threading.Event()

        def consume(q=q, acked_seqs=acked_seqs, acked_sure=acked_sure, stop=stop):
            pending: list[int] = []
            try:
                conn = pika.BlockingConnection(b.pika_params())
                ch = conn.channel()
                ch.basic_qos(prefetch_count=50)
                for method, _p, body in ch.consume(q, inactivity_timeout=0.2):
                    if stop.is_set():
                        break
                    if method is None:
                        continue
                    seq = seq_of(body)
                    acked_seqs.add(seq)  # before the call: the broker may read it even if we see an error
                    ch.basic_ack(method.delivery_tag)
                    pending.append(seq)
                    if len(pending) >= 10:
                        ch.basic_qos(prefetch_count=50)  # qos-ok: the broker has processed the acks before it
                        acked_sure.update(pending)
                        pending.clear()
            except Exception:  # noqa: BLE001, S110 - the broker is killed under it
                pass

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        pub = PipelinedPublisher(b, q, n, window=100, sizes=(100, 5000)).start()
        assert pub.wait_confirmed(rng.randint(200, n - 200), timeout=30)
        b.kill9()
        stop.set()
        pub.stop()
        consumer.join(10)
        assert not pub.nacked
        b.start()
        got = drain(b, q)
        seqs = [s for s, _ in got]
        assert seqs == sorted(set(seqs)), "out of order or duplicated"
        lost = sorted(set(pub.acked) - acked_seqs - set(seqs))
        assert not lost, f"round {rnd}: {len(lost)} confirmed, unacked messages lost: {lost[:10]}"
        came_back.append((len(acked_sure), len(set(seqs) & acked_sure), len(set(seqs) & (acked_seqs - acked_sure))))
        # The issue asks for more than RabbitMQ promises: an ack the broker has processed (a later
        # synchronous method on the channel was answered) does not come back after a crash.
        back = sorted(set(seqs) & acked_sure)
        assert not back, f"round {rnd}: {len(back)} processed acks undone by kill -9: {back[:10]}"
        with channel(b) as ch:
            ch.queue_delete(q)
    # Acks still in flight when the broker died may or may not have been applied: reported, not asserted.
    print("kill -9 with a consumer: (acks processed, of those back, acks in flight back) per round:", came_back)


# -- 5. confirms for every kind of publish ---------------------------------------------------------------


def test_confirms_arrive_for_every_kind_of_publish(broker, uid):
    dq, tq, fx = f"{uid}.durable", f"{uid}.transient", f"{uid}.fan"
    with channel(broker, confirm=True) as ch:
        try:
            ch.queue_declare(dq, durable=True)
            ch.queue_declare(tq, durable=False)
            ch.exchange_declare(fx, "fanout", durable=False)
            ch.queue_bind(dq, fx)
            ch.queue_bind(tq, fx)
            t0 = time.monotonic()
            for i in range(50):
                # Each basic_publish returns once the broker confirmed it (NackError if nacked).
                ch.basic_publish("", dq, b"p%d" % i, pika.BasicProperties(delivery_mode=2))
                ch.basic_publish("", dq, b"t%d" % i, pika.BasicProperties(delivery_mode=1))
                ch.basic_publish("", tq, b"p%d" % i, pika.BasicProperties(delivery_mode=2))
                ch.basic_publish(fx, "", b"f%d" % i, pika.BasicProperties(delivery_mode=2))
                ch.basic_publish(fx, "", b"g%d" % i, pika.BasicProperties(delivery_mode=1))
                ch.basic_publish("", f"{uid}.nowhere", b"u%d" % i, pika.BasicProperties(delivery_mode=2))
            elapsed = time.monotonic() - t0
            assert ch.queue_declare(dq, passive=True).method.message_count == 200
            assert ch.queue_declare(tq, passive=True).method.message_count == 150
            # Unroutable mandatory: returned, then confirmed.
            with pytest.raises(pika.exceptions.UnroutableError):
                ch.basic_publish("", f"{uid}.nowhere", b"m", pika.BasicProperties(delivery_mode=2),
                                 mandatory=True)
        finally:
            ch.queue_delete(dq)
            ch.queue_delete(tq)
            ch.exchange_delete(fx)
    # Each publish waits for its confirm, so a kind whose confirm waited for something else (a timer, a
    # periodic check: 1 s each) would take minutes. 90 s (0.3 s a publish): a few seconds on a quiet machine,
    # and room for a loaded CI one's fsyncs and a starved broker, still far from a wait per publish.
    assert elapsed < 90, f"300 confirmed publishes took {elapsed:.1f} s"


def test_publishes_to_a_queue_deleted_while_awaiting_confirms_are_acked(broker, uid):
    q = f"{uid}.q"
    with channel(broker) as ch:
        ch.queue_declare(q, durable=True)
    n = 4000
    pub = PipelinedPublisher(broker, q, n, window=n, sizes=(2000, 20000)).start()
    try:
        deadline = time.monotonic() + 10
        while pub.sent < n // 4 and time.monotonic() < deadline:
            time.sleep(0.001)
        with channel(broker) as ch:
            ch.queue_delete(q)
        assert pub.wait_confirmed(n, timeout=20), \
            f"only {len(pub.acked)} acks and {len(pub.nacked)} nacks of {n} (sent {pub.sent})"
        assert not pub.nacked, f"{len(pub.nacked)} nacks"
        assert len(pub.acked) == n
        assert pub.error is None, pub.error
    finally:
        pub.stop()


# -- 6. disk space comes back ----------------------------------------------------------------------------


@pytest.mark.leveret_only
def test_disk_use_falls_back_after_acks(start_broker, uid):
    b = own_broker(start_broker)
    q = f"{uid}.q"
    with channel(b) as ch:
        ch.queue_declare(q, durable=True)
    time.sleep(0.5)
    start_size = dir_bytes(b.data_dir)
    n = 640  # 640 × 64 KiB = 40 MiB persistent, spread over a few store segments
    pub = PipelinedPublisher(b, q, n, window=100, sizes=(64 * 1024,)).start()
    assert pub.wait_confirmed(n, timeout=60)
    pub.stop()
    assert len(pub.acked) == n
    full_size = dir_bytes(b.data_dir)
    assert full_size - start_size > 30 << 20, f"40 MiB published but the data dir grew {full_size - start_size} B"
    got = drain(b, q)
    assert [s for s, _ in got] == list(range(1, n + 1))
    deadline = time.monotonic() + 20
    while True:
        size = dir_bytes(b.data_dir)
        if size - start_size < 4 << 20 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    files = sorted((str(p.relative_to(b.data_dir)), p.stat().st_size) for p in b.data_dir.rglob("*") if p.is_file())
    assert size - start_size < 4 << 20, (
        f"data dir: {start_size} B before, {full_size} B full, still {size} B 20 s after acking all; {files}")
    # A clean restart does not bring the space (or the messages) back.
    b.restart()
    assert dir_bytes(b.data_dir) - start_size < 4 << 20
    with channel(b) as ch:
        assert ch.queue_declare(q, passive=True).method.message_count == 0


@pytest.mark.leveret_only
def test_committed_transaction_survives_kill9(start_broker, uid):
    """tx.commit-ok promises what a publisher confirm promises: the committed persistent messages are on
    disk. A kill -9 right after commit-ok loses none of them."""
    b = start_broker()
    q = f"{uid}-txq"
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.tx_select()
    for i in range(500):
        ch.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    ch.tx_commit()  # returns on commit-ok
    b.kill9()
    b.start()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    got = [int(body) for _method, _props, body in get_all(ch, q, limit=1_000_000)]
    assert got == list(range(500))
    conn.close()
