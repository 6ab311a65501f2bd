"""Message TTL (``x-message-ttl``, the ``expiration`` property) and queue expiry (``x-expires``).

Every expectation here was checked against RabbitMQ 3.10.8 (docs/decisions/rabbitmq-parity.md):

* the lower of the queue TTL and the message's ``expiration`` applies; an expired message is never delivered,
  not by ``basic.get`` and not to a consumer that attaches later;
* a requeued message keeps its original expiry: requeued after its TTL passed it expires instead of being
  redelivered, and requeueing does not restart the clock;
* TTL 0 means "deliver now or expire": delivered to a consumer that is waiting with room, otherwise dropped
  (or dead-lettered with reason ``expired``);
* ``x-expires`` deletes a queue that has been unused for that long; consumers keep it alive, ``basic.get``,
  ``queue.declare`` (passive too!) renew the lease, publishing does not; its messages are not dead-lettered;
* invalid values are channel errors: ``406 PRECONDITION_FAILED - invalid arg 'x-message-ttl' …``,
  ``406 PRECONDITION_FAILED - invalid expiration '…': …``.

Timing: TTLs are 100-600 ms and every wait is bounded.
"""

from __future__ import annotations

import time

import pika
import pytest
from amqp_helpers import (
    Collector,
    expect_channel_error,
    get_all,
    publish,
    pump,
    ready_count,
    settle,
    wait_get,
)
from pika.exceptions import ChannelClosedByBroker

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange, dl_setup
pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------------------------------


def exp(ms: int | str) -> pika.BasicProperties:
    return pika.BasicProperties(expiration=str(ms))


def queue_exists(conn, queue: str) -> bool:
    """Passive declare. NB: in RabbitMQ a passive declare renews an ``x-expires`` lease (see below)."""
    ch = conn.channel()
    try:
        ch.queue_declare(queue, passive=True)
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False
    ch.close()
    return True


def wait_expired(conn, queue: str, expires_ms: int, timeout: float = 5.0) -> bool:
    """Wait for an ``x-expires`` queue to go. Each check renews the lease, so checks are spaced by more
    than the expiry time; returns True once a passive declare gets 404."""
    deadline = time.monotonic() + timeout
    while True:
        settle(conn, 2.5 * expires_ms / 1000)
        if not queue_exists(conn, queue):
            return True
        if time.monotonic() > deadline:
            return False


# -- x-message-ttl and expiration --------------------------------------------------------------------------


def test_queue_ttl_expires_messages(conn, make_queue):
    q = make_queue(arguments={"x-message-ttl": 200})
    publish(conn, q, b"a", b"b")
    ch = conn.channel()
    method, _p, body = ch.basic_get(q, auto_ack=True)  # well within the TTL
    assert body == b"a"
    assert method.message_count == 1
    settle(conn, 0.45)
    assert ch.basic_get(q, auto_ack=True)[0] is None  # get-empty: "b" expired
    assert ready_count(conn, q) == 0


def test_per_message_expiration_expires_message(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"short", properties=exp(150))
    publish(conn, q, b"forever")
    assert ready_count(conn, q) == 2
    settle(conn, 0.4)
    ch = conn.channel()
    assert [m[2] for m in get_all(ch, q)] == [b"forever"]


def test_expiration_property_is_delivered_as_sent(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"x", properties=exp(60000))
    _m, props, body = conn.channel().basic_get(q, auto_ack=True)
    assert (body, props.expiration) == (b"x", "60000")


@pytest.mark.parametrize(
    ("queue_ttl", "expiration"),
    [(200, "60000"), (60000, "200")],
    ids=["queue-ttl-lower", "message-expiration-lower"],
)
def test_lower_of_queue_ttl_and_expiration_wins(conn, make_queue, queue_ttl, expiration):
    q = make_queue(arguments={"x-message-ttl": queue_ttl})
    publish(conn, q, b"m", properties=exp(expiration))
    assert ready_count(conn, q) == 1
    settle(conn, 0.5)
    assert conn.channel().basic_get(q)[0] is None
    assert ready_count(conn, q) == 0


def test_expired_message_never_delivered_to_later_consumer(conn, make_queue):
    q = make_queue(arguments={"x-message-ttl": 150})
    publish(conn, q, b"old1", b"old2")
    settle(conn, 0.4)
    got = Collector()
    conn.channel().basic_consume(q, got, auto_ack=True)
    settle(conn)
    assert got.bodies == []
    publish(conn, q, b"fresh")
    assert pump(conn, lambda: len(got) == 1)
    settle(conn, 0.1)
    assert got.bodies == [b"fresh"]


def test_expired_message_behind_live_head_never_delivered(conn, make_queue):
    """The short-lived message sits behind a long-lived one: it may linger until it reaches the head,
    but it must never be handed out."""
    q = make_queue()
    publish(conn, q, b"long", properties=exp(60000))
    publish(conn, q, b"short", properties=exp(100))
    publish(conn, q, b"none")
    settle(conn, 0.35)
    ch = conn.channel()
    assert [m[2] for m in get_all(ch, q)] == [b"long", b"none"]


def test_expired_messages_skipped_by_waiting_consumer_blocked_by_prefetch(conn, make_queue):
    q = make_queue()
    got = Collector()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q, got)
    publish(conn, q, b"first")
    assert pump(conn, lambda: len(got) == 1)
    publish(conn, q, b"expires", properties=exp(100))
    publish(conn, q, b"stays")
    settle(conn, 0.35)  # "expires" expired while the consumer had no room
    ch.basic_ack(got.msgs[0][0].delivery_tag)
    assert pump(conn, lambda: len(got) == 2)
    ch.basic_ack(got.msgs[1][0].delivery_tag)
    settle(conn, 0.2)
    assert got.bodies == [b"first", b"stays"]


@pytest.mark.parametrize("how", ["queue-ttl", "expiration"])
def test_message_requeued_after_its_ttl_expires_instead_of_redelivery(conn, make_queue, how):
    if how == "queue-ttl":
        q, props = make_queue(arguments={"x-message-ttl": 200}), None
    else:
        q, props = make_queue(), exp(200)
    publish(conn, q, b"m", properties=props)
    got = Collector()
    ch = conn.channel()
    ch.basic_consume(q, got)
    assert pump(conn, lambda: len(got) == 1)
    settle(conn, 0.4)  # hold it past its TTL
    ch.basic_nack(got.msgs[0][0].delivery_tag, requeue=True)
    settle(conn)
    assert len(got) == 1, "a requeued message past its TTL must expire, not be redelivered"
    assert ready_count(conn, q) == 0


def test_message_requeued_after_its_ttl_via_get_expires(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"m", properties=exp(200))
    ch = conn.channel()
    method, _p, _b = ch.basic_get(q)
    settle(conn, 0.4)
    ch.basic_reject(method.delivery_tag, requeue=True)
    assert ch.basic_get(q)[0] is None
    assert ready_count(conn, q) == 0


def test_requeue_does_not_restart_the_ttl_clock(conn, make_queue):
    """expiration 600 ms: requeued at ~300 ms it is still there (redelivered); at ~750 ms it is gone,
    although a clock restarted at the requeue would run until ~900 ms."""
    q = make_queue()
    t0 = time.monotonic()
    publish(conn, q, b"m", properties=exp(600))
    ch = conn.channel()
    method, _p, _b = ch.basic_get(q)
    settle(conn, 0.3 - (time.monotonic() - t0))
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _p, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"m", True)
    ch.basic_nack(method.delivery_tag, requeue=True)
    settle(conn, 0.75 - (time.monotonic() - t0))
    assert ch.basic_get(q)[0] is None
    assert ready_count(conn, q) == 0


# -- TTL 0 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["queue-ttl", "expiration"])
def test_ttl_zero_delivered_to_waiting_consumer(conn, make_queue, how):
    if how == "queue-ttl":
        q, props = make_queue(arguments={"x-message-ttl": 0}), None
    else:
        q, props = make_queue(), exp(0)
    got = Collector()
    conn.channel().basic_consume(q, got, auto_ack=True)
    publish(conn, q, b"now1", b"now2", properties=props)
    assert pump(conn, lambda: len(got) == 2)
    assert got.bodies == [b"now1", b"now2"]


@pytest.mark.parametrize("how", ["queue-ttl", "expiration"])
def test_ttl_zero_without_consumer_is_dropped(conn, make_queue, how):
    if how == "queue-ttl":
        q, props = make_queue(arguments={"x-message-ttl": 0}), None
    else:
        q, props = make_queue(), exp(0)
    publish(conn, q, b"gone", properties=props)
    assert ready_count(conn, q) == 0
    assert conn.channel().basic_get(q)[0] is None
    # and a consumer that comes later gets nothing
    got = Collector()
    conn.channel().basic_consume(q, got, auto_ack=True)
    settle(conn)
    assert len(got) == 0


def test_ttl_zero_dropped_when_consumer_has_no_room(conn, make_queue):
    q = make_queue(arguments={"x-message-ttl": 0})
    got = Collector()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q, got)
    publish(conn, q, b"taken")
    assert pump(conn, lambda: len(got) == 1)
    publish(conn, q, b"no-room")
    settle(conn, 0.2)
    ch.basic_ack(got.msgs[0][0].delivery_tag)
    settle(conn)
    assert got.bodies == [b"taken"]
    assert ready_count(conn, q) == 0


def test_ttl_zero_without_consumer_is_dead_lettered_as_expired(conn, make_queue, make_exchange):
    dlx = make_exchange("dlx", "fanout")
    dlq = make_queue("dlq")
    conn.channel().queue_bind(dlq, dlx)
    q = make_queue(arguments={"x-message-ttl": 0, "x-dead-letter-exchange": dlx})
    publish(conn, q, b"zero")
    get_ch = conn.channel()
    _m, props, body = wait_get(get_ch, dlq)
    get_ch.close()
    assert body == b"zero"
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (q, "expired", 1)
    assert ready_count(conn, q) == 0


# -- invalid TTL values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, "abc"], ids=["negative", "string"])
def test_invalid_x_message_ttl_is_406(conn, uid, value):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(f"{uid}-q", arguments={"x-message-ttl": value})
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-message-ttl'")
    assert conn.is_open
    assert not queue_exists(conn, f"{uid}-q")


@pytest.mark.parametrize(("value", "reason"), [
    ("abc", "no_integer"), ("", "no_integer"), (" 100", "no_integer"), ("-", "no_integer"),
    ("1.5", '{leftover_string,".5"}'), ("12abc", '{leftover_string,"abc"}'), ("1e3", '{leftover_string,"e3"}'),
    ("-1", "{value_negative,-1}"), ("315360000001", "{value_too_large,315360000001}"),
    ("9223372036854775808", "{value_too_large,9223372036854775808}"),
])
def test_invalid_expiration_is_406_channel_error(conn, make_queue, value, reason):
    """RabbitMQ's rabbit_basic:parse_expiration: string:to_integer, then rabbit_misc:check_expiry (0 to ten
    years in ms in 3.10.8); the reason follows the value. RabbitMQ prints the reason with ~p, which breaks a
    tuple too long for its line (the largest values): compared without white space."""
    q = make_queue()
    ch = conn.channel()
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration=value, delivery_mode=2))
    error = expect_channel_error(conn, ch)
    assert error.reply_code == 406
    prefix = f"PRECONDITION_FAILED - invalid expiration '{value}': "
    assert error.reply_text.startswith(prefix)
    assert "".join(error.reply_text[len(prefix):].split()) == reason
    assert ready_count(conn, q) == 0


@pytest.mark.parametrize("value", ["315360000000", "4294967296", "+600000", "-0", "007"])
def test_expiration_up_to_ten_years_signed_or_padded_is_accepted(conn, make_queue, value):
    """What string:to_integer reads (a sign, leading zeros) and check_expiry allows (up to 315360000000 ms)."""
    q = make_queue()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration=value, delivery_mode=2))
    assert ch.is_open
    if int(value) > 1000:  # a short TTL may pass before the count
        assert ready_count(conn, q) == 1


# -- x-expires ---------------------------------------------------------------------------------------------


def test_unused_queue_is_deleted_after_x_expires(conn, make_queue):
    q = make_queue(arguments={"x-expires": 200})
    assert wait_expired(conn, q, 200)


def test_x_expires_deletes_queue_with_messages_without_dead_lettering(conn, make_queue, make_exchange):
    dlx = make_exchange("dlx", "fanout")
    dlq = make_queue("dlq")
    conn.channel().queue_bind(dlq, dlx)
    q = make_queue(arguments={"x-expires": 200, "x-dead-letter-exchange": dlx})
    publish(conn, q, b"a", b"b")  # publishing does not count as use
    assert wait_expired(conn, q, 200)
    assert ready_count(conn, dlq) == 0  # an expired queue's messages are not dead-lettered


def test_consumer_keeps_x_expires_queue_alive(conn, make_queue):
    q = make_queue(arguments={"x-expires": 200})
    ch = conn.channel()
    tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
    settle(conn, 0.7)
    assert queue_exists(conn, q)
    ch.basic_cancel(tag)  # the lease starts again once the last consumer goes
    assert wait_expired(conn, q, 200)


def test_consumer_connection_closing_starts_x_expires(connect, make_queue):
    c1, c2 = connect(), connect()
    q = make_queue(arguments={"x-expires": 200})
    c1.channel().basic_consume(q, lambda *a: None, auto_ack=True)
    settle(c2, 0.6)
    assert queue_exists(c2, q)
    c1.close()
    assert wait_expired(c2, q, 200)


def test_basic_get_renews_x_expires(conn, make_queue):
    q = make_queue(arguments={"x-expires": 300})
    ch = conn.channel()
    for _ in range(5):  # 750 ms in all, never 300 ms without a basic.get
        settle(conn, 0.15)
        ch.basic_get(q)
    assert queue_exists(conn, q)
    assert wait_expired(conn, q, 300)


def test_redeclare_renews_x_expires(conn, make_queue):
    q = make_queue(arguments={"x-expires": 300})
    ch = conn.channel()
    for _ in range(5):
        settle(conn, 0.15)
        ch.queue_declare(q, arguments={"x-expires": 300})
    assert queue_exists(conn, q)
    assert wait_expired(conn, q, 300)


def test_passive_declare_renews_x_expires(conn, make_queue):
    """RabbitMQ counts a passive queue.declare as use: polling an expiring queue keeps it alive."""
    q = make_queue(arguments={"x-expires": 300})
    for _ in range(5):
        settle(conn, 0.15)
        assert queue_exists(conn, q)
    settle(conn, 0.15)
    assert queue_exists(conn, q)


def test_publish_does_not_renew_x_expires(conn, make_queue):
    q = make_queue(arguments={"x-expires": 300})
    ch = conn.channel()
    ch.confirm_delivery()
    for _ in range(6):  # 900 ms of publishing, one every 150 ms
        ch.basic_publish("", q, b"x")
        settle(conn, 0.15)
    assert not queue_exists(conn, q)


@pytest.mark.parametrize("value", [0, -1, "abc"], ids=["zero", "negative", "string"])
def test_invalid_x_expires_is_406(conn, uid, value):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(f"{uid}-q", arguments={"x-expires": value})
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-expires'")
    assert conn.is_open
    assert not queue_exists(conn, f"{uid}-q")
