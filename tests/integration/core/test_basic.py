"""The ``basic`` class against a real broker, through pika's BlockingConnection.

Every behaviour here is what RabbitMQ 3.10 does (docs/decisions/rabbitmq-parity.md): get/get-ok counts, consumer tags,
exclusive consumers, ack/nack/reject, requeue order, recover, QoS, publish errors, round-robin and priority
delivery, and the round trip of properties, headers and bodies.

Errors are checked by reply code *and* by scope: a soft error closes the channel
(``ChannelClosedByBroker``, connection stays open), a hard error closes the connection
(``ConnectionClosedByBroker``).
"""

from __future__ import annotations

import datetime
import decimal
import os
from collections.abc import Callable

import pika
import pytest
from amqp_helpers import (
    SETTLE,
    Collector,
    expect_channel_error,
    expect_connection_error,
    get_all,
    publish,
    pump,
    ready_count,
    settle,
    wait_ready,
)
from pika import spec
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange, dl_setup
pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------------------------------


def bodies(*ns: int) -> list[bytes]:
    return [f"m{n}".encode() for n in ns]


# -- basic.get ------------------------------------------------------------------------------------------


def test_get_ok_message_count_is_ready_left_after_this_one(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(1, 2, 3))
    ch = conn.channel()
    seen = []
    for expected_left in (2, 1, 0):
        method, _props, body = ch.basic_get(q)  # manual ack: the taken ones stay unacked
        assert isinstance(method, spec.Basic.GetOk)
        assert method.message_count == expected_left
        seen.append(body)
    assert seen == bodies(1, 2, 3)
    # unacked messages are not "ready": declare-ok counts none left
    assert ready_count(conn, q) == 0


def test_get_ok_fields(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"hello")
    ch = conn.channel()
    method, _props, body = ch.basic_get(q)
    assert body == b"hello"
    assert method.delivery_tag == 1
    assert method.redelivered is False
    assert method.exchange == ""
    assert method.routing_key == q
    method, _props, body = ch.basic_get(q)
    assert method is None  # get-empty


def test_get_empty_on_empty_queue(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    replies = []
    ch._impl._rpc(
        spec.Basic.Get(queue=q),
        lambda frame: replies.append(frame.method),
        [spec.Basic.GetOk, spec.Basic.GetEmpty],
    )
    assert pump(conn, lambda: replies)
    assert isinstance(replies[0], spec.Basic.GetEmpty)
    assert ch.is_open
    ch._basic_getempty_result.reset()  # BlockingChannel latches get-empty; unlatch it
    assert ch.basic_get(q) == (None, None, None)


def test_get_on_missing_queue_is_404_channel_error(conn, uid):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_get(f"{uid}-missing")
    assert ei.value.reply_code == 404
    assert conn.is_open


def test_get_delivery_tags_increase_per_channel(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(1, 2, 3, 4))
    ch1, ch2 = conn.channel(), conn.channel()
    assert ch1.basic_get(q)[0].delivery_tag == 1
    assert ch2.basic_get(q)[0].delivery_tag == 1  # tags are per channel
    assert ch1.basic_get(q)[0].delivery_tag == 2
    assert ch2.basic_get(q)[0].delivery_tag == 2


def test_redelivered_false_then_true_after_requeue(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"once")
    ch = conn.channel()
    method, _p, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"once", False)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _p, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"once", True)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _p, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"once", True)
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get(q)[0] is None


def test_get_auto_ack_removes_message(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"x")
    ch = conn.channel()
    _m, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"x"
    ch.close()  # nothing is unacked, so nothing comes back
    assert wait_ready(conn, q, 0, timeout=SETTLE) == 0


# -- basic.consume / basic.cancel -----------------------------------------------------------------------


def _raw_consume(
    conn, ch, queue: str, tag: str = "", no_ack: bool = True, on_message: Callable | None = None
) -> str:
    """basic.consume sent as is (pika always invents a tag of its own when given none); returns the tag
    from consume-ok and, if ``on_message`` is given, routes that consumer's deliveries to it."""
    replies = []
    ch._impl._rpc(
        spec.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack),
        lambda frame: replies.append(frame.method),
        [spec.Basic.ConsumeOk],
    )
    assert pump(conn, lambda: replies or ch.is_closed)
    assert ch.is_open, ch._closing_reason
    tag = replies[0].consumer_tag
    ch._basic_consume_ok_result.reset()  # BlockingChannel latches every consume-ok; unlatch it
    if on_message is not None:
        ch._impl._consumers[tag] = on_message
    return tag


def test_consume_with_empty_tag_gets_generated_ctag(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    got = Collector()
    tag1 = _raw_consume(conn, ch, q, on_message=got)
    tag2 = _raw_consume(conn, ch, q, on_message=got)
    assert tag1.startswith("amq.ctag-") and len(tag1) > len("amq.ctag-")
    assert tag2.startswith("amq.ctag-")
    assert tag1 != tag2
    publish(conn, q, *bodies(1, 2))
    assert pump(conn, lambda: len(got) == 2)
    assert {m[0].consumer_tag for m in got.msgs} == {tag1, tag2}


def test_generated_ctags_differ_across_channels_and_connections(connect, make_queue):
    q = make_queue()
    tags = set()
    for _ in range(2):
        c = connect()
        for _ in range(2):
            tags.add(_raw_consume(c, c.channel(), q))
    assert len(tags) == 4
    assert all(t.startswith("amq.ctag-") for t in tags)


def test_consume_ok_echoes_client_tag(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    got = Collector()
    assert ch.basic_consume(q, got, consumer_tag="my-tag") == "my-tag"
    publish(conn, q, b"x")
    assert pump(conn, lambda: len(got) == 1)
    method = got.msgs[0][0]
    assert method.consumer_tag == "my-tag"
    assert method.delivery_tag == 1
    assert method.redelivered is False
    assert method.routing_key == q


def test_consume_missing_queue_is_404_channel_error(conn, uid):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(f"{uid}-missing", lambda *a: None)
    assert ei.value.reply_code == 404
    assert conn.is_open


def test_duplicate_consumer_tag_on_same_channel_is_530_connection_error(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.basic_consume(q, lambda *a: None, consumer_tag="dup")
    # pika refuses a duplicate tag client-side, so send the frame ourselves
    ch._impl._send_method(spec.Basic.Consume(queue=q, consumer_tag="dup"))
    err = expect_connection_error(conn)
    assert err.reply_code == 530
    assert "reuse consumer tag" in err.reply_text
    assert err.reply_text.startswith("NOT_ALLOWED")


def test_same_consumer_tag_on_other_channel_is_fine(conn, make_queue):
    q = make_queue()
    ch1, ch2 = conn.channel(), conn.channel()
    got1, got2 = Collector(), Collector()
    assert ch1.basic_consume(q, got1, consumer_tag="shared") == "shared"
    assert ch2.basic_consume(q, got2, consumer_tag="shared") == "shared"
    publish(conn, q, *bodies(1, 2))
    assert pump(conn, lambda: len(got1) + len(got2) == 2)
    assert len(got1) == 1 and len(got2) == 1  # both consumers are live (round-robin)
    assert {m[0].consumer_tag for m in got1.msgs + got2.msgs} == {"shared"}
    assert ch1.is_open and ch2.is_open


def _raw_cancel(conn, ch, tag: str):
    replies = []
    ch._impl._rpc(
        spec.Basic.Cancel(consumer_tag=tag), lambda frame: replies.append(frame.method), [spec.Basic.CancelOk]
    )
    assert pump(conn, lambda: replies or ch.is_closed)
    assert ch.is_open, ch._closing_reason
    return replies[0]


def test_cancel_unknown_tag_gets_cancel_ok(conn):
    ch = conn.channel()
    reply = _raw_cancel(conn, ch, "no-such-consumer")
    assert isinstance(reply, spec.Basic.CancelOk)
    assert reply.consumer_tag == "no-such-consumer"
    ch.basic_qos(prefetch_count=1)  # the channel still works


def test_cancel_twice_gets_cancel_ok(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)
    reply = _raw_cancel(conn, ch, tag)
    assert reply.consumer_tag == tag


def test_cancel_stops_deliveries(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    got = Collector()
    tag = ch.basic_consume(q, got, auto_ack=True)
    publish(conn, q, b"before")
    assert pump(conn, lambda: len(got) == 1)
    ch.basic_cancel(tag)
    publish(conn, q, b"after")
    settle(conn)
    assert got.bodies == [b"before"]
    assert ready_count(conn, q) == 1


def test_exclusive_consumer_while_another_exists_is_403(conn, make_queue):
    q = make_queue()
    conn.channel().basic_consume(q, lambda *a: None)
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(q, lambda *a: None, exclusive=True)
    assert ei.value.reply_code == 403
    assert "exclusive use" in ei.value.reply_text
    assert conn.is_open


def test_consumer_while_exclusive_consumer_exists_is_403(connect, make_queue):
    q = make_queue()
    owner = connect()
    owner.channel().basic_consume(q, lambda *a: None, exclusive=True)
    other = connect()
    ch = other.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(q, lambda *a: None)
    assert ei.value.reply_code == 403
    assert ei.value.reply_text.startswith("ACCESS_REFUSED")
    assert other.is_open
    # a second exclusive consumer, even on the owner's connection, is refused too
    ch = owner.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(q, lambda *a: None, exclusive=True)
    assert ei.value.reply_code == 403


def test_exclusive_consumer_gone_allows_new_consumers(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    tag = ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch.basic_cancel(tag)
    ch2 = conn.channel()
    assert ch2.basic_consume(q, lambda *a: None, exclusive=True) == ch2.consumer_tags[0]
    assert ch2.is_open


# -- ack / nack / reject --------------------------------------------------------------------------------


def _take(conn, make_queue, n: int):
    """A queue holding m1..mn, all taken unacked by basic.get on a fresh channel."""
    q = make_queue()
    publish(conn, q, *bodies(*range(1, n + 1)))
    ch = conn.channel()
    got = get_all(ch, q, auto_ack=False)
    assert [g[2] for g in got] == bodies(*range(1, n + 1))
    assert [g[0].delivery_tag for g in got] == list(range(1, n + 1))
    return q, ch


def _left_after_close(conn, ch, q, expected: list[bytes]) -> None:
    """Close ``ch`` (requeueing whatever it still holds) and check exactly ``expected`` is in the queue."""
    ch.close()
    assert wait_ready(conn, q, len(expected)) == len(expected)
    ch2 = conn.channel()
    assert [g[2] for g in get_all(ch2, q, auto_ack=False)] == expected
    ch2.close()


def test_ack_single(conn, make_queue):
    q, ch = _take(conn, make_queue, 3)
    ch.basic_ack(2)
    _left_after_close(conn, ch, q, bodies(1, 3))


def test_ack_multiple(conn, make_queue):
    q, ch = _take(conn, make_queue, 5)
    ch.basic_ack(3, multiple=True)
    _left_after_close(conn, ch, q, bodies(4, 5))


def test_ack_multiple_with_tag_zero_acks_everything(conn, make_queue):
    q, ch = _take(conn, make_queue, 4)
    ch.basic_ack(0, multiple=True)
    ch.basic_qos(prefetch_count=0)  # a round trip: the ack caused no error
    assert ch.is_open
    _left_after_close(conn, ch, q, [])


def test_nack_multiple_with_tag_zero_requeues_everything(conn, make_queue):
    q, ch = _take(conn, make_queue, 3)
    ch.basic_nack(0, multiple=True, requeue=True)
    assert wait_ready(conn, q, 3) == 3
    got = get_all(ch, q, auto_ack=False)
    assert [g[2] for g in got] == bodies(1, 2, 3)
    assert all(g[0].redelivered for g in got)


def test_nack_single_requeue(conn, make_queue):
    q, ch = _take(conn, make_queue, 3)
    ch.basic_nack(2, multiple=False, requeue=True)
    assert wait_ready(conn, q, 1) == 1
    method, _p, body = ch.basic_get(q)
    assert (body, method.redelivered, method.delivery_tag) == (b"m2", True, 4)
    ch.basic_ack(0, multiple=True)
    _left_after_close(conn, ch, q, [])


def test_nack_multiple_requeue(conn, make_queue):
    q, ch = _take(conn, make_queue, 4)
    ch.basic_nack(3, multiple=True, requeue=True)
    assert wait_ready(conn, q, 3) == 3
    got = get_all(ch, q, auto_ack=False)
    assert [g[2] for g in got] == bodies(1, 2, 3)
    ch.basic_ack(0, multiple=True)
    _left_after_close(conn, ch, q, [])


def test_nack_multiple_without_requeue_discards(conn, make_queue):
    q, ch = _take(conn, make_queue, 4)
    ch.basic_nack(2, multiple=True, requeue=False)
    _left_after_close(conn, ch, q, bodies(3, 4))


def test_reject_requeue_false_discards(conn, make_queue):
    q, ch = _take(conn, make_queue, 2)
    ch.basic_reject(1, requeue=False)
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0
    _left_after_close(conn, ch, q, bodies(2))


def test_reject_requeue_true(conn, make_queue):
    q, ch = _take(conn, make_queue, 2)
    ch.basic_reject(1, requeue=True)
    assert wait_ready(conn, q, 1) == 1
    method, _p, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"m1", True)


@pytest.mark.parametrize("how", ["ack", "nack", "reject"])
def test_unknown_delivery_tag_is_406_channel_error(conn, make_queue, how):
    _q, ch = _take(conn, make_queue, 1)
    if how == "ack":
        ch.basic_ack(99)
    elif how == "nack":
        ch.basic_nack(99)
    else:
        ch.basic_reject(99)
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406
    assert err.reply_text == "PRECONDITION_FAILED - unknown delivery tag 99"


def test_ack_with_nothing_delivered_is_406(conn):
    ch = conn.channel()
    ch.basic_ack(1)
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406


def test_double_ack_is_406_channel_error(conn, make_queue):
    _q, ch = _take(conn, make_queue, 2)
    ch.basic_ack(1)
    ch.basic_ack(1)
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406
    assert err.reply_text == "PRECONDITION_FAILED - unknown delivery tag 1"


def test_ack_after_multiple_ack_covered_it_is_406(conn, make_queue):
    _q, ch = _take(conn, make_queue, 3)
    ch.basic_ack(2, multiple=True)
    ch.basic_ack(1)
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406


def test_ack_of_tag_from_another_channel_is_406(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"x")
    ch1, ch2 = conn.channel(), conn.channel()
    assert ch1.basic_get(q)[0].delivery_tag == 1
    ch2.basic_ack(1)  # ch2 never delivered tag 1
    err = expect_channel_error(conn, ch2)
    assert err.reply_code == 406
    assert ch1.is_open
    ch1.basic_ack(1)
    ch1.basic_qos(prefetch_count=0)  # round trip: ch1's ack was fine
    assert ch1.is_open


def test_ack_of_auto_ack_delivery_is_406(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"x")
    ch = conn.channel()
    method, _p, _b = ch.basic_get(q, auto_ack=True)
    ch.basic_ack(method.delivery_tag)
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406


# -- requeue order --------------------------------------------------------------------------------------


def test_requeued_messages_return_in_original_order_ahead_of_newer(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    got = Collector()
    tag = ch.basic_consume(q, got)
    publish(conn, q, *bodies(1, 2, 3, 4, 5, 6, 7))
    assert pump(conn, lambda: len(got) == 5)
    settle(conn, 0.1)
    assert got.bodies == bodies(1, 2, 3, 4, 5)
    ch.basic_cancel(tag)  # keeps the 5 unacked on the channel
    assert ready_count(conn, q) == 2
    tag_of = {body: t for body, t in zip(got.bodies, got.tags)}
    # requeue out of order, with both nack and reject
    ch.basic_nack(tag_of[b"m4"], requeue=True)
    ch.basic_reject(tag_of[b"m2"], requeue=True)
    ch.basic_nack(tag_of[b"m3"], requeue=True)
    ch.basic_ack(tag_of[b"m1"])
    ch.basic_ack(tag_of[b"m5"])
    assert wait_ready(conn, q, 5) == 5
    ch2 = conn.channel()
    again = get_all(ch2, q, auto_ack=False)
    assert [g[2] for g in again] == bodies(2, 3, 4, 6, 7)
    assert [g[0].redelivered for g in again] == [True, True, True, False, False]


def test_requeued_messages_go_to_waiting_consumer_in_original_order(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    got = Collector()
    tag = ch.basic_consume(q, got)
    publish(conn, q, *bodies(1, 2, 3, 4, 5))
    assert pump(conn, lambda: len(got) == 5)
    ch.basic_cancel(tag)
    ch.basic_reject(got.tags[4], requeue=True)
    ch.basic_reject(got.tags[1], requeue=True)
    ch.basic_nack(got.tags[3], requeue=True)
    ch.basic_nack(got.tags[0], requeue=True)
    ch.basic_ack(got.tags[2])
    assert wait_ready(conn, q, 4) == 4
    publish(conn, q, b"m6")
    ch2 = conn.channel()
    got2 = Collector()
    ch2.basic_consume(q, got2, auto_ack=True)
    assert pump(conn, lambda: len(got2) == 5)
    assert got2.bodies == bodies(1, 2, 4, 5, 6)
    assert got2.redelivered == [True, True, True, True, False]


# -- basic.recover --------------------------------------------------------------------------------------


def test_recover_requeue_true_redelivers_all_unacked(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    got = Collector()
    ch.basic_consume(q, got)
    publish(conn, q, *bodies(1, 2, 3))
    assert pump(conn, lambda: len(got) == 3)
    ch.basic_ack(got.tags[1])  # m2 is acked and must not come back
    ch.basic_recover(requeue=True)
    assert pump(conn, lambda: len(got) == 5)
    settle(conn, 0.1)
    assert got.bodies == bodies(1, 2, 3, 1, 3)
    assert got.redelivered == [False, False, False, True, True]
    assert got.tags[3:] == [4, 5]  # new deliveries get new tags
    ch.basic_ack(5, multiple=True)
    _left_after_close(conn, ch, q, [])


def test_recover_requeue_true_with_basic_get(conn, make_queue):
    q, ch = _take(conn, make_queue, 2)
    ch.basic_recover(requeue=True)
    assert wait_ready(conn, q, 2) == 2
    again = get_all(ch, q, auto_ack=False)
    assert [g[2] for g in again] == bodies(1, 2)
    assert all(g[0].redelivered for g in again)


def test_recover_requeue_false_is_540_connection_error(conn, make_queue):
    _q, ch = _take(conn, make_queue, 1)
    with pytest.raises(ConnectionClosedByBroker) as ei:
        ch.basic_recover(requeue=False)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text == "NOT_IMPLEMENTED - requeue=false"
    assert conn.is_closed


def test_recover_async_requeue_false_is_540_connection_error(conn):
    ch = conn.channel()
    ch._impl._send_method(spec.Basic.RecoverAsync(requeue=False))
    err = expect_connection_error(conn)
    assert err.reply_code == 540


# -- requeue on channel / connection close --------------------------------------------------------------


def test_unacked_requeued_when_channel_closes(connect, make_queue):
    q = make_queue()
    c1 = connect()
    ch = c1.channel()
    got = Collector()
    ch.basic_consume(q, got)
    publish(c1, q, *bodies(1, 2, 3))
    assert pump(c1, lambda: len(got) == 3)
    ch.basic_ack(got.tags[0])
    ch.close()
    c2 = connect()
    assert wait_ready(c2, q, 2) == 2
    again = get_all(c2.channel(), q, auto_ack=False)
    assert [g[2] for g in again] == bodies(2, 3)
    assert all(g[0].redelivered for g in again)


def test_unacked_requeued_when_connection_closes(connect, make_queue):
    q = make_queue()
    c1 = connect()
    ch = c1.channel()
    got = Collector()
    ch.basic_consume(q, got)
    publish(c1, q, *bodies(1, 2, 3))
    assert pump(c1, lambda: len(got) == 3)
    c2 = connect()
    c1.close()
    publish(c2, q, b"m4")
    assert wait_ready(c2, q, 4) == 4
    again = get_all(c2.channel(), q, auto_ack=False)
    assert [g[2] for g in again] == bodies(1, 2, 3, 4)
    assert [g[0].redelivered for g in again] == [True, True, True, False]


def test_unacked_basic_get_requeued_when_connection_closes(connect, make_queue):
    q = make_queue()
    c1 = connect()
    publish(c1, q, *bodies(1, 2))
    ch = c1.channel()
    assert ch.basic_get(q)[2] == b"m1"
    c1.close()
    c2 = connect()
    assert wait_ready(c2, q, 2) == 2
    again = get_all(c2.channel(), q, auto_ack=False)
    assert [g[2] for g in again] == bodies(1, 2)
    assert [g[0].redelivered for g in again] == [True, False]


def test_auto_ack_deliveries_not_requeued_on_close(connect, make_queue):
    q = make_queue()
    c1 = connect()
    ch = c1.channel()
    got = Collector()
    ch.basic_consume(q, got, auto_ack=True)
    publish(c1, q, *bodies(1, 2))
    assert pump(c1, lambda: len(got) == 2)
    c1.close()
    c2 = connect()
    assert wait_ready(c2, q, 0, timeout=SETTLE) == 0


# -- basic.qos ------------------------------------------------------------------------------------------


def test_qos_per_consumer_limits_each_consumer(conn, make_queue):
    qa, qb = make_queue("a"), make_queue("b")
    publish(conn, qa, *bodies(*range(10)))
    publish(conn, qb, *bodies(*range(10)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2, global_qos=False)
    a, b = Collector(), Collector()
    ch.basic_consume(qa, a)
    ch.basic_consume(qb, b)
    assert pump(conn, lambda: len(a) == 2 and len(b) == 2)
    settle(conn)
    assert (len(a), len(b)) == (2, 2)  # each consumer has its own limit of 2
    ch.basic_ack(a.tags[0])
    assert pump(conn, lambda: len(a) == 3)
    settle(conn)
    assert (len(a), len(b)) == (3, 2)


def test_qos_per_consumer_two_consumers_same_queue(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(*range(10)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    a, b = Collector(), Collector()
    ch.basic_consume(q, a)
    ch.basic_consume(q, b)
    assert pump(conn, lambda: len(a) + len(b) == 4)
    settle(conn)
    assert (len(a), len(b)) == (2, 2)
    assert ready_count(conn, q) == 6


def test_qos_global_is_shared_by_channel(conn, make_queue):
    qa, qb = make_queue("a"), make_queue("b")
    publish(conn, qa, *bodies(*range(10)))
    publish(conn, qb, *bodies(*range(10)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)
    a, b = Collector(), Collector()
    ch.basic_consume(qa, a)
    ch.basic_consume(qb, b)
    assert pump(conn, lambda: len(a) + len(b) == 3)
    settle(conn)
    assert len(a) + len(b) == 3
    # one ack frees exactly one slot on the channel
    ch.basic_ack((a.msgs + b.msgs)[0][0].delivery_tag)
    assert pump(conn, lambda: len(a) + len(b) == 4)
    settle(conn)
    assert len(a) + len(b) == 4


def test_qos_global_does_not_limit_other_channels(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(*range(6)))
    ch1, ch2 = conn.channel(), conn.channel()
    ch1.basic_qos(prefetch_count=1, global_qos=True)
    ch2.basic_qos(prefetch_count=2, global_qos=True)
    a, b = Collector(), Collector()
    ch1.basic_consume(q, a)
    ch2.basic_consume(q, b)
    assert pump(conn, lambda: len(a) + len(b) == 3)
    settle(conn)
    assert (len(a), len(b)) == (1, 2)


def test_qos_per_consumer_and_global_together(conn, make_queue):
    qs = [make_queue(s) for s in "abc"]
    for q in qs:
        publish(conn, q, *bodies(*range(10)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2, global_qos=False)
    ch.basic_qos(prefetch_count=5, global_qos=True)
    cs = [Collector() for _ in qs]
    for q, c in zip(qs, cs):
        ch.basic_consume(q, c)
    assert pump(conn, lambda: sum(map(len, cs)) == 5)
    settle(conn)
    counts = sorted(len(c) for c in cs)
    assert sum(counts) == 5  # the channel limit
    assert max(counts) <= 2  # and each consumer's limit
    assert counts == [1, 2, 2]


def test_qos_global_smaller_than_per_consumer(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(*range(10)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5, global_qos=False)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    got = Collector()
    ch.basic_consume(q, got)
    assert pump(conn, lambda: len(got) == 2)
    settle(conn)
    assert len(got) == 2


def test_qos_after_consumer_exists_does_not_change_it(conn, make_queue):
    qa, qb = make_queue("a"), make_queue("b")
    publish(conn, qa, *bodies(*range(10)))
    publish(conn, qb, *bodies(*range(10)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    a, b = Collector(), Collector()
    ch.basic_consume(qa, a)
    assert pump(conn, lambda: len(a) == 1)
    ch.basic_qos(prefetch_count=3)  # only for consumers created from now on
    ch.basic_consume(qb, b)
    assert pump(conn, lambda: len(b) == 3)
    settle(conn)
    assert (len(a), len(b)) == (1, 3)
    ch.basic_ack(a.tags[0])  # a keeps its limit of 1 after an ack too
    assert pump(conn, lambda: len(a) == 2)
    settle(conn)
    assert (len(a), len(b)) == (2, 3)


def test_qos_prefetch_zero_means_no_limit(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(*range(20)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    ch.basic_qos(prefetch_count=0)
    got = Collector()
    ch.basic_consume(q, got)
    assert pump(conn, lambda: len(got) == 20)
    assert ready_count(conn, q) == 0


def test_qos_global_zero_removes_channel_limit(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(*range(8)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1, global_qos=True)
    ch.basic_qos(prefetch_count=0, global_qos=True)
    got = Collector()
    ch.basic_consume(q, got)
    assert pump(conn, lambda: len(got) == 8)


def test_qos_prefetch_size_nonzero_is_540_connection_error(conn):
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as ei:
        ch.basic_qos(prefetch_size=1024)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text == "NOT_IMPLEMENTED - prefetch_size!=0 (1024)"
    assert conn.is_closed


def test_qos_does_not_limit_auto_ack_consumers(conn, make_queue):
    q = make_queue()
    publish(conn, q, *bodies(*range(10)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    got = Collector()
    ch.basic_consume(q, got, auto_ack=True)
    assert pump(conn, lambda: len(got) == 10)


# -- basic.publish errors -------------------------------------------------------------------------------


def test_publish_to_missing_exchange_is_404_channel_error(conn, uid):
    ch = conn.channel()
    ch.basic_publish(f"{uid}-nope", "rk", b"x")
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 404
    assert err.reply_text == f"NOT_FOUND - no exchange '{uid}-nope' in vhost '/'"


def test_publish_immediate_is_540_connection_error(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    # pika's basic_publish has no `immediate`; send the method frame with its content ourselves
    ch._impl._send_method(
        spec.Basic.Publish(exchange="", routing_key=q, immediate=True), (pika.BasicProperties(), b"x")
    )
    err = expect_connection_error(conn)
    assert err.reply_code == 540
    assert err.reply_text == "NOT_IMPLEMENTED - immediate=true"


def test_publish_unroutable_without_mandatory_is_dropped_silently(conn, uid):
    ch = conn.channel()
    ch.basic_publish("", f"{uid}-no-such-queue", b"x")
    ch.basic_publish("amq.direct", f"{uid}-no-binding", b"x")
    ch.basic_qos(prefetch_count=0)  # round trip
    assert ch.is_open


# -- distribution across consumers ----------------------------------------------------------------------


def test_round_robin_across_consumers(connect, make_queue):
    q = make_queue()
    c = connect()
    a, b = Collector(), Collector()
    c.channel().basic_consume(q, a, auto_ack=True)
    c.channel().basic_consume(q, b, auto_ack=True)
    publish(c, q, *bodies(*range(1, 9)))
    assert pump(c, lambda: len(a) + len(b) == 8)
    odd, even = bodies(1, 3, 5, 7), bodies(2, 4, 6, 8)
    assert sorted([a.bodies, b.bodies]) == sorted([odd, even])


def test_round_robin_three_consumers_same_channel(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    cs = [Collector() for _ in range(3)]
    for c in cs:
        ch.basic_consume(q, c, auto_ack=True)
    publish(conn, q, *bodies(*range(9)))
    assert pump(conn, lambda: sum(map(len, cs)) == 9)
    assert [len(c) for c in cs] == [3, 3, 3]


def test_priority_consumer_gets_everything_while_it_has_room(conn, make_queue):
    q = make_queue()
    low, high = Collector(), Collector()
    conn.channel().basic_consume(q, low, auto_ack=True)
    conn.channel().basic_consume(q, high, auto_ack=True, arguments={"x-priority": 10})
    publish(conn, q, *bodies(*range(6)))
    assert pump(conn, lambda: len(high) == 6)
    settle(conn, 0.1)
    assert len(low) == 0


def test_priority_consumer_overflow_goes_to_lower_priority(conn, make_queue):
    q = make_queue()
    low, high = Collector(), Collector()
    ch_low, ch_high = conn.channel(), conn.channel()
    ch_low.basic_consume(q, low)
    ch_high.basic_qos(prefetch_count=2)
    ch_high.basic_consume(q, high, arguments={"x-priority": 5})
    publish(conn, q, *bodies(1, 2, 3, 4, 5, 6))
    assert pump(conn, lambda: len(low) + len(high) == 6)
    assert high.bodies == bodies(1, 2)
    assert low.bodies == bodies(3, 4, 5, 6)
    # once it has room again, the high-priority consumer is served first
    ch_high.basic_ack(high.tags[1], multiple=True)
    publish(conn, q, *bodies(7, 8, 9))
    assert pump(conn, lambda: len(low) + len(high) == 9)
    assert high.bodies == bodies(1, 2, 7, 8)
    assert low.bodies == bodies(3, 4, 5, 6, 9)


def test_negative_priority_consumer_is_served_last(conn, make_queue):
    q = make_queue()
    neg, normal = Collector(), Collector()
    conn.channel().basic_consume(q, neg, auto_ack=True, arguments={"x-priority": -1})
    conn.channel().basic_consume(q, normal, auto_ack=True)
    publish(conn, q, *bodies(*range(4)))
    assert pump(conn, lambda: len(normal) == 4)
    settle(conn, 0.1)
    assert len(neg) == 0


# -- properties, headers, bodies ------------------------------------------------------------------------

HEADERS = {
    "str": "text",
    "unicode": "żółw ☃ 🐇",
    "empty-str": "",
    "int": 42,
    "negative": -7,
    "int64": 2**40,
    "int64-negative": -(2**40),
    "true": True,
    "false": False,
    "void": None,
    "decimal": decimal.Decimal("3.14"),
    "decimal-negative": decimal.Decimal("-12.345"),
    "decimal-integer": decimal.Decimal(7),
    "timestamp": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
    "bytes": b"\x00\x01\xfe\xffraw",
    "array": [1, "two", [3, [4]], {"k": "v"}, None, True, b"\x00", decimal.Decimal("0.5")],
    "empty-array": [],
    "empty-table": {},
    "nested": {
        "a": {
            "b": {
                "c": [
                    1,
                    {"d": decimal.Decimal("0.25"), "e": datetime.datetime(1999, 1, 1, tzinfo=datetime.UTC)},
                ]
            }
        }
    },
}


def assert_same_types(actual, expected, path="headers") -> None:
    """``==`` says 1 == True and 1 == Decimal(1); check the kinds too, recursively."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        assert type(actual) is bool and type(expected) is bool, path
    else:
        assert isinstance(actual, type(expected)), (path, type(actual), type(expected))
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), path
        for k in expected:
            assert_same_types(actual[k], expected[k], f"{path}.{k}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_types(a, e, f"{path}[{i}]")


def test_all_properties_round_trip(conn, make_queue, broker):
    q = make_queue()
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=HEADERS,
        delivery_mode=2,
        priority=7,
        correlation_id="corr-1",
        reply_to="some-reply-queue",
        expiration="600000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="my.type",
        user_id=broker.user,
        app_id="leveret-tests",
        cluster_id="cluster-x",
    )
    publish(conn, q, b'{"a": 1}', b'{"a": 1}', properties=props)
    received = [conn.channel().basic_get(q, auto_ack=True)]
    got = Collector()
    conn.channel().basic_consume(q, got, auto_ack=True)
    assert pump(conn, lambda: len(got) == 1)
    received.append(got.msgs[0])
    for _m, p, body in received:
        assert body == b'{"a": 1}'
        assert p.content_type == "application/json"
        assert p.content_encoding == "gzip"
        assert p.delivery_mode == 2
        assert p.priority == 7
        assert p.correlation_id == "corr-1"
        assert p.reply_to == "some-reply-queue"
        assert p.expiration == "600000"
        assert p.message_id == "msg-1"
        assert p.timestamp == 1_700_000_000
        assert p.type == "my.type"
        assert p.user_id == broker.user
        assert p.app_id == "leveret-tests"
        assert p.cluster_id == "cluster-x"
        assert p.headers == HEADERS
        assert_same_types(p.headers, HEADERS)


def test_absent_properties_stay_absent(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"bare")
    _m, p, body = conn.channel().basic_get(q, auto_ack=True)
    assert body == b"bare"
    for name in (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    ):
        assert getattr(p, name) is None, name


def test_empty_headers_table_round_trips(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"x", properties=pika.BasicProperties(headers={}))
    _m, p, _b = conn.channel().basic_get(q, auto_ack=True)
    assert p.headers == {}


def test_user_id_other_than_login_is_406(conn, make_queue, broker):
    q = make_queue()
    ch = conn.channel()
    ch.basic_publish("", q, b"x", pika.BasicProperties(user_id=broker.user + "-not-me"))
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406


def test_empty_body_round_trips(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"", properties=pika.BasicProperties(content_type="text/plain"))
    got = Collector()
    conn.channel().basic_consume(q, got, auto_ack=True)
    assert pump(conn, lambda: len(got) == 1)
    assert got.msgs[0][2] == b""
    assert got.msgs[0][1].content_type == "text/plain"


def test_empty_body_round_trips_via_get(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"", b"after")
    ch = conn.channel()
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"" and method.message_count == 1
    assert ch.basic_get(q, auto_ack=True)[2] == b"after"


@pytest.mark.parametrize("size", ["frame-1", "frame", "frame+1", "3frames+5", "1MiB"])
def test_large_bodies_round_trip(conn, make_queue, size):
    q = make_queue()
    chunk = conn._impl.params.frame_max - 8  # body bytes that fit one body frame
    n = {
        "frame-1": chunk - 1,
        "frame": chunk,
        "frame+1": chunk + 1,
        "3frames+5": 3 * chunk + 5,
        "1MiB": 1 << 20,
    }[size]
    body = os.urandom(n)
    publish(conn, q, body, b"next")
    got = Collector()
    conn.channel().basic_consume(q, got, auto_ack=True)
    assert pump(conn, lambda: len(got) == 2, timeout=10)
    assert len(got.msgs[0][2]) == n
    assert got.msgs[0][2] == body
    assert got.msgs[1][2] == b"next"


def test_one_mebibyte_body_via_get(conn, make_queue):
    q = make_queue()
    body = os.urandom(1 << 20)
    publish(conn, q, body)
    _m, _p, got = conn.channel().basic_get(q, auto_ack=True)
    assert got == body
