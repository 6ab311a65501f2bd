"""Queue features: priority queues (``x-max-priority``), consumer priorities (``x-priority``), single active
consumer, ``x-queue-mode: lazy``, ``x-queue-type: quorum`` with ``x-delivery-limit``, as RabbitMQ 3.10 does them.

As RabbitMQ 3.10.8 does it:

* ``x-max-priority`` 0..255 is accepted (0 gives a plain FIFO queue), 256 / negative / a string are
  ``406 PRECONDITION_FAILED - invalid arg 'x-max-priority' …``; a higher priority is delivered first, no priority
  counts as 0, a priority above the maximum counts as the maximum (and is delivered unchanged);
* a consumer with a higher ``x-priority`` gets every message while it has room; lower ones get messages only
  while it is blocked (prefetch);
* ``x-single-active-consumer``: only one consumer receives; when it is cancelled or its connection goes, the
  next one takes over (the unacked messages of a dead one come back first, redelivered); an exclusive
  basic.consume on such a queue is ``403 ACCESS_REFUSED … in exclusive use``;
* ``x-queue-mode: lazy`` is accepted (an unknown mode is a 406);
* quorum queues must be durable, non-exclusive, non-auto-delete (``406 PRECONDITION_FAILED - invalid property
  'non-durable' / 'exclusive-owner' / 'auto-delete' …``). Their redeliveries carry ``x-delivery-count`` (a long;
  a consumer's first delivery has none); with ``x-delivery-limit: N`` a message returned more than N times
  (delivered N + 1 times) is dropped, or dead-lettered with reason ``delivery_limit``.

RabbitMQ 3.10 refuses ``x-delivery-limit`` on a classic queue (406 "invalid arg 'x-delivery-limit' … of queue
type rabbit_classic_queue"); Leveret accepts it on any queue, so that test is ``leveret_only``.
"""

from __future__ import annotations

import pika
import pytest
from amqp_helpers import Collector, declare_ok, get_all, is_long, publish, pump, settle, wait_get
from pika.exceptions import ChannelClosedByBroker

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange, dl_setup
pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------------------------------


def publish_prio(conn, queue: str, *items: tuple[str, int | None]) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for body, prio in items:
        ch.basic_publish("", queue, body.encode(), pika.BasicProperties(priority=prio))
    ch.close()


def bodies(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


def declare_error(conn, queue: str, **kw) -> ChannelClosedByBroker:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(queue, **kw)
    assert conn.is_open, "a declare error is a channel error"
    return ei.value


# -- priority queues ---------------------------------------------------------------------------------------


def test_priority_queue_delivers_highest_priority_first(conn, make_queue):
    q = make_queue(arguments={"x-max-priority": 5})
    publish_prio(conn, q, ("none", None), ("p1", 1), ("p3", 3), ("p5", 5), ("p0", 0), ("p3b", 3))
    got = get_all(conn.channel(), q)
    assert [m[2] for m in got] == bodies("p5", "p3", "p3b", "p1", "none", "p0")  # FIFO within a priority
    assert [m[1].priority for m in got] == [5, 3, 3, 1, None, 0]


def test_priority_above_max_counts_as_max(conn, make_queue):
    q = make_queue(arguments={"x-max-priority": 5})
    publish_prio(conn, q, ("a5", 5), ("b9", 9), ("c5", 5), ("d4", 4), ("e200", 200))
    got = get_all(conn.channel(), q)
    # 9 and 200 sort as 5, in publish order among the 5s; the property itself is delivered unchanged
    assert [m[2] for m in got] == bodies("a5", "b9", "c5", "e200", "d4")
    assert [m[1].priority for m in got] == [5, 9, 5, 200, 4]


def test_priority_queue_serves_consumer_by_priority_once_it_has_room(conn, make_queue):
    q = make_queue(arguments={"x-max-priority": 10})
    got = Collector()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q, got)
    publish_prio(conn, q, ("first", 0))
    assert pump(conn, lambda: len(got) == 1)
    publish_prio(conn, q, ("low", 1), ("mid", 5), ("high", 9), ("low2", 1))
    settle(conn, 0.1)
    for i in range(5):
        assert pump(conn, lambda n=i + 1: len(got) == n)
        ch.basic_ack(got.msgs[i][0].delivery_tag)
    assert got.bodies == bodies("first", "high", "mid", "low", "low2")


def test_requeued_message_returns_ahead_of_lower_priorities(conn, make_queue):
    q = make_queue(arguments={"x-max-priority": 5})
    publish_prio(conn, q, ("hi", 5))
    ch = conn.channel()
    method, _p, _b = ch.basic_get(q)
    publish_prio(conn, q, ("lo1", 1), ("lo2", 1))
    ch.basic_nack(method.delivery_tag, requeue=True)
    got = get_all(ch, q)
    assert [m[2] for m in got] == bodies("hi", "lo1", "lo2")
    assert got[0][0].redelivered is True


def test_queue_without_max_priority_ignores_priority(conn, make_queue):
    q = make_queue()
    publish_prio(conn, q, ("a", 1), ("b", 9), ("c", None))
    assert [m[2] for m in get_all(conn.channel(), q)] == bodies("a", "b", "c")


@pytest.mark.parametrize("value", [1, 10, 255])
def test_valid_max_priority_accepted(conn, make_queue, value):
    q = make_queue(arguments={"x-max-priority": value})
    publish_prio(conn, q, ("low", 0), ("high", value))
    assert [m[2] for m in get_all(conn.channel(), q)] == bodies("high", "low")


def test_max_priority_zero_is_accepted_as_plain_queue(conn, make_queue):
    q = make_queue(arguments={"x-max-priority": 0})
    publish_prio(conn, q, ("a", 0), ("b", 5))
    assert [m[2] for m in get_all(conn.channel(), q)] == bodies("a", "b")


@pytest.mark.parametrize("value", [256, -1, "abc"], ids=["256", "negative", "string"])
def test_invalid_max_priority_is_406(conn, uid, value):
    err = declare_error(conn, f"{uid}-q", arguments={"x-max-priority": value})
    assert err.reply_code == 406
    assert err.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-max-priority'")


def test_max_priority_mismatch_on_redeclare_is_406(conn, make_queue):
    q = make_queue(arguments={"x-max-priority": 5})
    err = declare_error(conn, q, arguments={"x-max-priority": 6})
    assert err.reply_code == 406


# -- consumer priorities -----------------------------------------------------------------------------------


def test_higher_priority_consumer_with_room_gets_everything(connect, make_queue):
    c1, c2 = connect(), connect()
    q = make_queue()
    high, low = Collector(), Collector()
    c1.channel().basic_consume(q, high, auto_ack=True, arguments={"x-priority": 10})
    c2.channel().basic_consume(q, low, auto_ack=True)  # default priority 0, subscribed later
    publish(c1, q, *(f"m{i}" for i in range(8)))
    assert pump(c1, lambda: len(high) == 8)
    settle(c2, 0.2)
    assert len(low) == 0


def test_lower_priority_consumer_served_while_higher_blocked_by_prefetch(conn, make_queue):
    q = make_queue()
    high, low, lowest = Collector(), Collector(), Collector()
    ch_high, ch_low, ch_lowest = conn.channel(), conn.channel(), conn.channel()
    ch_high.basic_qos(prefetch_count=2)
    ch_high.basic_consume(q, high, arguments={"x-priority": 5})
    ch_low.basic_qos(prefetch_count=1)
    ch_low.basic_consume(q, low, arguments={"x-priority": 1})
    ch_lowest.basic_consume(q, lowest, auto_ack=True, arguments={"x-priority": -3})
    publish(conn, q, "m1", "m2", "m3", "m4", "m5")
    assert pump(conn, lambda: len(high) + len(low) + len(lowest) == 5)
    assert (high.bodies, low.bodies, lowest.bodies) == (bodies("m1", "m2"), bodies("m3"), bodies("m4", "m5"))
    # room again at the top: the highest-priority consumer gets the next message
    ch_high.basic_ack(high.msgs[1][0].delivery_tag, multiple=True)
    publish(conn, q, "m6")
    assert pump(conn, lambda: len(high) == 3)
    assert high.bodies[-1] == b"m6"


# -- single active consumer --------------------------------------------------------------------------------


def test_single_active_consumer_only_first_receives(connect, make_queue):
    c1, c2 = connect(), connect()
    q = make_queue(arguments={"x-single-active-consumer": True})
    first, second = Collector(), Collector()
    c1.channel().basic_consume(q, first, auto_ack=True)
    c2.channel().basic_consume(q, second, auto_ack=True)
    assert declare_ok(c1, q).consumer_count == 2
    publish(c1, q, *(f"m{i}" for i in range(6)))
    assert pump(c1, lambda: len(first) == 6)
    settle(c2, 0.2)
    assert len(second) == 0


def test_single_active_consumer_cancel_hands_over(conn, make_queue):
    q = make_queue(arguments={"x-single-active-consumer": True})
    first, second, third = Collector(), Collector(), Collector()
    ch1, ch2, ch3 = conn.channel(), conn.channel(), conn.channel()
    tag1 = ch1.basic_consume(q, first, auto_ack=True)
    ch2.basic_consume(q, second, auto_ack=True)
    ch3.basic_consume(q, third, auto_ack=True)
    publish(conn, q, "a1", "a2")
    assert pump(conn, lambda: len(first) == 2)
    ch1.basic_cancel(tag1)
    publish(conn, q, "b1", "b2", "b3")
    assert pump(conn, lambda: len(second) == 3)
    settle(conn, 0.1)
    assert (first.bodies, second.bodies, third.bodies) == (bodies("a1", "a2"), bodies("b1", "b2", "b3"), [])


def test_single_active_consumer_manual_ack_hands_over_after_cancel(conn, make_queue):
    q = make_queue(arguments={"x-single-active-consumer": True})
    first, second = Collector(), Collector()
    ch1, ch2 = conn.channel(), conn.channel()
    ch1.basic_qos(prefetch_count=5)
    ch2.basic_qos(prefetch_count=5)
    tag1 = ch1.basic_consume(q, first)
    ch2.basic_consume(q, second)
    publish(conn, q, "a1", "a2")
    assert pump(conn, lambda: len(first) == 2)
    ch1.basic_ack(first.msgs[1][0].delivery_tag, multiple=True)
    ch1.basic_cancel(tag1)
    publish(conn, q, "b1", "b2")
    assert pump(conn, lambda: len(second) == 2)
    assert second.bodies == bodies("b1", "b2")
    assert len(first) == 2


def test_single_active_consumer_connection_loss_hands_over_with_unacked_first(connect, make_queue):
    c1, c2 = connect(), connect()
    q = make_queue(arguments={"x-single-active-consumer": True})
    first, second = Collector(), Collector()
    ch1 = c1.channel()
    ch1.basic_qos(prefetch_count=1)
    ch1.basic_consume(q, first)
    ch2 = c2.channel()
    ch2.basic_qos(prefetch_count=10)
    ch2.basic_consume(q, second)
    publish(c2, q, "m1", "m2", "m3")
    assert pump(c1, lambda: len(first) == 1)
    settle(c2, 0.1)
    assert len(second) == 0
    c1.close()  # the active consumer's connection goes with m1 unacked
    assert pump(c2, lambda: len(second) == 3)
    assert second.bodies == bodies("m1", "m2", "m3")
    assert [m[0].redelivered for m in second.msgs] == [True, False, False]
    assert declare_ok(c2, q).consumer_count == 1


def test_exclusive_consume_on_single_active_consumer_queue_is_403(conn, make_queue):
    q = make_queue(arguments={"x-single-active-consumer": True})
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(q, lambda *a: None, exclusive=True)
    assert ei.value.reply_code == 403
    assert "in exclusive use" in ei.value.reply_text
    assert conn.is_open


def test_single_active_consumer_false_is_round_robin(conn, make_queue):
    q = make_queue(arguments={"x-single-active-consumer": False})
    a, b = Collector(), Collector()
    conn.channel().basic_consume(q, a, auto_ack=True)
    conn.channel().basic_consume(q, b, auto_ack=True)
    publish(conn, q, "1", "2", "3", "4")
    assert pump(conn, lambda: len(a) + len(b) == 4)
    assert (len(a), len(b)) == (2, 2)


def test_single_active_consumer_non_boolean_is_406(conn, uid):
    err = declare_error(conn, f"{uid}-q", arguments={"x-single-active-consumer": "yes"})
    assert err.reply_code == 406
    assert err.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-single-active-consumer'")


# -- x-queue-mode ------------------------------------------------------------------------------------------


def test_lazy_queue_mode_is_accepted(conn, make_queue):
    q = make_queue(arguments={"x-queue-mode": "lazy"})
    publish(conn, q, "a", "b")
    ch = conn.channel()
    ch.queue_declare(q, arguments={"x-queue-mode": "lazy"})  # equivalent redeclare
    assert [m[2] for m in get_all(ch, q)] == bodies("a", "b")


def test_unknown_queue_mode_is_406(conn, uid):
    err = declare_error(conn, f"{uid}-q", arguments={"x-queue-mode": "bogus"})
    assert err.reply_code == 406
    assert err.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-queue-mode'")


def test_unknown_queue_type_is_406(conn, uid):
    err = declare_error(conn, f"{uid}-q", arguments={"x-queue-type": "bogus"})
    assert err.reply_code == 406
    assert err.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-queue-type'")


# -- quorum queues -----------------------------------------------------------------------------------------


@pytest.mark.quorum
@pytest.mark.parametrize(
    ("flags", "prop"),
    [
        ({"durable": False}, "non-durable"),
        ({"durable": True, "exclusive": True}, "exclusive-owner"),
        ({"durable": True, "auto_delete": True}, "auto-delete"),
    ],
    ids=["non-durable", "exclusive", "auto-delete"],
)
def test_quorum_queue_property_restrictions_are_406(conn, uid, flags, prop):
    err = declare_error(conn, f"{uid}-q", arguments={"x-queue-type": "quorum"}, **flags)
    assert err.reply_code == 406
    assert err.reply_text.startswith(f"PRECONDITION_FAILED - invalid property '{prop}' for queue")


@pytest.mark.quorum
def test_quorum_queue_basic_flow(conn, connect, make_queue):
    q = make_queue(arguments={"x-queue-type": "quorum"}, durable=True)
    publish(connect(), q, "a", "b", "c")  # (against a cluster: published on another member than conn's)
    assert declare_ok(conn, q).message_count == 3
    got = Collector()
    ch = conn.channel()
    ch.basic_consume(q, got)
    assert pump(conn, lambda: len(got) == 3)
    assert got.bodies == bodies("a", "b", "c")
    ch.basic_ack(got.msgs[-1][0].delivery_tag, multiple=True)
    settle(conn, 0.1)
    assert declare_ok(conn, q).message_count == 0


@pytest.mark.quorum
def test_quorum_queue_refuses_a_consumer_under_global_qos_alone(connect, make_queue):
    """RabbitMQ 3.10 (probed, 3.10.8): basic.qos global=true and then a consume of a quorum queue without a
    prefetch of the consumer's own is a connection error, 540 NOT_IMPLEMENTED; with a per-consumer prefetch
    set after the global one, or a global prefetch of 0, the consume is accepted."""
    q = make_queue(arguments={"x-queue-type": "quorum"}, durable=True)
    refused = connect()
    ch = refused.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        ch.basic_consume(q, lambda *a: None)
        pump(refused, lambda: False, 2)  # nowait or not, the close comes
    assert e.value.reply_code == 540
    assert e.value.reply_text == f"NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support global qos"

    publish(connect(), q, "x")
    for steps in ((10, 5), (0, 5)):  # global, then the consumer's own prefetch
        accepted = connect()
        ch = accepted.channel()
        ch.basic_qos(prefetch_count=steps[0], global_qos=True)
        ch.basic_qos(prefetch_count=steps[1])
        got = Collector()
        ch.basic_consume(q, got)
        assert pump(accepted, lambda got=got: len(got) == 1)
        accepted.close()  # unacked: back to the queue for the next round


@pytest.mark.quorum
@pytest.mark.parametrize("flag", ["if_unused", "if_empty"])
def test_quorum_queue_refuses_a_conditional_delete(connect, make_queue, flag):
    """RabbitMQ 3.10 (probed, 3.10.8): queue.delete with if-unused or if-empty on a quorum queue is 540
    NOT_IMPLEMENTED, however empty or unused the queue is; the queue stays."""
    q = make_queue(arguments={"x-queue-type": "quorum"}, durable=True)
    conn = connect()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        conn.channel().queue_delete(q, **{flag: True})
    assert e.value.reply_code == 540
    assert e.value.reply_text == (f"NOT_IMPLEMENTED - cannot delete queue '{q}' in vhost '/'. queue.delete "
                                  f"operations with {flag.replace('_', '-')} flag set are not supported by "
                                  "quorum queues")
    assert declare_ok(connect(), q).message_count == 0  # still there


def _nack_every_delivery(conn, q: str, expected: int) -> Collector:
    """Consume with manual ack and nack(requeue=True) every delivery; wait for ``expected`` deliveries."""
    got = Collector()

    def on_message(ch, method, props, body):
        got(ch, method, props, body)
        ch.basic_nack(method.delivery_tag, requeue=True)

    ch = conn.channel()
    ch.basic_consume(q, on_message)
    assert pump(conn, lambda: len(got) >= expected), got.bodies
    settle(conn)
    return got


@pytest.mark.quorum
def test_quorum_redeliveries_carry_x_delivery_count(conn, connect, make_queue):
    q = make_queue(arguments={"x-queue-type": "quorum"}, durable=True)
    publish(connect(), q, "m", properties=pika.BasicProperties(headers={"app": 1}))
    got = Collector()
    seen = []

    def on_message(ch, method, props, body):
        got(ch, method, props, body)
        seen.append(dict(props.headers or {}))
        if len(got) < 4:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)

    conn.channel().basic_consume(q, on_message)
    assert pump(conn, lambda: len(got) == 4)
    assert "x-delivery-count" not in seen[0]  # a consumer's first delivery has no count
    assert [h["x-delivery-count"] for h in seen[1:]] == [1, 2, 3]
    assert all(is_long(h["x-delivery-count"]) for h in seen[1:])
    assert all(h["app"] == 1 for h in seen)
    assert [m[0].redelivered for m in got.msgs] == [False, True, True, True]


@pytest.mark.quorum
def test_quorum_delivery_limit_dead_letters_with_reason_delivery_limit(conn, connect, make_queue, make_exchange):
    dlx = make_exchange("dlx", "fanout")
    dlq = make_queue("dlq")
    conn.channel().queue_bind(dlq, dlx)
    q = make_queue(
        arguments={"x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": dlx},
        durable=True,
    )
    publish(connect(), q, "poison", properties=pika.BasicProperties(headers={"app": "x"}))
    got = _nack_every_delivery(conn, q, 3)
    # delivered limit + 1 times: the first, then redeliveries counted 1 and 2; returned a third time -> dead
    assert got.bodies == bodies("poison", "poison", "poison")
    counts = [(m[1].headers or {}).get("x-delivery-count") for m in got.msgs]
    assert counts == [None, 1, 2]
    ch = conn.channel()
    method, props, body = wait_get(ch, dlq)
    assert body == b"poison"
    assert (method.exchange, method.routing_key) == (dlx, q)
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"], death["exchange"], death["routing-keys"]) == (
        q,
        "delivery_limit",
        1,
        "",
        [q],
    )
    assert is_long(death["count"])
    assert props.headers["x-first-death-reason"] == "delivery_limit"
    assert props.headers["app"] == "x"
    assert declare_ok(conn, q).message_count == 0


def _get_and_reject(ch, q: str, times: int) -> list[int]:
    """``x-delivery-count`` of the head message, got and rejected (requeued) ``times`` times; it must be
    "poison" each time."""
    counts = []
    for _ in range(times):
        method, props, body = ch.basic_get(q)
        assert body == b"poison"
        # RabbitMQ 3.10 puts x-delivery-count: 0 on a first basic.get (not on a first consumer delivery)
        counts.append((props.headers or {}).get("x-delivery-count", 0))
        ch.basic_reject(method.delivery_tag, requeue=True)
    return counts


@pytest.mark.quorum
def test_quorum_delivery_limit_without_dlx_drops_message_via_get(conn, connect, make_queue):
    q = make_queue(arguments={"x-queue-type": "quorum", "x-delivery-limit": 2}, durable=True)
    publish(connect(), q, "poison", "ok")
    ch = conn.channel()
    assert _get_and_reject(ch, q, 3) == [0, 1, 2]
    _method, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"ok"  # "poison" is gone
    assert ch.basic_get(q)[0] is None
    assert declare_ok(conn, q).message_count == 0


@pytest.mark.quorum
@pytest.mark.parametrize("limit", [-1, -5])
def test_a_delivery_limit_below_zero_is_taken(conn, make_queue, limit):
    """RabbitMQ 3.10.8 takes any integer (RabbitMQ 4.0+ reads -1 as no limit); refusing it would break a
    declare written for RabbitMQ 4."""
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": limit}
    q = make_queue(arguments=arguments, durable=True)
    ch = conn.channel()
    assert ch.queue_declare(q, durable=True, arguments=arguments).method.message_count == 0  # and redeclared


@pytest.mark.quorum
@pytest.mark.leveret_only
def test_a_delivery_limit_below_zero_is_no_limit(conn, connect, make_queue):
    """RabbitMQ 4.0+'s meaning of ``x-delivery-limit: -1``: no limit (its default is 20). RabbitMQ 3.10.8, the
    reference node here, takes the value but drops the message at its first return, so this cannot run there."""
    q = make_queue(arguments={"x-queue-type": "quorum", "x-delivery-limit": -1}, durable=True)
    publish(connect(), q, "poison")
    assert _get_and_reject(conn.channel(), q, 6) == [0, 1, 2, 3, 4, 5]
    assert declare_ok(conn, q).message_count == 1


@pytest.mark.leveret_only
def test_classic_queue_delivery_limit(conn, make_queue, make_exchange):
    """Leveret extension: x-delivery-limit on a classic queue behaves as on a quorum queue. RabbitMQ 3.10 refuses
    the argument on a classic queue (406 "invalid arg 'x-delivery-limit' … of queue type rabbit_classic_queue"),
    and later versions honour it only on quorum queues, so this cannot run against RabbitMQ."""
    dlx = make_exchange("dlx", "fanout")
    dlq = make_queue("dlq")
    conn.channel().queue_bind(dlq, dlx)
    q = make_queue(arguments={"x-delivery-limit": 2, "x-dead-letter-exchange": dlx})
    publish(conn, q, "poison")
    got = _nack_every_delivery(conn, q, 3)
    assert got.bodies == bodies("poison", "poison", "poison")
    counts = [(m[1].headers or {}).get("x-delivery-count") for m in got.msgs]
    assert counts == [None, 1, 2]
    assert all(is_long(c) for c in counts[1:])
    assert [m[0].redelivered for m in got.msgs] == [False, True, True]
    _m, props, body = wait_get(conn.channel(), dlq)
    assert body == b"poison"
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (q, "delivery_limit", 1)
    assert declare_ok(conn, q).message_count == 0
