"""``kill -9`` of a broker serving a stream (issue 12, "Crash safety as for durable queues").

Rounds on one data directory: a confirming publisher (pika, confirm mode, persistent messages) publishes to a
durable stream while a consumer group member (``x-stream-group``) acks some of what it gets (offsets not
divisible by 3); the broker is killed with SIGKILL at a random moment and restarted on the same directory.
After each restart:

* the whole stream read from ``first`` by a plain consumer holds every confirmed message, once, at offsets
  0, 1, 2, … without a gap; an offset read in an earlier round still holds the same body (no offset is
  reused, no confirmed message moves or goes);
* the group, consumed again, delivers again every offset its member received and did not ack before the kill
  (unless the message itself was lost: it was never confirmed); an offset it acked (ack sent) may come again
  (the ack may not have reached the broker), and an offset it never delivered comes as a new delivery. What
  the first delivery after the restart hands out again is flagged ``redelivered``.

Bounded: 20 rounds of well under a second of traffic each (about a minute on two cores).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time

import pika
import pytest
from pika.exceptions import AMQPError

pytestmark = [pytest.mark.leveret_only, pytest.mark.slow, pytest.mark.timeout(180)]

STREAM = "crash-stream"
ARGS = {"x-queue-type": "stream"}
GROUP = "g"
ROUNDS = 20


def own_broker(start_broker):
    return start_broker("--management-port", "0", "--prometheus-port", "0")


class Publisher(threading.Thread):
    """Publishes ``r<round>-<n>`` bodies with confirms, one at a time, until stopped or the broker goes."""

    def __init__(self, b, round_no: int) -> None:
        super().__init__(daemon=True)
        self.b = b
        self.round_no = round_no
        self.confirmed: list[bytes] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with contextlib.suppress(AMQPError, OSError):
            conn = pika.BlockingConnection(self.b.pika_params())
            ch = conn.channel()
            ch.confirm_delivery()
            props = pika.BasicProperties(delivery_mode=2)
            n = 0
            while not self.stop.is_set():
                body = b"r%02d-%06d" % (self.round_no, n)
                ch.basic_publish("", STREAM, body, props)  # returns once confirmed; raises on a nack
                self.confirmed.append(body)
                n += 1


class GroupMember(threading.Thread):
    """A member of the group: records each delivery and acks offsets not divisible by 3."""

    def __init__(self, b) -> None:
        super().__init__(daemon=True)
        self.b = b
        self.delivered: list[tuple[int, bytes, bool]] = []
        self.acked: set[int] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        with contextlib.suppress(AMQPError, OSError):
            conn = pika.BlockingConnection(self.b.pika_params())
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)

            def on_message(chx, method, props, body) -> None:
                offset = props.headers["x-stream-offset"]
                self.delivered.append((offset, body, bool(method.redelivered)))
                if offset % 3:
                    chx.basic_ack(method.delivery_tag)
                    self.acked.add(offset)

            ch.basic_consume(STREAM, on_message, arguments={"x-stream-group": GROUP, "x-stream-offset": "first"})
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.02)


def read_all(b) -> dict[int, bytes]:
    """The stream from ``first``, offset → body, with a plain consumer (acks give credit only)."""
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        count = ch.queue_declare(STREAM, durable=True, arguments=ARGS).method.message_count
        ch.basic_qos(prefetch_count=500)
        out: dict[int, bytes] = {}

        def on_message(chx, method, props, body) -> None:
            out[props.headers["x-stream-offset"]] = body
            chx.basic_ack(method.delivery_tag)

        ch.basic_consume(STREAM, on_message, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 20
        while len(out) < count and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert len(out) == count, f"read {len(out)} of {count} messages"
        return out
    finally:
        with contextlib.suppress(AMQPError):
            conn.close()


def drain_group(b, idle: float = 0.4) -> list[tuple[int, bytes, bool]]:
    """Everything the group has for a member now, acked: [(offset, body, redelivered)]."""
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        got: list[tuple[int, bytes, bool]] = []

        def on_message(chx, method, props, body) -> None:
            got.append((props.headers["x-stream-offset"], body, bool(method.redelivered)))
            chx.basic_ack(method.delivery_tag)

        ch.basic_consume(STREAM, on_message, arguments={"x-stream-group": GROUP, "x-stream-offset": "first"})
        last, seen = time.monotonic(), 0
        while time.monotonic() - last < idle:
            conn.process_data_events(time_limit=0.02)
            if len(got) != seen:
                last, seen = time.monotonic(), len(got)
        ch.queue_declare(STREAM, passive=True)  # a round-trip: the acks above have been processed
        return got
    finally:
        with contextlib.suppress(AMQPError):
            conn.close()


def test_kill9_rounds_keep_confirmed_offsets_and_group_deliveries(start_broker):
    b = own_broker(start_broker)
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel().queue_declare(STREAM, durable=True, arguments=ARGS)
    conn.close()
    rng = random.Random(12)
    known: dict[int, bytes] = {}  # offset → body, as read after earlier restarts
    confirmed_all: set[bytes] = set()
    redelivered_seen = 0
    for round_no in range(ROUNDS):
        pub, member = Publisher(b, round_no), GroupMember(b)
        pub.start()
        member.start()
        time.sleep(rng.uniform(0.2, 0.8))
        b.kill9()
        pub.stop.set()
        member.stop.set()
        pub.join(10)
        member.join(10)
        assert not pub.is_alive() and not member.is_alive()
        confirmed_all.update(pub.confirmed)
        b.start()

        stream = read_all(b)
        assert sorted(stream) == list(range(len(stream))), f"round {round_no}: offsets with a gap"
        at = {body: offset for offset, body in stream.items()}
        assert len(at) == len(stream), f"round {round_no}: a body at two offsets"
        missing = confirmed_all - set(at)
        assert not missing, f"round {round_no}: {len(missing)} confirmed messages lost, e.g. {sorted(missing)[:3]}"
        moved = {o: (known[o], stream.get(o)) for o in known if stream.get(o) != known[o]}
        assert not moved, f"round {round_no}: offsets reused or lost: {dict(list(moved.items())[:3])}"
        known = stream

        again = drain_group(b)
        again_offsets = {o for o, _body, _r in again}
        for offset, body, _redelivered in member.delivered:
            if offset in member.acked or stream.get(offset) != body:
                continue  # acked (or never stored: it was not confirmed)
            assert offset in again_offsets, f"round {round_no}: unacked group delivery {offset} not delivered again"
        # What comes again comes first, flagged; new pulls follow in offset order.
        flags = [r for _o, _body, r in again]
        assert flags == sorted(flags, reverse=True), f"round {round_no}: redelivered after new deliveries"
        redelivered_seen += sum(flags)
        assert all(stream.get(o) == body for o, body, _r in again)
    assert len(confirmed_all) > ROUNDS  # the publisher got confirms in the rounds
    assert redelivered_seen > 0  # unacked deliveries did come back, flagged
