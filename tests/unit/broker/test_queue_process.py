"""The queue process (broker/queues/queue_process.py, RabbitMQ's ``rabbit_amqqueue_process``) on a VHost built
directly, with a ManualClock: message TTL (per queue and per message, at the head only), queue expiry
(``x-expires``), dead-lettering of expired messages, max-length overflow (drop-head, reject-publish) and
requeue order. Time moves only by ``clock.advance``: no test sleeps. The tests are coroutines only because
the deliver loop is scheduled with ``call_soon``; ``settle()`` lets it run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.message import Message
from broker.observability.counters import GlobalCounters
from broker.persistence import decode_message, encode_message
from broker.policies.policy import Policy
from broker.publish import REFUSED, ROUTED
from broker.queues.queue_consumers import Consumer
from broker.queues.queue_process import QueueProcess
from broker.vhost import VHost
from protocol.fastcodec import build_content_header, shortstr
from storage.node_storage import NodeStorage


def message(key: str, body: bytes = b"m", expiration: int | None = None, **props: Any) -> Message:
    if expiration is not None:
        props["expiration"] = str(expiration)
    header = build_content_header(len(body), spec.Basic.Properties(**props).marshal())
    msg = Message("", key, shortstr("") + shortstr(key), header, body)
    msg.expiration_ms = expiration  # what the channel's check_properties parses
    return msg


START_MS = 1_700_000_000_000.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_MS)


@pytest.fixture
def vh(clock: ManualClock) -> VHost:
    return VHost("/", counters=GlobalCounters(), clock=clock)


def declare(vh: VHost, name: str, **arguments: Any) -> QueueProcess:
    return vh.queues.declare(name, False, False, False, False, arguments, None)[0]  # type: ignore[arg-type]


def publish(vh: VHost, key: str, *bodies: bytes, expiration: int | None = None) -> list[int]:
    return [vh.publish(vh.default_exchange, message(key, b, expiration), False) for b in bodies]


def get_all(q: QueueProcess) -> list[bytes]:
    out = []
    while (got := q.basic_get(True)) is not None:
        out.append(got[1].body)
    return out


class FakeChannel:
    """Records deliveries (the ConsumerChannel a queue sees); ``room`` caps unacked deliveries."""

    def __init__(self, room: int = 1000) -> None:
        self.room = room
        self.delivered: list[tuple[int, bytes, bool]] = []
        self.cancelled: list[Consumer] = []

    def can_deliver(self) -> bool:
        return True

    def can_deliver_no_ack(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, queue: Any, seq_id: int, msg: Message, redelivered: bool) -> None:
        if not consumer.no_ack:
            consumer.unacked += 1
        self.delivered.append((seq_id, msg.body, redelivered))

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer)


def consume(q: QueueProcess, channel: FakeChannel, prefetch: int = 0, no_ack: bool = False) -> Consumer:
    consumer = Consumer("ctag", channel, q, no_ack, prefetch, 0, False, {})  # type: ignore[arg-type]
    q.add_consumer(consumer)
    return consumer


async def settle() -> None:
    """Let the deliver loop (scheduled with call_soon) run."""
    for _ in range(3):
        await asyncio.sleep(0)


# -- message TTL ----------------------------------------------------------------------------------------------

async def test_queue_ttl_expires_messages_when_their_time_comes(vh, clock):
    q = declare(vh, "q", **{"x-message-ttl": 1000})
    publish(vh, "q", b"a", b"b")
    clock.advance(0.5)
    publish(vh, "q", b"c")
    clock.advance(0.4)
    assert q.message_count() == 3
    clock.advance(0.2)  # a and b are 1.1 s old, c 0.6 s: the head's timer fired
    assert q.message_count() == 1 and q.stats.expired == 2
    clock.advance(0.5)
    assert q.message_count() == 0 and q.stats.expired == 3
    assert clock.pending == 0  # no timer left once the queue is empty


async def test_per_message_expiration_and_the_lower_of_the_two_wins(vh, clock):
    q = declare(vh, "q", **{"x-message-ttl": 1000})
    publish(vh, "q", b"short", expiration=200)
    publish(vh, "q", b"long", expiration=5000)  # the queue's 1000 ms is lower
    publish(vh, "q", b"plain")
    clock.advance(0.25)
    assert q.message_count() == 2
    clock.advance(0.8)
    assert q.message_count() == 0 and q.stats.expired == 3


async def test_ttl_applies_at_the_head_only(vh, clock):
    q = declare(vh, "q")
    publish(vh, "q", b"live", expiration=5000)
    publish(vh, "q", b"dead-behind", expiration=100)
    clock.advance(1)
    assert q.message_count() == 2  # expired, but behind a live head: it waits (and is never delivered)
    clock.advance(4.1)
    assert q.message_count() == 0


async def test_expired_message_is_not_handed_to_a_consumer_that_gets_room_later(vh, clock):
    q = declare(vh, "q", **{"x-message-ttl": 100})
    publish(vh, "q", b"a")
    clock.advance(0.2)
    channel = FakeChannel()
    consume(q, channel)
    await settle()
    assert channel.delivered == [] and q.message_count() == 0


async def test_requeue_does_not_restart_the_ttl_clock(vh, clock):
    q = declare(vh, "q", **{"x-message-ttl": 1000})
    publish(vh, "q", b"a")
    clock.advance(0.5)
    got = q.basic_get(False)
    assert got is not None
    clock.advance(0.4)
    q.requeue([got[0]])
    assert q.message_count() == 1
    clock.advance(0.2)  # 1.1 s after publish, 0.2 s after the requeue
    assert q.message_count() == 0 and q.stats.expired == 1


async def test_policy_ttl_applies_to_the_messages_already_in_the_queue(vh, clock):
    q = declare(vh, "q")
    publish(vh, "q", b"a", b"b")
    clock.advance(10)
    vh.set_policy(Policy("ttl", "^q$", {"message-ttl": 500}))
    assert q.message_count() == 0  # 10 s old under a 0.5 s TTL: gone at once
    publish(vh, "q", b"c")
    clock.advance(0.6)
    assert q.message_count() == 0 and q.stats.expired == 3
    vh.clear_policy("ttl")
    publish(vh, "q", b"d")
    clock.advance(10)
    assert q.message_count() == 1  # the TTL went with the policy


# -- dead-lettering on expiry --------------------------------------------------------------------------------

async def test_expired_messages_are_dead_lettered_with_reason_expired(vh, clock):
    vh.declare_exchange("dlx", "fanout", False, False, False, False, {})
    dead = declare(vh, "dead")
    vh.bind("dlx", "dead", "queue", "", {})
    q = declare(vh, "q", **{"x-message-ttl": 300, "x-dead-letter-exchange": "dlx"})
    publish(vh, "q", b"a", b"b")
    clock.advance(0.4)
    assert q.message_count() == 0 and q.stats.dead_lettered == 2
    assert vh.counters.messages_dead_lettered_expired == 2
    got = dead.basic_get(True)
    assert got is not None
    msg = got[1]
    death = msg.headers["x-death"][0]
    assert (msg.body, death["reason"], death["queue"], death["count"]) == (b"a", "expired", "q", 1)
    # Republished when the head's timer fired (300 ms, plus the timer's 1 ms margin), on the vhost's clock.
    assert msg.published_at == START_MS + 301
    assert q.figures().unacked == 0  # the expired messages were fetched to dead-letter them, then acked


# -- queue expiry (x-expires) ---------------------------------------------------------------------------------

async def test_unused_queue_expires_and_basic_get_renews_its_lease(vh, clock):
    q = declare(vh, "q", **{"x-expires": 1000})
    publish(vh, "q", b"a")
    clock.advance(0.9)
    assert q.basic_get(True) is not None  # renews the lease
    clock.advance(0.9)
    publish(vh, "q", b"b")  # a publish does not renew it
    assert vh.queues.get("q") is q
    clock.advance(0.2)
    assert vh.queues.get("q") is None and q.deleted


async def test_a_consumer_keeps_an_expiring_queue_alive_until_it_goes(vh, clock):
    q = declare(vh, "q", **{"x-expires": 1000})
    consumer = consume(q, FakeChannel())
    clock.advance(5)
    assert vh.queues.get("q") is q
    q.remove_consumer(consumer)
    clock.advance(0.9)
    assert vh.queues.get("q") is q
    clock.advance(0.2)
    assert vh.queues.get("q") is None


async def test_expired_queue_is_deleted_with_its_messages_not_dead_lettered(vh, clock):
    vh.declare_exchange("dlx", "fanout", False, False, False, False, {})
    dead = declare(vh, "dead")
    vh.bind("dlx", "dead", "queue", "", {})
    declare(vh, "q", **{"x-expires": 500, "x-dead-letter-exchange": "dlx"})
    publish(vh, "q", b"a")
    clock.advance(0.6)
    assert vh.queues.get("q") is None and dead.message_count() == 0


# -- max length -----------------------------------------------------------------------------------------------

async def test_max_length_drop_head_drops_the_oldest(vh, clock):
    vh.declare_exchange("dlx", "fanout", False, False, False, False, {})
    dead = declare(vh, "dead")
    vh.bind("dlx", "dead", "queue", "", {})
    q = declare(vh, "q", **{"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    assert publish(vh, "q", b"1", b"2", b"3", b"4") == [ROUTED] * 4
    assert q.stats.dropped == 2 and vh.counters.messages_dead_lettered_maxlen == 2
    assert get_all(q) == [b"3", b"4"]
    assert get_all(dead) == [b"1", b"2"]


async def test_max_length_reject_publish_refuses_the_newest(vh, clock):
    q = declare(vh, "q", **{"x-max-length": 2, "x-overflow": "reject-publish"})
    results = publish(vh, "q", b"1", b"2", b"3")
    assert [bool(r & REFUSED) for r in results] == [False, False, True]
    assert q.stats.rejected_publishes == 1
    assert get_all(q) == [b"1", b"2"]


async def test_max_length_bytes_drop_head(vh, clock):
    q = declare(vh, "q", **{"x-max-length-bytes": 10})
    publish(vh, "q", b"aaaa", b"bbbb", b"cccc")
    assert get_all(q) == [b"bbbb", b"cccc"]


# -- requeue order --------------------------------------------------------------------------------------------

async def test_requeued_messages_go_back_to_their_places_marked_redelivered(vh, clock):
    q = declare(vh, "q")
    publish(vh, "q", *[b"%d" % i for i in range(6)])
    fetched = [q.basic_get(False) for _ in range(4)]
    seq = [f[0] for f in fetched if f is not None]
    q.requeue([seq[3], seq[1]])
    q.requeue([seq[0]])
    got = []
    while (g := q.basic_get(True)) is not None:
        got.append((g[1].body, g[2]))
    assert got == [(b"0", True), (b"1", True), (b"3", True), (b"4", False), (b"5", False)]
    assert q.figures().unacked == 1  # "2" is still with its consumer


async def test_consumer_receives_requeued_messages_first_in_order(vh, clock):
    q = declare(vh, "q")
    publish(vh, "q", b"a", b"b", b"c")
    channel = FakeChannel()
    consumer = consume(q, channel, prefetch=2)
    await settle()
    assert [(b, r) for _, b, r in channel.delivered] == [(b"a", False), (b"b", False)]
    seq_ids = [s for s, _, _ in channel.delivered]
    consumer.unacked = 0
    channel.delivered.clear()
    q.requeue(list(reversed(seq_ids)))
    await settle()
    assert [(b, r) for _, b, r in channel.delivered] == [(b"a", True), (b"b", True)]


# -- a TTL queue paged out to disk ----------------------------------------------------------------------------

async def test_a_paged_out_ttl_queue_reads_each_message_from_disk_once(vh, clock, tmp_path: Path):
    """Before, every delivery of a TTL queue read the paged-out head from disk to learn its deadline (and the
    fetch read it again); the deadline is now kept with the message's position, so each message is read once,
    to deliver it."""
    storage = NodeStorage(str(tmp_path / "node"))
    storage.finish_recovery()
    opened = []

    def open_store(name: str, durable: bool, priority: int | None = None, on_confirm: Any = None) -> Any:
        vq = storage.open_queue("/", name, durable, encode=encode_message, decode=decode_message)
        opened.append(vq)
        return vq

    vh.queues.backing_queue_factory = open_store
    q = declare(vh, "q", **{"x-message-ttl": 60_000})
    publish(vh, "q", *[b"m%d" % i for i in range(40)])
    q.set_ram_budget(0)
    while q.needs_paging():
        q.page()
    (vq,) = opened
    assert q.figures().paged_out == 40
    reads = 0
    load = vq._load

    def counting_load(st: Any) -> Any:
        nonlocal reads
        reads += 1
        return load(st)

    vq._load = counting_load  # type: ignore[method-assign]
    got = [q.basic_get(True) for _ in range(20)]  # basic.get: half of them
    assert [g[1].body for g in got if g is not None] == [b"m%d" % i for i in range(20)]
    channel = FakeChannel()
    consume(q, channel, no_ack=True)  # the deliver loop: the rest
    await settle()
    assert [b for _, b, _ in channel.delivered] == [b"m%d" % i for i in range(20, 40)]
    assert q.message_count() == 0
    assert reads == 40  # one read per message delivered (it was two and more per delivery)
    storage.close()
