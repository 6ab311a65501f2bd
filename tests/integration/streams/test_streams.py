"""Stream queues over AMQP 0-9-1 (``x-queue-type: stream``), as RabbitMQ 3.10.8 answers (issue 12, "What users
get"); run against RabbitMQ too with ``LEVERET_TEST_AMQP_URL``.

* declare: durable, not exclusive, not auto-delete, not server-named (406 with RabbitMQ's texts); the arguments
  of other queue types are refused (406 "... of queue type rabbit_stream_queue"); ``x-max-age`` takes
  RabbitMQ's units;
* consume: a per-consumer prefetch is required (406), automatic acks are refused (540), ``x-stream-offset`` is
  first / last / next / a number / a timestamp / an interval; each delivery has the ``x-stream-offset`` long
  header; reading removes nothing and an ack only gives credit;
* basic.get, queue.purge, basic.nack and basic.reject: 540 NOT_IMPLEMENTED;
* publisher confirms; the stream and its messages survive a restart (Leveret's own process).
"""

from __future__ import annotations

import asyncio
import datetime
import time

import aio_pika
import pika
import pytest
from amqp_helpers import Collector, pump, settle
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

pytest_plugins = ["amqp_helpers"]
pytestmark = pytest.mark.timeout(60)

STREAM = {"x-queue-type": "stream"}


@pytest.fixture
def stream(broker, uid, cleanup):
    """Declare a stream ``{uid}-{suffix}`` (deleted at teardown)."""

    def make(suffix: str = "s", **arguments) -> str:
        name = f"{uid}-{suffix}"
        c = pika.BlockingConnection(broker.pika_params())
        try:
            c.channel().queue_declare(name, durable=True, arguments={**STREAM, **arguments})
        finally:
            c.close()
        cleanup[0].append(name)
        return name

    return make


def fill(conn, queue: str, *bodies: bytes, **props) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(**props))
    ch.close()


def read(conn, queue: str, count: int, prefetch: int = 100, ack: bool = True, **arguments):
    """Consume ``count`` deliveries from ``queue`` with the given consumer arguments; returns (method,
    properties, body) triples."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list = []

    def on_message(c, method, props, body):
        got.append((method, props, body))
        if ack:
            c.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message, arguments=arguments)
    pump(conn, lambda: len(got) >= count)
    ch.basic_cancel(tag)
    ch.close()
    return got


def offsets(got) -> list[int]:
    return [props.headers["x-stream-offset"] for _m, props, _b in got]


def channel_error(conn, action) -> ChannelClosedByBroker:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        action(ch)
        pump(conn, lambda: not ch.is_open, timeout=2)
        ch.basic_qos(prefetch_count=1)  # raises once the close has arrived
    return ei.value


# -- declare ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "problem"), [({"durable": False}, "non-durable"),
                                             ({"durable": True, "exclusive": True}, "exclusive-owner"),
                                             ({"durable": True, "auto_delete": True}, "auto-delete")])
def test_declare_properties_refused(conn, uid, kw, problem):
    err = channel_error(conn, lambda ch: ch.queue_declare(f"{uid}-s", arguments=STREAM, **kw))
    assert err.reply_code == 406
    assert err.reply_text == f"PRECONDITION_FAILED - invalid property '{problem}' for queue '{uid}-s' in vhost '/'"


def test_server_named_stream_refused(conn):
    err = channel_error(conn, lambda ch: ch.queue_declare("", durable=True, arguments=STREAM))
    assert err.reply_code == 406
    assert err.reply_text == "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue"


@pytest.mark.parametrize(("key", "value"), [("x-max-length", 5), ("x-message-ttl", 5), ("x-overflow", "drop-head"),
                                            ("x-expires", 1000), ("x-single-active-consumer", True)])
def test_other_queue_types_arguments_refused(conn, uid, key, value):
    err = channel_error(conn, lambda ch: ch.queue_declare(f"{uid}-s", durable=True,
                                                          arguments={**STREAM, key: value}))
    assert err.reply_code == 406
    assert err.reply_text == (f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{uid}-s' in vhost '/' of queue "
                              "type rabbit_stream_queue")


def test_max_age_units(conn, stream, uid):
    for unit in ("7D", "12h", "30m", "10s", "1Y", "1M"):
        stream(f"age-{unit}", **{"x-max-age": unit, "x-max-length-bytes": 10_000_000,
                                 "x-stream-max-segment-size-bytes": 1_000_000})
    for bad in ("5", "0s", "1.5h", "1d"):
        err = channel_error(conn, lambda ch, bad=bad: ch.queue_declare(f"{uid}-bad", durable=True,
                                                                       arguments={**STREAM, "x-max-age": bad}))
        assert err.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '{uid}-bad' in vhost "
                                  "'/': invalid_max_age")


# -- consuming ---------------------------------------------------------------------------------------------------

def test_offsets_first_last_next_and_numeric(conn, stream):
    s = stream()
    fill(conn, s, *[b"m%d" % i for i in range(5)])
    assert offsets(read(conn, s, 5, **{"x-stream-offset": "first"})) == [0, 1, 2, 3, 4]
    assert offsets(read(conn, s, 3, **{"x-stream-offset": 2})) == [2, 3, 4]
    got = read(conn, s, 1, **{"x-stream-offset": "last"})
    assert offsets(got)[0] <= 4 and got[-1][2] == b"m4"  # RabbitMQ: from the last chunk
    # "next" (and no argument) waits for what comes after the subscription.
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    c_next, c_default = Collector(), Collector()
    ch.basic_consume(s, c_next, arguments={"x-stream-offset": "next"})
    ch.basic_consume(s, c_default)
    settle(conn, 0.3)
    assert c_next.bodies == [] and c_default.bodies == []
    fill(conn, s, b"later")
    pump(conn, lambda: len(c_next.bodies) == 1 and len(c_default.bodies) == 1)
    assert c_next.bodies == c_default.bodies == [b"later"]


def test_offset_by_timestamp_and_interval(conn, stream):
    s = stream()
    fill(conn, s, b"before")
    time.sleep(1.5)
    cut = datetime.datetime.now(tz=datetime.UTC).replace(microsecond=0)
    time.sleep(1.1)
    fill(conn, s, b"after")
    got = read(conn, s, 1, **{"x-stream-offset": cut})
    assert [b for _m, _p, b in got] == [b"after"]
    got = read(conn, s, 2, **{"x-stream-offset": "1h"})
    assert [b for _m, _p, b in got] == [b"before", b"after"]


def test_delivery_header_and_properties_kept(conn, stream):
    s = stream()
    fill(conn, s, b"a", headers={"k": "v"}, content_type="text/plain", delivery_mode=2)
    (_m, props, body), = read(conn, s, 1, **{"x-stream-offset": "first"})
    assert body == b"a" and props.content_type == "text/plain" and props.headers["k"] == "v"
    assert props.headers["x-stream-offset"] == 0


def test_reading_removes_nothing_and_acks_give_credit(conn, stream):
    s = stream()
    fill(conn, s, *[b"m%d" % i for i in range(6)])
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    got: list = []
    ch.basic_consume(s, lambda c, m, p, b: got.append(m), arguments={"x-stream-offset": "first"})
    pump(conn, lambda: len(got) >= 2)
    settle(conn, 0.3)
    assert len(got) == 2, "the prefetch is the consumer's credit"
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    pump(conn, lambda: len(got) >= 4)
    settle(conn, 0.2)
    assert len(got) == 4
    ch.close()
    again = read(conn, s, 6, **{"x-stream-offset": "first"})
    assert offsets(again) == [0, 1, 2, 3, 4, 5]


def test_prefetch_required_and_automatic_ack_refused(conn, connect, stream):
    s = stream()
    err = channel_error(conn, lambda ch: ch.basic_consume(s, lambda *a: None))
    assert err.reply_code == 406
    assert err.reply_text == (f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{s}' in vhost "
                              "'/''")
    c = connect()
    ch = c.channel()
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(ConnectionClosedByBroker) as ei:
        ch.basic_consume(s, lambda *a: None, auto_ack=True)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text == (f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues "
                                   f"queue '{s}' in vhost '/'")


@pytest.mark.leveret_only  # RabbitMQ 3.10 accepts a global prefetch beside a per-consumer one
def test_global_qos_refused(conn, stream):
    s = stream()

    def consume(ch):
        ch.basic_qos(prefetch_count=10, global_qos=True)
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(s, lambda *a: None)

    err = channel_error(conn, consume)
    assert err.reply_code == 406 and "does not support global qos" in err.reply_text


@pytest.mark.parametrize("what", ["get", "purge", "nack", "reject"])
def test_not_implemented(connect, stream, what):
    s = stream()
    c = connect()
    fill(c, s, b"a")
    ch = c.channel()
    texts = {"get": "basic.get", "purge": "queue.purge", "nack": "basic.nack and basic.reject",
             "reject": "basic.nack and basic.reject"}
    with pytest.raises(ConnectionClosedByBroker) as ei:
        if what == "get":
            ch.basic_get(s)
        elif what == "purge":
            ch.queue_purge(s)
        else:
            ch.basic_qos(prefetch_count=1)
            got: list = []
            ch.basic_consume(s, lambda c_, m, p, b: got.append(m), arguments={"x-stream-offset": "first"})
            pump(c, lambda: bool(got))
            if what == "nack":
                ch.basic_nack(got[0].delivery_tag, requeue=True)
            else:
                ch.basic_reject(got[0].delivery_tag, requeue=False)
            pump(c, lambda: False, timeout=2)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text == f"NOT_IMPLEMENTED - {texts[what]} not supported by stream queues queue '{s}' in vhost '/'"


# -- publishing -------------------------------------------------------------------------------------------------

def test_confirms_and_any_exchange_routes_to_the_stream(conn, stream, make_exchange):
    s = stream()
    x = make_exchange("fan", "fanout")
    ch = conn.channel()
    ch.queue_bind(s, x)
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish(x, "", b"%d" % i, mandatory=True)  # confirmed: raises on nack or return
    ch.basic_publish("", s, b"direct", pika.BasicProperties(delivery_mode=1))
    got = read(conn, s, 21, **{"x-stream-offset": "first"})
    assert [b for _m, _p, b in got] == [b"%d" % i for i in range(20)] + [b"direct"]


def test_aio_pika_consumer(broker, stream):
    s = stream()

    async def main() -> list[tuple[int, bytes]]:
        connection = await aio_pika.connect_robust(broker.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            for i in range(3):
                await channel.default_exchange.publish(aio_pika.Message(b"a%d" % i), routing_key=s)
            await channel.set_qos(prefetch_count=2)
            queue = await channel.declare_queue(s, durable=True, arguments=STREAM)
            out: list[tuple[int, bytes]] = []
            async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
                async for message in it:
                    await message.ack()
                    out.append((message.headers["x-stream-offset"], message.body))
                    if len(out) == 3:
                        break
            return out

    assert asyncio.run(asyncio.wait_for(main(), 20)) == [(0, b"a0"), (1, b"a1"), (2, b"a2")]


@pytest.mark.leveret_only  # a broker process of the test's own, restarted
def test_stream_survives_a_restart(start_broker, uid):
    b = start_broker()
    c = pika.BlockingConnection(b.pika_params())
    ch = c.channel()
    ch.queue_declare(f"{uid}-s", durable=True, arguments={**STREAM, "x-max-age": "1D"})
    fill(c, f"{uid}-s", *[b"m%d" % i for i in range(10)])
    c.close()
    b.restart()
    c = pika.BlockingConnection(b.pika_params())
    got = read(c, f"{uid}-s", 10, **{"x-stream-offset": "first"})
    assert [(o, body) for o, (_m, _p, body) in zip(offsets(got), got, strict=True)] == \
        [(i, b"m%d" % i) for i in range(10)]
    fill(c, f"{uid}-s", b"after")
    got = read(c, f"{uid}-s", 11, **{"x-stream-offset": "first"})
    assert offsets(got)[-1] == 10, "no offset is reused after a restart"
    c.close()
