"""broker/deduplication.py's cache, and the two places it is used, driven in one process with a ManualClock:
the queue-level check in broker/queues/delegate.py (every queue type) and the ``x-message-deduplication`` exchange type.
The broker-process tests (restarts, kill -9, real clients) are tests/integration/policies/test_deduplication.py."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.deduplication import (
    DedupCache,
    DedupSettings,
    digest_key,
    encode_key,
    exchange_settings,
    queue_settings,
)
from broker.errors import AMQPError
from broker.message import Message
from broker.observability.counters import GlobalCounters
from broker.persistence import BackingQueueFactory
from broker.publish import PENDING, REFUSED, ROUTED
from broker.vhost import VHost
from protocol.constants import PRECONDITION_FAILED
from protocol.fastcodec import build_content_header, shortstr
from storage.node_storage import NodeStorage

DEDUP = {"x-message-deduplication": True}


class Channel:
    """What the publish path needs of a confirm-mode channel."""

    def __init__(self) -> None:
        self.reader = None
        self.published_to: set = set()
        self.confirmed: list[tuple[int, bool]] = []

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        self.confirmed.append((seq, stored))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def vh(clock):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield VHost("/", GlobalCounters(), clock=clock)
    asyncio.set_event_loop(None)
    loop.close()


def message(exchange: str = "", key: str = "q", **headers: Any) -> Message:
    header = build_content_header(1, spec.Basic.Properties(headers=headers or None).marshal())
    return Message(exchange, key, shortstr(exchange) + shortstr(key), header, b"m")


def dup(value: Any, **more: Any) -> Message:
    return message(**{"x-deduplication-header": value, **more})


# -- the cache ------------------------------------------------------------------------------------------------

def test_keys_tell_types_apart_but_not_strings_from_byte_arrays():
    assert encode_key("1") == encode_key(b"1") == encode_key(bytearray(b"1"))
    assert len({encode_key("1"), encode_key(1), encode_key(1.0), encode_key(True)}) == 4
    assert encode_key({"a": 1}) is None and encode_key([1]) is None
    long_key = encode_key("x" * 1000)
    assert long_key is not None and len(long_key) == 33  # digested
    assert encode_key("x" * 1000) == long_key != encode_key("x" * 1001)


def test_the_oldest_entry_goes_first_when_the_cache_is_full(clock):
    cache = DedupCache(DedupSettings(2), clock)
    for value in ("a", "b", "c"):
        key = cache.key_of(dup(value))
        assert key is not None and not cache.seen(key)
        cache.admit(key, dup(value))
    assert len(cache) == 2
    assert [cache.seen(digest_key(encode_key(v))) for v in ("a", "b", "c")] == [False, True, True]  # type: ignore[arg-type]


def test_entries_expire_by_the_cache_ttl_or_the_message_header(clock):
    cache = DedupCache(DedupSettings(10, ttl_ms=1000), clock)
    a, b = dup("a"), dup("b", **{"x-cache-ttl": 5000})
    for msg in (a, b):
        cache.admit(cache.key_of(msg), msg)  # type: ignore[arg-type]
    clock.advance(0.999)
    assert cache.seen(cache.key_of(a))  # type: ignore[arg-type]
    clock.advance(0.002)
    assert not cache.seen(cache.key_of(a))  # type: ignore[arg-type]
    assert len(cache) == 1  # the expired entry was dropped when looked at
    clock.advance(3.9)
    assert cache.seen(cache.key_of(b))  # type: ignore[arg-type]
    clock.advance(0.2)
    assert not cache.seen(cache.key_of(b))  # type: ignore[arg-type]


def test_a_message_without_the_header_has_no_key_and_another_header_can_be_named(clock):
    cache = DedupCache(DedupSettings(10, header="id"), clock)
    assert cache.key_of(message()) is None
    assert cache.key_of(dup("a")) is None
    assert cache.key_of(message(id="a")) == digest_key(encode_key("a"))  # type: ignore[arg-type]


def test_the_log_rotates_a_few_entries_at_a_time_and_a_crash_at_any_point_keeps_every_live_entry(tmp_path, clock):
    """A durable cache of 10 admits 200 keys: its log rotates several times, each snapshot copied
    SNAPSHOT_STEP entries per admission; after every admission the files, read as after a kill -9 (what the
    kernel has), hold every live entry, and the finished rotations left only the newest file."""
    from broker.deduplication import SNAPSHOT_STEP, open_cache
    from storage.deduplication_log import DIRECTORY

    settings = DedupSettings(10)
    storage = NodeStorage(str(tmp_path))
    cache = open_cache(settings, clock, storage, "queue", "/", "q", durable=True, recovered=False)
    cache._rotate_at = 25  # small, so that 200 admissions rotate often (the product's: 2 × size + 1024)
    assert SNAPSHOT_STEP >= 2  # the copy gains on the newest end: a snapshot of 10 completes within 10 admissions
    for i in range(200):
        key = cache.key_of(dup(f"v{i}"))
        assert key is not None and not cache.seen(key)
        cache.admit(key, dup(f"v{i}"))
        if i % 7 == 0:
            storage.syncer.flush()  # fsynced (inline: no loop), so a finished rotation drops its older files
        else:
            cache._log._file.write_out()  # only written: what the kernel has is what a kill -9 leaves
        crashed = DedupCache(settings, clock)
        NodeStorage(str(tmp_path)).open_dedup_log("queue", "/", "q", fresh=False, replay=crashed.replayed)
        assert list(crashed._ring.entries()) == list(cache._ring.entries()), i  # exactly, in order
    storage.syncer.sync()
    assert len(os.listdir(tmp_path / DIRECTORY)) <= 2  # the rotations finished dropped their older files
    cache.close()
    storage.close()
    again = open_cache(settings, clock, NodeStorage(str(tmp_path)), "queue", "/", "q", durable=True, recovered=True)
    assert len(again) == 10 and all(again.seen(cache.key_of(dup(f"v{j}"))) for j in range(190, 200))  # type: ignore[arg-type]


# -- arguments ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arguments", [{}, {"x-cache-size": 0}, {"x-cache-size": -1}, {"x-cache-size": "ten"},
                                       {"x-cache-size": True}, {"x-cache-size": 1.5}])
def test_the_exchange_needs_a_positive_cache_size_as_the_plugin_does(arguments):
    with pytest.raises(AMQPError) as err:
        exchange_settings(arguments)
    assert err.value.reply_code == PRECONDITION_FAILED
    assert err.value.text == "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"


def test_the_exchange_takes_numeric_strings_and_checks_ttl_and_persistence():
    s = exchange_settings({"x-cache-size": "10", "x-cache-ttl": 500, "x-cache-persistence": "memory"})
    assert (s.size, s.ttl_ms, s.persistence) == (10, 500, "memory")
    with pytest.raises(AMQPError, match="'x-cache-ttl' must be an integer greater than 0"):
        exchange_settings({"x-cache-size": 10, "x-cache-ttl": 0})
    with pytest.raises(AMQPError, match="'x-cache-persistence' must be either 'disk' or 'memory'"):
        exchange_settings({"x-cache-size": 10, "x-cache-persistence": "tape"})
    assert exchange_settings({"x-cache-size": 100_000_000}).size == 100_000_000
    with pytest.raises(AMQPError, match="'x-cache-size' must be at most 100000000"):
        exchange_settings({"x-cache-size": 100_000_001})


def test_queue_arguments_are_checked_only_when_deduplication_is_asked_for():
    assert queue_settings({"x-cache-size": "junk"}, "q", "/") is None
    s = queue_settings({"x-message-deduplication": True}, "q", "/")
    assert s is not None and (s.size, s.ttl_ms, s.header) == (128, None, "x-deduplication-header")
    assert queue_settings({"x-message-deduplication": False}, "q", "/") is None
    for arguments, problem in (({"x-message-deduplication": "yes"}, "{unacceptable_type,longstr}"),
                               ({"x-message-deduplication": True, "x-cache-size": 0}, "{value_zero,0}"),
                               ({"x-message-deduplication": True, "x-cache-ttl": -5}, "{value_negative,-5}"),
                               ({"x-message-deduplication": True, "x-cache-size": "9"},
                                '"expected integer, got longstr"'),
                               ({"x-message-deduplication": True, "x-cache-size": 1 << 40},
                                "{value_too_large,1099511627776}; at most 100000000")):
        with pytest.raises(AMQPError) as err:
            queue_settings(arguments, "q", "/")
        key = [k for k in arguments if k != "x-message-deduplication"] or ["x-message-deduplication"]
        assert err.value.text == f"invalid arg '{key[0]}' for queue 'q' in vhost '/': {problem}"


# -- queues -----------------------------------------------------------------------------------------------------

def declare(vh: VHost, name: str = "q", **arguments: Any):
    return vh.queues.declare(name, False, True, False, False,
                             {"x-message-deduplication": True, **arguments}, None)[0]


@pytest.mark.parametrize("queue_type", ["classic", "quorum", "stream"])
def test_every_queue_type_drops_a_duplicate_and_accepts_it(vh, queue_type):
    q = declare(vh, **{"x-queue-type": queue_type})
    channel = Channel()
    results = [vh.publish(vh.default_exchange, dup("a"), False, True, channel, seq) for seq in (1, 2)]
    assert results == [ROUTED, ROUTED]  # routed (no basic.return) and confirmed at once: nothing pending
    assert q.message_count() == 1 and q.dedup.dropped == 1
    vh.publish(vh.default_exchange, message(), False)  # no header: not checked
    vh.publish(vh.default_exchange, message(), False)
    assert q.message_count() == 3


def test_a_refused_message_is_not_remembered(vh):
    q = declare(vh, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    assert vh.publish(vh.default_exchange, dup("a"), False) == ROUTED
    assert vh.publish(vh.default_exchange, dup("b"), False) & REFUSED
    q.purge()
    assert vh.publish(vh.default_exchange, dup("b"), False) == ROUTED
    assert q.message_count() == 1


def test_deleting_the_queue_forgets_its_cache(vh):
    q = declare(vh)
    vh.publish(vh.default_exchange, dup("a"), False)
    vh.queues.delete(q)
    q = declare(vh)
    vh.publish(vh.default_exchange, dup("a"), False)
    assert q.message_count() == 1


def test_a_queue_without_deduplication_has_no_cache(vh):
    q = vh.queues.declare("plain", False, True, False, False, {}, None)[0]
    assert q.dedup is None
    vh.publish(vh.default_exchange, message(key="plain", **{"x-deduplication-header": "a"}), False)
    vh.publish(vh.default_exchange, message(key="plain", **{"x-deduplication-header": "a"}), False)
    assert q.message_count() == 2


# -- the exchange type ------------------------------------------------------------------------------------------

def declare_exchange(vh: VHost, **arguments: Any):
    ex, _ = vh.declare_exchange("dedup", "x-message-deduplication", False, False, False, False,
                                {"x-cache-size": 10, **arguments})
    return ex


def test_the_exchange_fans_out_and_drops_a_duplicate_as_unroutable(vh):
    ex = declare_exchange(vh)
    queues = [vh.queues.declare(n, False, True, False, False, {}, None)[0] for n in ("a", "b")]
    vh.bind("dedup", "a", "queue", "", {})
    vh.bind("dedup", "b", "queue", "whatever", {})
    channel = Channel()
    first = vh.publish(ex, message("dedup", "k", **{"x-deduplication-header": 1}), False, True, channel, 1)
    second = vh.publish(ex, message("dedup", "other", **{"x-deduplication-header": 1}), False, True, channel, 2)
    assert (first, second) == (ROUTED, 0)  # the duplicate: basic.return if mandatory, then its ack
    assert [q.message_count() for q in queues] == [1, 1]
    assert (vh.counters.messages_received, vh.counters.messages_routed,
            vh.counters.messages_unroutable_returned) == (2, 1, 1)
    assert ex.cache.dropped == 1


def test_an_unroutable_message_is_remembered_too(vh):
    ex = declare_exchange(vh)
    assert vh.publish(ex, message("dedup", "", **{"x-deduplication-header": "a"}), False) == 0
    vh.queues.declare("a", False, True, False, False, {}, None)
    vh.bind("dedup", "a", "queue", "", {})
    assert vh.publish(ex, message("dedup", "", **{"x-deduplication-header": "a"}), False) == 0
    assert vh.queues.get("a").message_count() == 0  # type: ignore[union-attr]


def test_the_exchange_ttl_and_the_message_header_ttl(vh, clock):
    ex = declare_exchange(vh, **{"x-cache-ttl": 1000})
    vh.queues.declare("a", False, True, False, False, {}, None)
    vh.bind("dedup", "a", "queue", "", {})

    def publish(value: str, **headers: Any) -> int:
        return vh.publish(ex, message("dedup", "", **{"x-deduplication-header": value, **headers}), False)

    assert (publish("a"), publish("b", **{"x-cache-ttl": 3000})) == (ROUTED, ROUTED)
    clock.advance(1.5)
    assert (publish("a"), publish("b")) == (ROUTED, 0)
    clock.advance(2)
    assert publish("b") == ROUTED


class Durable:
    """The node's durable store as exchanges and queues see it, over real storage without a loop (its syncer
    writes and fsyncs only when told to: the end of a burst, by hand)."""

    def __init__(self, path: str) -> None:
        self.storage = NodeStorage(path)

    def exchange_declared(self, vhost: str, ex: Any) -> None:
        pass

    def queue_declared(self, vhost: str, q: Any) -> None:
        pass


def test_a_duplicate_at_a_queue_waits_for_the_fsync_of_its_entry_before_its_ack(vh, tmp_path):
    durable = Durable(str(tmp_path))
    vh.durable = durable
    vh.queues.backing_queue_factory = BackingQueueFactory(durable.storage, "/")
    q = vh.queues.declare("q", False, True, False, False, DEDUP, None)[0]
    channel = Channel()
    first = vh.publish(vh.default_exchange, dup("a"), True, False, channel, 1)
    second = vh.publish(vh.default_exchange, dup("a"), True, False, channel, 2)
    assert first == second == ROUTED | 1 << PENDING  # both wait: the message and the entry for the same fsync
    assert channel.confirmed == [] and q.message_count() == 1
    durable.storage.syncer.flush()
    assert sorted(channel.confirmed) == [(1, True), (2, True)]
    # On disk now: nothing to wait for, so the channel acks it at once (no pending queue).
    assert vh.publish(vh.default_exchange, dup("a"), True, False, channel, 3) == ROUTED
    durable.storage.close()


def test_a_duplicate_waits_for_the_fsync_of_its_entry_before_its_ack(vh, tmp_path):
    durable = Durable(str(tmp_path))
    vh.durable = durable
    ex, _ = vh.declare_exchange("dedup", "x-message-deduplication", False, True, False, False, {"x-cache-size": 5})
    channel = Channel()
    assert vh.publish(ex, message("dedup", "", **{"x-deduplication-header": "a"}), True, False, channel, 1) == 0
    result = vh.publish(ex, message("dedup", "", **{"x-deduplication-header": "a"}), True, False, channel, 2)
    assert result == 1 << PENDING and channel.confirmed == []
    durable.storage.syncer.flush()
    assert channel.confirmed == [(2, True)]
    assert vh.publish(ex, message("dedup", "", **{"x-deduplication-header": "a"}), True, False, channel, 3) == 0
    vh.durable = None
    ex.close()
    durable.storage.close()
