"""Message deduplication (issue 13; broker/deduplication.py has the semantics and their sources): the queue
argument ``x-message-deduplication`` on classic, quorum and stream queues, the ``x-message-deduplication``
exchange type, cache size and TTL, what a publisher sees (a duplicate is acked; mandatory as the plugin
answers), the caches of durable queues, streams and exchanges across a clean restart and a ``kill -9``, and the
406s for arguments the caches cannot use. RabbitMQ answers these only with the rabbitmq-message-deduplication
plugin, and differently in places (its queues forget a value when its message leaves, and nack duplicates),
so the whole module is Leveret's."""

from __future__ import annotations

import base64
import contextlib
import json
import time
import urllib.parse
import urllib.request

import pika
import pytest
from amqp_helpers import get_all, ready_count
from pika.exceptions import ChannelClosedByBroker, UnroutableError

pytest_plugins = ["amqp_helpers"]
pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(90)]

DEDUP = {"x-message-deduplication": True}
HEADER = "x-deduplication-header"


def props(value=None, persistent: bool = True, **headers) -> pika.BasicProperties:
    if value is not None:
        headers[HEADER] = value
    return pika.BasicProperties(headers=headers or None, delivery_mode=2 if persistent else 1)


@contextlib.contextmanager
def confirm_channel(b):
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        yield ch
    finally:
        if conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                conn.close()


def publish_ids(ch, exchange: str, key: str, ids, mandatory: bool = False) -> None:
    """Publish one persistent message per id; each basic_publish returns once acked (NackError if nacked)."""
    for i in ids:
        ch.basic_publish(exchange, key, f"m{i}".encode(), props(f"id-{i}"), mandatory=mandatory)


def count(b, queue: str) -> int:
    """Messages in the queue (for a stream: retained), by a passive declare."""
    conn = pika.BlockingConnection(b.pika_params())
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def declare(b, queue: str, durable: bool = True, **arguments) -> None:
    conn = pika.BlockingConnection(b.pika_params())
    try:
        conn.channel().queue_declare(queue, durable=durable, arguments={**DEDUP, **arguments})
    finally:
        conn.close()


@pytest.fixture
def dedup_queue(broker, uid, cleanup):
    def make(suffix: str = "q", durable: bool = False, **arguments) -> str:
        name = f"{uid}-{suffix}"
        declare(broker, name, durable, **arguments)
        cleanup[0].append(name)
        return name

    return make


def own_broker(start_broker, **kw):
    return start_broker("--management-port", "0", "--prometheus-port", "0", **kw)


# -- queues -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("queue_type", ["classic", pytest.param("quorum", marks=pytest.mark.quorum), "stream"])
def test_a_queue_drops_duplicates_and_acks_them(broker, dedup_queue, queue_type):
    q = dedup_queue(queue_type, durable=True, **{"x-queue-type": queue_type})
    with confirm_channel(broker) as ch:
        publish_ids(ch, "", q, [1, 2, 1, 1, 2, 3])  # every publish acked, duplicates too (no NackError)
        # Mandatory: a duplicate dropped by the queue was routed there, so it is not returned.
        publish_ids(ch, "", q, [3], mandatory=True)
    assert count(broker, q) == 3


def test_messages_without_the_header_are_not_checked(conn, dedup_queue):
    q = dedup_queue()
    ch = conn.channel()
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish("", q, b"plain")
        ch.basic_publish("", q, b"other", props(persistent=False, other="x"))
    assert ready_count(conn, q) == 6


def test_duplicates_are_dropped_after_the_first_message_was_consumed(conn, dedup_queue):
    """Leveret's queue cache is LavinMQ's: a value stays seen when its message leaves (the plugin's queue
    would enqueue it again)."""
    q = dedup_queue()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"first", props("a"))
    assert [body for _m, _p, body in get_all(ch, q)] == [b"first"]
    ch.basic_publish("", q, b"again", props("a"))
    assert ready_count(conn, q) == 0


def test_a_full_cache_forgets_its_oldest_value(conn, dedup_queue):
    q = dedup_queue(**{"x-cache-size": 2})
    ch = conn.channel()
    ch.confirm_delivery()
    for value in ("a", "b", "c"):
        ch.basic_publish("", q, value.encode(), props(value))
    ch.basic_publish("", q, b"c again", props("c"))  # still cached: dropped
    ch.basic_publish("", q, b"a again", props("a"))  # evicted by c: enqueued
    assert [body for _m, _p, body in get_all(ch, q)] == [b"a", b"b", b"c", b"a again"]


def test_cache_ttl_and_the_per_message_ttl_header(conn, dedup_queue):
    q = dedup_queue(**{"x-cache-ttl": 300})
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"a", props("a"))
    ch.basic_publish("", q, b"b", props("b", **{"x-cache-ttl": 3000}))
    ch.basic_publish("", q, b"a dup", props("a"))
    time.sleep(0.5)
    ch.basic_publish("", q, b"a late", props("a"))  # its entry expired: enqueued
    ch.basic_publish("", q, b"b dup", props("b"))  # its own TTL is longer: still a duplicate
    assert [body for _m, _p, body in get_all(ch, q)] == [b"a", b"b", b"a late"]


def test_the_queue_object_shows_its_cache(broker, dedup_queue):
    q = dedup_queue(**{"x-cache-size": 50})
    with confirm_channel(broker) as ch:
        publish_ids(ch, "", q, [1, 2, 2])
    vhost = urllib.parse.quote(broker.vhost, safe="")
    req = urllib.request.Request(f"http://127.0.0.1:{broker.management_port}/api/queues/{vhost}/"
                                 f"{urllib.parse.quote(q, safe='')}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        info = json.load(resp)["message_deduplication_cache_info"]
    assert (info["entries"], info["size"], info["dropped"]) == (2, 50, 1)


QUEUE_ARG_ERRORS = [
    ({"x-message-deduplication": "yes"}, "'x-message-deduplication': {unacceptable_type,longstr}"),
    ({**DEDUP, "x-cache-size": 0}, "'x-cache-size': {value_zero,0}"),
    ({**DEDUP, "x-cache-size": "ten"}, "'x-cache-size': \"expected integer, got longstr\""),
    ({**DEDUP, "x-cache-ttl": -1}, "'x-cache-ttl': {value_negative,-1}"),
    ({**DEDUP, "x-cache-persistence": "tape"},
     "'x-cache-persistence': {unacceptable_value,'tape'}; expected one of disk, memory"),
]


@pytest.mark.parametrize(("arguments", "text"), QUEUE_ARG_ERRORS)
def test_bad_queue_arguments_are_refused_with_406(conn, uid, arguments, text):
    q = f"{uid}-bad"
    with pytest.raises(ChannelClosedByBroker) as err:
        conn.channel().queue_declare(q, arguments=arguments)
    key, problem = text.split(": ", 1)
    assert (err.value.reply_code, err.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg {key} for queue '{q}' in vhost '/': {problem}")


# -- the exchange type ------------------------------------------------------------------------------------------

@pytest.fixture
def dedup_exchange(broker, uid, cleanup):
    def make(suffix: str = "x", durable: bool = False, **arguments) -> str:
        name = f"{uid}-{suffix}"
        conn = pika.BlockingConnection(broker.pika_params())
        try:
            conn.channel().exchange_declare(name, "x-message-deduplication", durable=durable,
                                            arguments={"x-cache-size": 100, **arguments})
        finally:
            conn.close()
        cleanup[1].append(name)
        return name

    return make


def test_the_exchange_routes_like_a_fanout_and_drops_duplicates(broker, conn, dedup_exchange, make_queue):
    x = dedup_exchange()
    queues = [make_queue(s) for s in ("a", "b")]
    ch = conn.channel()
    ch.queue_bind(queues[0], x, "some-key")
    ch.queue_bind(queues[1], x, "another")
    with confirm_channel(broker) as pub:
        publish_ids(pub, x, "any-key", [1, 2, 1, 2, 1])  # acked, duplicates too
        pub.basic_publish(x, "", b"no header")
        pub.basic_publish(x, "", b"no header")
    assert [ready_count(conn, q) for q in queues] == [4, 4]


def test_a_duplicate_at_the_exchange_is_returned_if_mandatory_then_acked(broker, conn, dedup_exchange, make_queue):
    """The plugin's duplicate routes nowhere, so RabbitMQ returns it (312 NO_ROUTE) before the ack."""
    x = dedup_exchange()
    q = make_queue()
    conn.channel().queue_bind(q, x)
    with confirm_channel(broker) as pub:
        pub.basic_publish(x, "", b"1", props("a"), mandatory=True)
        with pytest.raises(UnroutableError) as err:
            pub.basic_publish(x, "", b"2", props("a"), mandatory=True)
        assert err.value.messages[0].method.reply_code == 312
        pub.basic_publish(x, "", b"3", props("b"), mandatory=True)  # the channel goes on: it was acked
    assert ready_count(conn, q) == 2


def test_the_exchange_cache_ttl_and_message_header(broker, conn, dedup_exchange, make_queue):
    x = dedup_exchange(**{"x-cache-ttl": 300})
    q = make_queue()
    conn.channel().queue_bind(q, x)
    with confirm_channel(broker) as pub:
        pub.basic_publish(x, "", b"a", props("a"))
        pub.basic_publish(x, "", b"b", props("b", **{"x-cache-ttl": 5000}))
        pub.basic_publish(x, "", b"a", props("a"))
        time.sleep(0.5)
        pub.basic_publish(x, "", b"a", props("a"))
        pub.basic_publish(x, "", b"b", props("b"))
    assert ready_count(conn, q) == 3


@pytest.mark.parametrize(("arguments", "text"), [
    ({}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": 0}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": "foo"}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": 10, "x-cache-ttl": "bar"}, "Invalid argument, 'x-cache-ttl' must be an integer greater than 0"),
    ({"x-cache-size": 10, "x-cache-persistence": "tape"},
     "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'"),
])
def test_bad_exchange_arguments_are_refused_with_the_plugins_406(conn, uid, arguments, text):
    with pytest.raises(ChannelClosedByBroker) as err:
        conn.channel().exchange_declare(f"{uid}-x", "x-message-deduplication", arguments=arguments)
    assert (err.value.reply_code, err.value.reply_text) == (406, "PRECONDITION_FAILED - " + text)


def test_a_cache_size_given_as_a_string_is_accepted(dedup_exchange):
    dedup_exchange(**{"x-cache-size": "10", "x-cache-ttl": "1000", "x-cache-persistence": "disk"})


# -- restarts ---------------------------------------------------------------------------------------------------

def setup_durable(b, uid: str) -> tuple[str, str, str, str, str]:
    """A durable classic queue, a stream and a durable exchange (bound to a durable queue) with disk caches, and
    a durable queue whose cache is in memory (``x-cache-persistence: memory``)."""
    classic, stream, memory, x, xq = (f"{uid}-{s}" for s in ("classic", "stream", "memory", "x", "xq"))
    size = {"x-cache-size": 1000}
    declare(b, classic, **size)
    declare(b, stream, **{"x-queue-type": "stream"}, **size)
    declare(b, memory, **{"x-cache-persistence": "memory"}, **size)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.exchange_declare(x, "x-message-deduplication", durable=True, arguments={"x-cache-size": 1000})
    ch.queue_declare(xq, durable=True)
    ch.queue_bind(xq, x)
    conn.close()
    return classic, stream, memory, x, xq


def publish_everywhere(b, names, ids) -> None:
    classic, stream, memory, x, _xq = names
    with confirm_channel(b) as ch:
        for q in (classic, stream, memory):
            publish_ids(ch, "", q, ids)
        publish_ids(ch, x, "", ids)


def counts(b, names) -> list[int]:
    classic, stream, memory, _x, xq = names
    return [count(b, q) for q in (classic, stream, memory, xq)]


def test_caches_survive_a_clean_restart(start_broker, uid):
    b = own_broker(start_broker)
    names = setup_durable(b, uid)
    publish_everywhere(b, names, range(20))
    assert counts(b, names) == [20, 20, 20, 20]
    b.restart()
    publish_everywhere(b, names, range(25))
    # Disk caches remember 0..19; the memory cache forgot them (its queue kept its persistent messages).
    assert counts(b, names) == [25, 25, 45, 25]


def test_confirmed_entries_survive_kill9(start_broker, uid):
    """Publish with confirms, kill -9 at once, start again: every confirmed id published again is a duplicate."""
    b = own_broker(start_broker)
    names = setup_durable(b, uid)
    publish_everywhere(b, names, range(200))
    b.kill9()
    b.start()
    assert counts(b, names)[:2] + counts(b, names)[3:] == [200, 200, 200]
    publish_everywhere(b, names, range(210))
    after = counts(b, names)
    assert after[0] == after[1] == after[3] == 210, after


def test_many_entries_rotate_the_log_and_survive_restarts(start_broker, uid):
    """More admissions than the log keeps before it starts a new file with a snapshot: the cache (size 10) is
    the last ten values after a clean restart and after a kill -9."""
    b = own_broker(start_broker)
    q = f"{uid}-q"
    declare(b, q, **{"x-cache-size": 10})
    with confirm_channel(b) as ch:
        publish_ids(ch, "", q, range(1100))  # rotation past 2 * 10 + 1024 records
    b.restart()
    with confirm_channel(b) as ch:
        publish_ids(ch, "", q, range(1090, 1100))  # all cached
    assert count(b, q) == 1100
    b.kill9()
    b.start()
    with confirm_channel(b) as ch:
        publish_ids(ch, "", q, range(1090, 1100))  # still all cached
        publish_ids(ch, "", q, [1089])  # evicted long ago: enqueued
    assert count(b, q) == 1101


def test_a_queue_declared_again_starts_with_an_empty_cache(start_broker, uid):
    b = own_broker(start_broker)
    q = f"{uid}-q"
    declare(b, q)
    with confirm_channel(b) as ch:
        publish_ids(ch, "", q, [1])
        ch.queue_delete(q)
    declare(b, q)
    with confirm_channel(b) as ch:
        publish_ids(ch, "", q, [1])
    b.restart()
    with confirm_channel(b) as ch:
        publish_ids(ch, "", q, [1])
    assert count(b, q) == 1
