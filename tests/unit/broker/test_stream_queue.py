"""Stream queues (broker/queues/stream_queue.py) on a VHost built directly, over storage/stream_memory.py's
MemoryStreamLog and a ManualClock: declare rules and arguments, offset specifications, the x-stream-offset
header, credit, RabbitMQ's refusals, retention by size and by age, publisher confirms, and consumer groups
(sharing, redelivery of a departed member's messages, restart). The tests are coroutines only because the
deliver loop is scheduled with ``call_soon``; ``settle()`` lets it run."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.errors import AMQPError
from broker.message import Message
from broker.observability.counters import GlobalCounters
from broker.policies.policy import Policy
from broker.queues.queue_args import effective_settings, parse_duration
from broker.queues.queue_consumers import Consumer
from broker.queues.queue_shell import ACCEPTED, CONFIRM_LATER
from broker.queues.stream_queue import OFFSET_SHIFT, RETENTION_INTERVAL, StreamQueue
from broker.vhost import VHost
from protocol.fastcodec import build_content_header, shortstr
from storage.stream_memory import MemoryStreamLog

START_MS = 1_700_000_000_000.0
STREAM = {"x-queue-type": "stream"}


def message(key: str, body: bytes, **props: Any) -> Message:
    header = build_content_header(len(body), spec.Basic.Properties(**props).marshal())
    return Message("", key, shortstr("") + shortstr(key), header, body)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_MS)


@pytest.fixture
def vh(clock: ManualClock) -> VHost:
    return VHost("/", counters=GlobalCounters(), clock=clock)


def declare(vh: VHost, name: str = "s", **arguments: Any) -> StreamQueue:
    q, _ = vh.queues.declare(name, False, True, False, False, {**STREAM, **arguments}, None)  # type: ignore[arg-type]
    assert isinstance(q, StreamQueue)
    return q


def publish(vh: VHost, key: str, *bodies: bytes, **props: Any) -> None:
    for body in bodies:
        vh.publish(vh.default_exchange, message(key, body, **props), True)


class FakeChannel:
    """The ConsumerChannel a queue sees, counting unacked deliveries as the real channel does; ``settle``
    acks (or requeues) as the channel would, handing the seq_ids back to the queue."""

    def __init__(self, global_prefetch: int = 0) -> None:
        self.global_prefetch = global_prefetch
        self.delivered: list[tuple[Consumer, int, Message, bool]] = []
        self.cancelled: list[Consumer] = []

    def can_deliver(self) -> bool:
        return True

    def can_deliver_no_ack(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, queue: Any, seq_id: int, msg: Message, redelivered: bool) -> None:
        consumer.unacked += 1
        self.delivered.append((consumer, seq_id, msg, redelivered))

    def deliver_parts(self, consumer: Consumer, queue: Any, seq_id: int, names_raw: bytes, header: bytes,
                      body: bytes, redelivered: bool) -> None:
        self.deliver(consumer, queue, seq_id, Message.from_wire(names_raw, header, body), redelivered)

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer)

    def offsets(self, consumer: Consumer | None = None) -> list[int]:
        return [m.headers["x-stream-offset"] for c, _s, m, _r in self.delivered if consumer in (None, c)]

    def bodies(self, consumer: Consumer | None = None) -> list[bytes]:
        return [m.body for c, _s, m, _r in self.delivered if consumer in (None, c)]

    def settle(self, q: StreamQueue, action: str = "ack", consumer: Consumer | None = None) -> list[int]:
        """Settle every delivery (of ``consumer``) not settled yet; returns their offsets."""
        taken = [d for d in self.delivered if consumer in (None, d[0])]
        self.delivered = [d for d in self.delivered if d not in taken]
        for c, _s, _m, _r in taken:
            c.unacked -= 1
        seq_ids = [s for _c, s, _m, _r in taken]
        getattr(q, action)(seq_ids)
        q.schedule_run()
        return [s >> OFFSET_SHIFT for s in seq_ids]


def consume(q: StreamQueue, channel: FakeChannel, prefetch: int = 100, no_ack: bool = False, tag: str = "c",
            **arguments: Any) -> Consumer:
    consumer = Consumer(tag, channel, q, no_ack, prefetch, 0, False, arguments)  # type: ignore[arg-type]
    q.add_consumer(consumer)
    return consumer


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# -- declare --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("durable", "exclusive", "auto_delete", "problem"), [
    (False, False, False, "non-durable"), (True, True, False, "exclusive-owner"), (True, False, True, "auto-delete")])
def test_declare_refuses_what_rabbitmq_refuses(vh, durable, exclusive, auto_delete, problem):
    class Owner:
        def __init__(self) -> None:
            self.name = "conn"
            self.exclusive_queues: list[Any] = []

    with pytest.raises(AMQPError) as e:
        vh.queues.declare("s", False, durable, exclusive, auto_delete, dict(STREAM), Owner())
    assert e.value.reply_code == 406
    assert e.value.text == f"invalid property '{problem}' for queue 's' in vhost '/'"


def test_server_named_stream_is_refused(vh):
    with pytest.raises(AMQPError) as e:
        vh.queues.declare("amq.gen-x", False, True, False, False, dict(STREAM), None, True)  # type: ignore[arg-type]
    assert e.value.reply_code == 406
    assert e.value.text == "Cannot declare a server-named queue for type rabbit_stream_queue"


@pytest.mark.parametrize("key", ["x-max-length", "x-message-ttl", "x-overflow", "x-dead-letter-exchange",
                                 "x-expires", "x-max-priority", "x-single-active-consumer"])
def test_other_types_arguments_are_refused(vh, key):
    value = {"x-overflow": "reject-publish", "x-dead-letter-exchange": "x", "x-single-active-consumer": True,
             "x-expires": 1000}.get(key, 5)
    with pytest.raises(AMQPError) as e:
        declare(vh, **{key: value})
    assert e.value.reply_code == 406
    assert e.value.text == f"invalid arg '{key}' for queue 's' in vhost '/' of queue type rabbit_stream_queue"


@pytest.mark.parametrize("value", ["5", "0s", "1.5h", "1d", "abc"])
def test_invalid_max_age(vh, value):
    with pytest.raises(AMQPError) as e:
        declare(vh, **{"x-max-age": value})
    assert e.value.text == "invalid arg 'x-max-age' for queue 's' in vhost '/': invalid_max_age"


def test_durations_in_rabbitmq_units():
    day = 86_400_000
    assert [parse_duration(v) for v in ("7D", "12h", "30m", "10s", "1Y", "1M")] == [
        7 * day, 12 * 3_600_000, 30 * 60_000, 10_000, 365 * day, 30 * day]
    assert parse_duration(b"2h") == 7_200_000
    assert parse_duration("0s") is None and parse_duration(10) is None


def test_stream_settings_policy_beats_argument():
    policy = Policy("p", ".*", {"max-length-bytes": 1000, "max-age": "1h", "stream-max-segment-size-bytes": 50},
                    0, "streams", "/")
    s = effective_settings({**STREAM, "x-max-length-bytes": 10, "x-max-age": "1D"}, policy)
    assert (s.max_length_bytes, s.max_age_ms, s.max_segment_size_bytes) == (1000, 3_600_000, 50)
    assert policy.applies_to_queue("s", "stream") and not policy.applies_to_queue("s", "classic")
    s = effective_settings({**STREAM, "x-max-age": "1D", "x-stream-max-segment-size-bytes": 7})
    assert (s.max_length_bytes, s.max_age_ms, s.max_segment_size_bytes) == (None, 86_400_000, 7)


# -- reading ------------------------------------------------------------------------------------------------

async def test_reading_never_removes_and_each_delivery_carries_its_offset(vh):
    q = declare(vh)
    publish(vh, "s", b"a", b"b", b"c", headers={"h": "v"})
    ch1, ch2 = FakeChannel(), FakeChannel()
    consume(q, ch1, **{"x-stream-offset": "first"})
    consume(q, ch2, **{"x-stream-offset": "first"})
    await settle()
    assert ch1.bodies() == ch2.bodies() == [b"a", b"b", b"c"]
    assert ch1.offsets() == [0, 1, 2]
    assert ch1.delivered[0][2].headers["h"] == "v"  # the other headers are kept
    assert q.message_count() == 3
    # The offset was spliced in once, at append: every reader gets the stored header as it is, with one
    # x-stream-offset entry (broker/queues/stream_record.py).
    stored = q.log.read(0, 1)[0].payload
    assert stored.count(b"x-stream-offset") == 1
    assert ch1.delivered[0][2].header == ch2.delivered[0][2].header
    assert ch1.delivered[0][2].header in stored


@pytest.mark.parametrize(("spec", "expected"), [
    ("first", [0, 1, 2, 3, 4]), ("last", [4]), ("next", []), (None, []), (2, [2, 3, 4]), (-5, [0, 1, 2, 3, 4]),
    (99, [])])
async def test_offset_specifications(vh, spec, expected):
    q = declare(vh)
    publish(vh, "s", *[b"m%d" % i for i in range(5)])
    ch = FakeChannel()
    consume(q, ch, **({} if spec is None else {"x-stream-offset": spec}))
    await settle()
    assert ch.offsets() == expected
    publish(vh, "s", b"later")
    await settle()
    assert ch.offsets() == [*expected, 5]  # everyone reads on as the stream grows


async def test_offset_by_timestamp_and_by_interval(vh, clock):
    q = declare(vh)
    publish(vh, "s", b"old")
    clock.advance(3600)
    publish(vh, "s", b"recent")
    clock.advance(60)
    publish(vh, "s", b"new")
    at = datetime.datetime.fromtimestamp((START_MS + 3600_000) / 1000, tz=datetime.UTC)
    ch1, ch2, ch3 = FakeChannel(), FakeChannel(), FakeChannel()
    consume(q, ch1, **{"x-stream-offset": at})
    consume(q, ch2, **{"x-stream-offset": "30m"})
    consume(q, ch3, **{"x-stream-offset": "2h"})
    await settle()
    assert ch1.bodies() == ch2.bodies() == [b"recent", b"new"]
    assert ch3.bodies() == [b"old", b"recent", b"new"]


async def test_invalid_offset_specification(vh):
    q = declare(vh)
    with pytest.raises(AMQPError) as e:
        consume(q, FakeChannel(), **{"x-stream-offset": "bogus"})
    assert e.value.reply_code == 406 and "x-stream-offset" in e.value.text


async def test_prefetch_is_credit_and_acks_give_it_back(vh):
    q = declare(vh)
    publish(vh, "s", *[b"m%d" % i for i in range(10)])
    ch = FakeChannel()
    consume(q, ch, prefetch=3, **{"x-stream-offset": "first"})
    await settle()
    assert ch.offsets() == [0, 1, 2]
    assert ch.settle(q) == [0, 1, 2]
    await settle()
    assert ch.offsets() == [3, 4, 5]
    assert q.message_count() == 10  # acks remove nothing


async def test_filtered_consumer_skips_segments_without_its_values(vh):
    q = declare(vh, **{"x-stream-max-segment-size-bytes": 1})  # one message per segment
    for value in ("eu", "us", "eu", "asia"):
        publish(vh, "s", value.encode(), headers={"x-stream-filter-value": value})
    ch = FakeChannel()
    consume(q, ch, **{"x-stream-offset": "first", "x-stream-filter": "eu"})
    await settle()
    assert ch.bodies() == [b"eu", b"eu"]


# -- RabbitMQ's refusals ------------------------------------------------------------------------------------

async def test_consumer_rules(vh):
    q = declare(vh)
    with pytest.raises(AMQPError) as e:
        consume(q, FakeChannel(), prefetch=0)
    assert (e.value.reply_code, e.value.text) == (
        406, "consumer prefetch count is not set for 'queue 's' in vhost '/''")
    with pytest.raises(AMQPError) as e:
        consume(q, FakeChannel(), no_ack=True)
    assert (e.value.reply_code, e.value.text) == (
        540, "automatic acknowledgement not supported by stream queues queue 's' in vhost '/'")
    with pytest.raises(AMQPError) as e:
        consume(q, FakeChannel(global_prefetch=10))
    assert e.value.reply_code == 406 and "global qos" in e.value.text
    assert q.consumers.count == 0


async def test_get_purge_and_nack_are_not_implemented(vh):
    q = declare(vh)
    publish(vh, "s", b"a")
    with pytest.raises(AMQPError) as e:
        q.basic_get(False)
    assert (e.value.reply_code, e.value.text) == (540, "basic.get not supported by stream queues queue 's' in vhost '/'")
    with pytest.raises(AMQPError) as e:
        q.purge()
    assert (e.value.reply_code, e.value.text) == (
        540, "queue.purge not supported by stream queues queue 's' in vhost '/'")
    ch = FakeChannel()
    c = consume(q, ch, **{"x-stream-offset": "first"})
    await settle()
    seq_id = ch.delivered[0][1]
    with pytest.raises(AMQPError) as e:
        q.requeue([seq_id])
    assert (e.value.reply_code, e.value.text) == (
        540, "basic.nack and basic.reject not supported by stream queues queue 's' in vhost '/'")
    # Once the consumer is gone (its channel closing), handing its deliveries back is fine and does nothing.
    q.remove_consumer(c)
    q.requeue([seq_id])
    q.reject_discard([seq_id])


# -- retention ------------------------------------------------------------------------------------------------

async def test_retention_by_size_removes_whole_old_segments(vh):
    q = declare(vh, **{"x-stream-max-segment-size-bytes": 200, "x-max-length-bytes": 500})
    for i in range(40):
        publish(vh, "s", b"x" * 20, headers={"i": i})
    log = q.log
    assert log.first_offset > 0, "old segments went after appends that started new ones"
    assert log.bytes <= 500 + 200  # over by at most the segment being written
    assert log.next_offset == 40 and log.segment_count >= 2
    ch = FakeChannel()
    consume(q, ch, **{"x-stream-offset": 0})
    await settle()
    assert ch.offsets()[0] == log.first_offset and ch.offsets()[-1] == 39


async def test_retention_by_age_on_the_clock(vh, clock):
    q = declare(vh, **{"x-stream-max-segment-size-bytes": 1, "x-max-age": "1h"})
    publish(vh, "s", b"a", b"b")
    clock.advance(1800)
    publish(vh, "s", b"c")
    clock.advance(1800 + RETENTION_INTERVAL)  # a and b are over an hour old; c is not
    assert q.log.first_offset == 2
    clock.advance(3600)
    assert q.log.first_offset == 2, "never the segment being written"
    assert q.message_count() == 1


async def test_policy_retention_applies_at_once(vh, clock):
    q = declare(vh, **{"x-stream-max-segment-size-bytes": 1})
    publish(vh, "s", b"a", b"b", b"c")
    vh.policies["p"] = Policy("p", "^s$", {"max-length-bytes": 1}, 0, "streams", "/")
    vh.apply_policies()
    assert q.settings.max_length_bytes == 1
    assert q.log.first_offset == 2


# -- publisher confirms ---------------------------------------------------------------------------------------

class Publisher:
    def __init__(self) -> None:
        self.answers: list[tuple[int, bool]] = []

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        self.answers.append((seq, stored))


async def test_confirms_wait_for_the_log_to_be_durable(vh):
    q = declare(vh)
    pub = Publisher()
    assert q.deliver_or_enqueue(message("s", b"a"), True, (pub, 1)) == CONFIRM_LATER
    assert q.deliver_or_enqueue(message("s", b"b"), False, (pub, 2)) == CONFIRM_LATER  # a stream keeps all
    assert pub.answers == []
    await settle()  # the memory log reports durability on the next loop iteration, as the syncer would
    assert pub.answers == [(1, True), (2, True)]
    assert q.deliver_or_enqueue(message("s", b"c"), True) == ACCEPTED


async def test_failed_write_nacks(vh):
    q = declare(vh)
    pub = Publisher()
    q.log.on_durable = None  # the store will report a failure instead
    q.deliver_or_enqueue(message("s", b"a"), True, (pub, 1))
    q.deliver_or_enqueue(message("s", b"b"), True, (pub, 2))
    q.on_durable_failed(1)
    assert pub.answers == [(1, False)]
    q.on_durable(2)
    assert pub.answers == [(1, False), (2, True)]


async def test_delete_deletes_the_log_and_cancels_consumers(vh):
    q = declare(vh)
    publish(vh, "s", b"a")
    ch = FakeChannel()
    consume(q, ch)
    log = q.log
    assert isinstance(log, MemoryStreamLog)
    assert vh.queues.delete(q) == 1
    assert log.closed and ch.cancelled and vh.queues.get("s") is None


# -- consumer groups ----------------------------------------------------------------------------------------

async def test_group_members_compete_and_acks_commit(vh):
    q = declare(vh)
    publish(vh, "s", *[b"m%d" % i for i in range(10)])
    ch1, ch2 = FakeChannel(), FakeChannel()
    c1 = consume(q, ch1, prefetch=3, tag="c1", **{"x-stream-group": "g", "x-stream-offset": "first"})
    c2 = consume(q, ch2, prefetch=3, tag="c2", **{"x-stream-group": "g"})  # an existing group keeps its place
    await settle()
    got1, got2 = ch1.offsets(c1), ch2.offsets(c2)
    assert len(got1) == len(got2) == 3 and not set(got1) & set(got2)
    group = q.log.groups()["g"]
    assert group.cursor == 6 and group.committed == 0
    ch1.settle(q)
    ch2.settle(q)
    assert group.committed == 6
    await settle()
    while ch1.delivered or ch2.delivered:
        ch1.settle(q)
        ch2.settle(q)
        await settle()
    assert group.committed == 10 and group.outstanding() == []


async def test_departed_members_deliveries_go_to_the_others_redelivered(vh):
    q = declare(vh)
    publish(vh, "s", *[b"m%d" % i for i in range(6)])
    ch1, ch2 = FakeChannel(), FakeChannel()
    c1 = consume(q, ch1, prefetch=4, tag="c1", **{"x-stream-group": "g", "x-stream-offset": "first"})
    await settle()
    assert ch1.offsets() == [0, 1, 2, 3]
    consume(q, ch2, prefetch=10, tag="c2", **{"x-stream-group": "g"})
    await settle()
    assert ch2.offsets() == [4, 5]
    # c1's channel closes: the consumer goes first, then its unacked deliveries are handed back (requeue).
    q.remove_consumer(c1)
    ch1.settle(q, "requeue")
    await settle()
    assert sorted(ch2.offsets()) == [0, 1, 2, 3, 4, 5]
    assert [r for _c, _s, m, r in ch2.delivered if m.headers["x-stream-offset"] < 4] == [True] * 4
    ch2.settle(q)
    group = q.log.groups()["g"]
    assert group.committed == 6 and group.outstanding() == []


async def test_nack_with_requeue_by_a_member_redelivers_and_reject_settles(vh):
    q = declare(vh)
    publish(vh, "s", b"a", b"b")
    ch = FakeChannel()
    c = consume(q, ch, prefetch=1, **{"x-stream-group": "g", "x-stream-offset": "first"})
    await settle()
    assert ch.settle(q, "requeue") == [0]
    await settle()
    assert ch.offsets(c) == [0] and ch.delivered[0][3] is True
    ch.settle(q, "reject_discard")
    await settle()
    assert ch.offsets(c) == [1]
    assert q.log.groups()["g"].committed == 1


async def test_after_a_restart_outstanding_offsets_come_first(vh):
    q = declare(vh)
    publish(vh, "s", *[b"m%d" % i for i in range(5)])
    ch = FakeChannel()
    c = consume(q, ch, prefetch=3, **{"x-stream-group": "g", "x-stream-offset": "first"})
    await settle()
    assert ch.offsets() == [0, 1, 2]
    ch.delivered = [d for d in ch.delivered if d[2].headers["x-stream-offset"] == 1]
    ch.settle(q)  # only 1 is acked before the "crash"
    q.remove_consumer(c)  # the old process stops here (nothing hands 0 and 2 back: it crashed)
    # A new queue process over the same log: what the restart path builds.
    again = StreamQueue(vh, "s", dict(STREAM), q.settings, q.log)
    ch2 = FakeChannel()
    consume(again, ch2, prefetch=10, **{"x-stream-group": "g", "x-stream-offset": "next"})
    await settle()
    assert ch2.offsets() == [0, 2, 3, 4]
    assert [r for _c, _s, _m, r in ch2.delivered] == [True, True, False, False]


async def test_new_group_starts_at_its_offset_specification(vh):
    q = declare(vh)
    publish(vh, "s", b"a", b"b")
    ch = FakeChannel()
    consume(q, ch, **{"x-stream-group": "late"})  # default next
    await settle()
    assert ch.offsets() == []
    publish(vh, "s", b"c")
    await settle()
    assert ch.offsets() == [2]
