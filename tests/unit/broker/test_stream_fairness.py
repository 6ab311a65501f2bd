"""Delivery fairness on a stream (broker/queues/stream_queue.py): the members of a consumer group that have credit take
turns (round-robin, as a classic queue's consumers do) even when only a few messages are readable at a time; and
credit flow between publishers and delivery, which share one event loop: a publisher is stopped while consumers
with credit lag far behind the log's end, let go when they catch up, and never held by consumers without credit
(or by none). Over MemoryStreamLog, as tests/unit/broker/test_stream_queue.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.message import Message
from broker.observability.counters import GlobalCounters
from broker.queues.credit_flow import DELIVER_BACKLOG_HIGH, DELIVER_BACKLOG_LOW
from broker.queues.queue_consumers import Consumer
from broker.queues.stream_queue import REPLAY_PUBLISH_SHARE, StreamQueue
from broker.vhost import VHost
from protocol.fastcodec import build_content_header, shortstr


def message(body: bytes) -> Message:
    header = build_content_header(len(body), spec.Basic.Properties(delivery_mode=2).marshal())
    return Message("", "s", shortstr("") + shortstr("s"), header, body)


@pytest.fixture
def q() -> StreamQueue:
    vh = VHost("/", counters=GlobalCounters(), clock=ManualClock(1_700_000_000_000.0))
    queue, _ = vh.queues.declare("s", False, True, False, False, {"x-queue-type": "stream"}, None)  # type: ignore[arg-type]
    assert isinstance(queue, StreamQueue)
    return queue


class Channel:
    """The channel a queue sees: it counts unacked deliveries per consumer, as the real one does."""

    global_prefetch = 0

    def __init__(self) -> None:
        self.delivered: list[tuple[Consumer, int]] = []

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, queue: Any, seq_id: int, msg: Message, redelivered: bool) -> None:
        consumer.unacked += 1
        self.delivered.append((consumer, seq_id))

    def deliver_parts(self, consumer: Consumer, queue: Any, seq_id: int, names_raw: bytes, header: bytes,
                      body: bytes, redelivered: bool) -> None:
        self.deliver(consumer, queue, seq_id, Message.from_wire(names_raw, header, body), redelivered)

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        pass


class PublisherReader:
    """A publisher's connection as credit flow sees it: paused and resumed for a reason."""

    def __init__(self) -> None:
        self.paused: set[object] = set()
        self.pauses = 0

    def pause_for(self, reason: object) -> None:
        self.paused.add(reason)
        self.pauses += 1

    def resume_for(self, reason: object) -> None:
        self.paused.discard(reason)


def consume(q: StreamQueue, channel: Channel, tag: str, prefetch: int, **arguments: Any) -> Consumer:
    consumer = Consumer(tag, channel, q, False, prefetch, 0, False, arguments)  # type: ignore[arg-type]
    q.add_consumer(consumer)
    return consumer


async def settle(turns: int = 5) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def append(q: StreamQueue, count: int) -> None:
    for i in range(count):
        q.deliver_or_enqueue(message(b"m%d" % i), True)


# -- group fairness ------------------------------------------------------------------------------------------

async def test_group_members_with_credit_take_turns_one_message_at_a_time(q):
    ch = Channel()
    members = [consume(q, ch, f"c{i}", 10, **{"x-stream-group": "g"}) for i in range(4)]
    for _ in range(8):
        append(q, 1)
        await settle()
    got = Counter(c for c, _s in ch.delivered)
    assert [got[m] for m in members] == [2, 2, 2, 2]
    assert [c for c, _s in ch.delivered] == members + members  # in turn, not just evenly


async def test_a_few_readable_messages_are_split_among_the_members(q):
    ch = Channel()
    members = [consume(q, ch, f"c{i}", 10, **{"x-stream-group": "g"}) for i in range(4)]
    append(q, 3)
    await settle()
    assert len({c for c, _s in ch.delivered}) == 3
    append(q, 1)
    await settle()
    assert sorted(m.tag for m, _s in ch.delivered) == sorted(m.tag for m in members)


async def test_members_without_credit_are_skipped_and_the_rest_share(q):
    ch = Channel()
    full = consume(q, ch, "full", 1, **{"x-stream-group": "g"})
    others = [consume(q, ch, f"c{i}", 100, **{"x-stream-group": "g"}) for i in range(2)]
    append(q, 21)
    await settle()
    got = Counter(c for c, _s in ch.delivered)
    assert got[full] == 1 and got[others[0]] == got[others[1]] == 10


async def test_a_busy_group_still_fills_each_members_credit(q):
    ch = Channel()
    members = [consume(q, ch, f"c{i}", 50, **{"x-stream-group": "g"}) for i in range(4)]
    append(q, 1000)
    await settle()
    got = Counter(c for c, _s in ch.delivered)
    assert [got[m] for m in members] == [50, 50, 50, 50]


# -- credit flow: publishers and delivery --------------------------------------------------------------------

async def test_publisher_waits_while_consumers_with_credit_lag_and_goes_when_they_catch_up(q):
    ch = Channel()
    consumer = consume(q, ch, "c", 100_000, **{"x-stream-offset": "first"})
    reader = PublisherReader()
    total = DELIVER_BACKLOG_HIGH + 400
    append(q, total)
    assert not q.overloaded  # nothing is readable yet (the log reports durability on the next iteration)
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # one deliver turn: its budget spent, the consumer far behind
    at_pause = len(ch.delivered)
    assert total - at_pause > DELIVER_BACKLOG_HIGH
    assert q.overloaded
    q.throttle(reader)
    assert reader.paused == {q}
    turns = 0
    while reader.paused:
        assert q.log.next_offset - len(ch.delivered) > DELIVER_BACKLOG_LOW  # held only while it lags
        await asyncio.sleep(0)
        turns += 1
        assert turns < 100
    assert q.log.next_offset - len(ch.delivered) <= DELIVER_BACKLOG_LOW  # let go because it caught up
    assert len(ch.delivered) - at_pause < DELIVER_BACKLOG_HIGH
    await settle(20)
    assert len(ch.delivered) == total and consumer.unacked == total
    assert not q.overloaded


async def test_a_replaying_consumer_slows_a_publisher_without_stopping_it(q):
    """A consumer reading a long stream from the start lags far behind for long: the publisher is let go
    after every DELIVER_BACKLOG_HIGH deliveries, not held until the consumer reaches the end."""
    ch = Channel()
    append(q, 10 * DELIVER_BACKLOG_HIGH)
    await settle()
    consume(q, ch, "c", 1_000_000, **{"x-stream-offset": "first"})
    await asyncio.sleep(0)
    assert q.overloaded
    reader = PublisherReader()
    q.throttle(reader)
    while reader.paused:
        await asyncio.sleep(0)
    delivered = len(ch.delivered)
    assert DELIVER_BACKLOG_HIGH <= delivered < 2 * DELIVER_BACKLOG_HIGH
    assert q.log.next_offset - delivered > DELIVER_BACKLOG_LOW  # still behind, yet the publisher goes on
    # ... for its share of the loop: REPLAY_PUBLISH_SHARE publishes before the lag can pause it again (not one
    # socket read per DELIVER_BACKLOG_HIGH deliveries).
    for _ in range(REPLAY_PUBLISH_SHARE - 1):
        append(q, 1)
        assert not q.overloaded
    append(q, 1)
    assert q.overloaded
    q.throttle(reader)
    while reader.paused:
        await asyncio.sleep(0)
    assert len(ch.delivered) - delivered >= DELIVER_BACKLOG_HIGH  # delivery had its turn again


async def test_consumers_without_credit_never_hold_a_publisher(q):
    ch = Channel()
    consume(q, ch, "c", 10, **{"x-stream-offset": "first"})
    append(q, 3 * DELIVER_BACKLOG_HIGH)
    await settle()
    assert len(ch.delivered) == 10
    assert not q.overloaded  # far behind, but without credit: delivery is not what lags


async def test_no_consumers_never_hold_a_publisher(q):
    append(q, 3 * DELIVER_BACKLOG_HIGH)
    await settle()
    assert not q.overloaded


async def test_a_consumer_going_away_lets_the_publisher_go(q):
    ch = Channel()
    consumer = consume(q, ch, "c", 1_000_000, **{"x-stream-offset": "first"})
    append(q, 5 * DELIVER_BACKLOG_HIGH)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert q.overloaded
    reader = PublisherReader()
    q.throttle(reader)
    q.remove_consumer(consumer)
    assert not reader.paused and not q.overloaded
