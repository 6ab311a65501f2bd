"""The channel's consumer acknowledgement timeout (RabbitMQ's consumer_timeout) on the node's clock: with a
ManualClock a delivery not acked in time closes the channel with 406, and an acked one never does, with no
sleep. The channel is built around a stand-in connection: it needs no socket."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from broker.amqp.channel import Channel
from broker.clock import ManualClock
from broker.errors import AMQPError
from broker.message import Message
from broker.queues.queue_consumers import Consumer
from protocol.constants import PRECONDITION_FAILED
from protocol.fastcodec import build_content_header, encode_basic_deliver, shortstr
from storage.commits import COMMITTED_AT_ONCE


class Counters:
    """Every counter starts at 0."""

    def __getattr__(self, name: str) -> int:
        return 0


class Connection:
    """What a channel asks of its reader, recording what it writes and the errors it reports."""

    def __init__(self, clock: ManualClock, consumer_timeout: int | None = None) -> None:
        self.node = SimpleNamespace(clock=clock, counters=Counters(), commits=COMMITTED_AT_ONCE)
        self.settings = SimpleNamespace(max_message_size=1 << 20, consumer_timeout=consumer_timeout)
        self.vhost = SimpleNamespace(name="/", tracing=None)
        self.writable = True
        self.sent: list[bytes] = []
        self.errors: list[tuple[int, AMQPError]] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def send_content(self, channel_id: int, header: bytes, body: bytes) -> None:
        self.sent.append(body)

    def send_delivery(self, channel_id: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool,
                      names_raw: bytes, header: bytes, body: bytes) -> None:
        self.sent.append(encode_basic_deliver(channel_id, consumer_tag_raw, delivery_tag, redelivered, names_raw))
        self.sent.append(body)

    def channel_error(self, channel_id: int, exc: AMQPError) -> None:
        self.errors.append((channel_id, exc))

    def client_capability(self, name: str) -> bool:
        return True


class Queue:
    """A queue as the channel settles with it."""

    def __init__(self, consumer_timeout: int | None) -> None:
        self.settings = SimpleNamespace(consumer_timeout=consumer_timeout)
        self.acked: list[int] = []
        self.requeued: list[int] = []

    def ack(self, seq_ids: list[int]) -> None:
        self.acked.extend(seq_ids)

    def requeue(self, seq_ids: list[int]) -> None:
        self.requeued.extend(seq_ids)

    def schedule_run(self) -> None:
        pass

    def remove_consumer(self, consumer: Any) -> None:
        pass


MSG = Message("", "q", shortstr("") + shortstr("q"), build_content_header(1, b"\x00\x00"), b"m")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def consuming(clock: ManualClock, queue_timeout: int | None, node_timeout: int | None = None):
    conn = Connection(clock, node_timeout)
    ch = Channel(conn, 3)  # type: ignore[arg-type]
    queue = Queue(queue_timeout)
    consumer = Consumer("ctag", ch, queue, False, 0, 0, False, {})  # type: ignore[arg-type]
    ch.consumers["ctag"] = consumer
    return conn, ch, queue, consumer


def test_an_unacked_delivery_closes_the_channel_when_its_timeout_passes(clock):
    conn, ch, queue, consumer = consuming(clock, 300)
    ch.deliver(consumer, queue, 7, MSG, False)  # type: ignore[arg-type]
    clock.advance(0.299)
    assert conn.errors == []
    clock.advance(0.001)
    [(channel_id, err)] = conn.errors
    assert channel_id == 3
    assert err.reply_code == PRECONDITION_FAILED
    assert err.text.startswith("delivery acknowledgement on channel 3 timed out. Timeout value used: 300 ms.")


def test_an_acked_delivery_never_times_out_and_the_timer_stops(clock):
    conn, ch, queue, consumer = consuming(clock, 300)
    ch.deliver(consumer, queue, 7, MSG, False)  # type: ignore[arg-type]
    ch.on_ack(1, False)
    assert queue.acked == [7]
    clock.advance(5.0)
    assert conn.errors == []
    assert clock.pending == 0  # no timer keeps running for a channel with nothing to watch


def test_each_delivery_has_its_own_deadline(clock):
    conn, ch, queue, consumer = consuming(clock, 300)
    ch.deliver(consumer, queue, 1, MSG, False)  # type: ignore[arg-type]
    clock.advance(0.2)
    ch.on_ack(1, False)
    ch.deliver(consumer, queue, 2, MSG, False)  # type: ignore[arg-type]  # due at 0.5
    clock.advance(0.29)  # the check at 0.3 finds nothing due and waits for 0.5
    assert conn.errors == []
    clock.advance(0.01)
    assert len(conn.errors) == 1


def test_the_node_timeout_applies_when_the_queue_has_none(clock):
    conn, ch, queue, consumer = consuming(clock, None, node_timeout=2000)
    ch.deliver(consumer, queue, 1, MSG, False)  # type: ignore[arg-type]
    clock.advance(1.999)
    assert conn.errors == []
    clock.advance(0.001)
    assert "Timeout value used: 2000 ms" in conn.errors[0][1].text


def test_without_a_timeout_no_timer_is_set(clock):
    _conn, ch, queue, consumer = consuming(clock, None)
    ch.deliver(consumer, queue, 1, MSG, False)  # type: ignore[arg-type]
    assert clock.pending == 0


def test_shutdown_cancels_the_timer_and_requeues(clock):
    conn, ch, queue, consumer = consuming(clock, 300)
    ch.deliver(consumer, queue, 9, MSG, False)  # type: ignore[arg-type]
    ch.shutdown()
    assert queue.requeued == [9]
    clock.advance(1.0)
    assert conn.errors == []
    assert clock.pending == 0
