"""Queue length limits: ``x-max-length``, ``x-max-length-bytes`` and ``x-overflow``, as RabbitMQ 3.10 applies them.

As RabbitMQ 3.10.8 does it:

* only ready messages count (unacked ones do not); bytes = the sum of the bodies;
* ``drop-head`` (the default) drops the oldest ready messages — dead-lettered with reason ``maxlen`` when the
  queue has a DLX. A requeued message goes back to the head, so requeueing into a full queue drops it (or
  another head message) again;
* ``reject-publish`` refuses the overflowing message: a publisher in confirm mode gets ``basic.nack``
  (pika: ``NackError``), one without confirms gets nothing at all; a message routed to several queues is
  nacked if any of them refused it, and the others keep their copy;
* ``reject-publish-dlx`` does the same and dead-letters the refused message (reason ``maxlen``);
* a bad value is ``406 PRECONDITION_FAILED - invalid arg 'x-max-length' …``.
"""

from __future__ import annotations

import pika
import pytest
from amqp_helpers import get_all, publish, ready_count, settle, wait_ready
from pika.exceptions import ChannelClosedByBroker, NackError

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange, dl_setup
pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------------------------------


def confirmed(ch, exchange: str, routing_key: str, body: bytes) -> bool:
    """Publish on a confirm-mode BlockingChannel: True for basic.ack, False for basic.nack."""
    try:
        ch.basic_publish(exchange, routing_key, body)
    except NackError:
        return False
    return True


def bodies_of(ch, queue: str) -> list[bytes]:
    return [m[2] for m in get_all(ch, queue)]


# -- drop-head ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overflow", [None, "drop-head"], ids=["default", "explicit"])
def test_max_length_drops_oldest(conn, make_queue, overflow):
    args = {"x-max-length": 3}
    if overflow:
        args["x-overflow"] = overflow
    q = make_queue(arguments=args)
    publish(conn, q, *(f"m{i}" for i in range(1, 6)))
    assert ready_count(conn, q) == 3
    assert bodies_of(conn.channel(), q) == [b"m3", b"m4", b"m5"]


def test_max_length_dropped_messages_are_dead_lettered_as_maxlen(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-max-length": 2, "x-dead-letter-exchange": dlx})
    publish(conn, q, "m1", "m2", "m3", "m4")
    assert wait_ready(conn, dlq, 2) == 2
    ch = conn.channel()
    dead = get_all(ch, dlq)
    assert [m[2] for m in dead] == [b"m1", b"m2"]
    for method, props, _b in dead:
        assert (method.exchange, method.routing_key) == (dlx, q)
        (death,) = props.headers["x-death"]
        assert (
            death["queue"],
            death["reason"],
            death["count"],
            death["exchange"],
            death["routing-keys"],
        ) == (q, "maxlen", 1, "", [q])
        assert props.headers["x-first-death-reason"] == "maxlen"
    assert bodies_of(ch, q) == [b"m3", b"m4"]


def test_max_length_zero_keeps_nothing(conn, make_queue):
    q = make_queue(arguments={"x-max-length": 0})
    publish(conn, q, "a", "b")
    assert ready_count(conn, q) == 0
    assert conn.channel().basic_get(q)[0] is None


def test_max_length_bytes_counts_body_bytes(conn, make_queue):
    q = make_queue(arguments={"x-max-length-bytes": 10})
    publish(conn, q, b"aaaa", b"bbbb", b"cccc")  # 12 bytes: the head goes
    assert ready_count(conn, q) == 2
    ch = conn.channel()
    assert bodies_of(ch, q) == [b"bbbb", b"cccc"]
    # headers and properties do not count: a big header table fits as long as the body does
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x" * 10, pika.BasicProperties(headers={"h": "y" * 500}, message_id="id" * 50))
    assert bodies_of(ch, q) == [b"x" * 10]


def test_message_larger_than_max_length_bytes_is_dropped(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-max-length-bytes": 10, "x-dead-letter-exchange": dlx})
    publish(conn, q, b"small", b"z" * 11)
    assert wait_ready(conn, dlq, 2) == 2  # the head and then the big one itself
    ch = conn.channel()
    assert bodies_of(ch, dlq) == [b"small", b"z" * 11]
    assert ready_count(conn, q) == 0


def test_max_length_counts_only_ready_messages(conn, make_queue):
    q = make_queue(arguments={"x-max-length": 1})
    publish(conn, q, "u1")
    ch = conn.channel()
    method, _p, body = ch.basic_get(q)  # u1 now unacked: it does not count
    assert body == b"u1"
    publish(conn, q, "u2")
    assert ready_count(conn, q) == 1
    ch.basic_ack(method.delivery_tag)
    publish(conn, q, "u3")  # u2 is the head now and goes
    assert bodies_of(ch, q) == [b"u3"]


def test_max_length_bytes_counts_only_ready_messages(conn, make_queue):
    q = make_queue(arguments={"x-max-length-bytes": 5})
    publish(conn, q, b"12345")
    ch = conn.channel()
    method, _p, _b = ch.basic_get(q)
    publish(conn, q, b"abcde")
    assert ready_count(conn, q) == 1
    ch.basic_ack(method.delivery_tag)
    assert bodies_of(ch, q) == [b"abcde"]


def test_requeue_into_full_queue_drops_the_head(conn, make_queue, dl_setup):
    """The requeued message returns to the head (its original place), so with the queue over its limit it is
    the one dropped (and dead-lettered as maxlen)."""
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-max-length": 1, "x-dead-letter-exchange": dlx})
    publish(conn, q, "u1")
    ch = conn.channel()
    method, _p, _b = ch.basic_get(q)
    publish(conn, q, "u2")
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert wait_ready(conn, dlq, 1) == 1
    _m, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"u1"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert bodies_of(ch, q) == [b"u2"]


# -- reject-publish ----------------------------------------------------------------------------------------


def test_reject_publish_nacks_overflow_in_confirm_mode(conn, make_queue):
    q = make_queue(arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch = conn.channel()
    ch.confirm_delivery()
    assert [confirmed(ch, "", q, f"m{i}".encode()) for i in range(1, 5)] == [True, True, False, False]
    assert ch.is_open
    assert ready_count(conn, q) == 2
    # the queue keeps the oldest; once there is room, publishes are accepted again
    assert ch.basic_get(q, auto_ack=True)[2] == b"m1"
    assert confirmed(ch, "", q, b"m5")
    assert bodies_of(ch, q) == [b"m2", b"m5"]


def test_reject_publish_with_max_length_bytes(conn, make_queue):
    q = make_queue(arguments={"x-max-length-bytes": 8, "x-overflow": "reject-publish"})
    ch = conn.channel()
    ch.confirm_delivery()
    assert confirmed(ch, "", q, b"1234")
    assert confirmed(ch, "", q, b"5678")
    assert not confirmed(ch, "", q, b"9")
    assert bodies_of(ch, q) == [b"1234", b"5678"]


def test_reject_publish_counts_only_ready_messages(conn, make_queue):
    q = make_queue(arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch = conn.channel()
    ch.confirm_delivery()
    assert confirmed(ch, "", q, b"a")
    method, _p, _b = ch.basic_get(q)  # now unacked
    assert confirmed(ch, "", q, b"b")
    assert not confirmed(ch, "", q, b"c")
    ch.basic_ack(method.delivery_tag)
    assert bodies_of(ch, q) == [b"b"]


def test_reject_publish_to_two_queues_nacks_but_other_queue_keeps_copy(conn, make_queue, make_exchange):
    x = make_exchange("fan", "fanout")
    full = make_queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    other = make_queue("other")
    ch = conn.channel()
    ch.queue_bind(full, x)
    ch.queue_bind(other, x)
    ch.confirm_delivery()
    assert confirmed(ch, x, "", b"one")
    assert not confirmed(ch, x, "", b"two")  # refused by "full"
    assert bodies_of(ch, full) == [b"one"]
    assert bodies_of(ch, other) == [b"one", b"two"]


def test_reject_publish_without_confirms_drops_silently(conn, make_queue):
    q = make_queue(arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish("", q, b"in")
    ch.basic_publish("", q, b"out", mandatory=True)  # routed, so not returned either
    settle(conn, 0.2)
    assert ch.is_open and conn.is_open
    assert returned == []
    assert ready_count(conn, q) == 1
    assert bodies_of(ch, q) == [b"in"]


def test_reject_publish_does_not_dead_letter(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(
        arguments={"x-max-length": 1, "x-overflow": "reject-publish", "x-dead-letter-exchange": dlx}
    )
    ch = conn.channel()
    ch.confirm_delivery()
    assert confirmed(ch, "", q, b"a")
    assert not confirmed(ch, "", q, b"b")
    settle(conn, 0.2)
    assert ready_count(conn, dlq) == 0


def test_reject_publish_dlx_nacks_and_dead_letters(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(
        arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlx}
    )
    ch = conn.channel()
    ch.confirm_delivery()
    assert confirmed(ch, "", q, b"kept")
    assert not confirmed(ch, "", q, b"refused")
    assert wait_ready(conn, dlq, 1) == 1
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"refused"
    assert (method.exchange, method.routing_key) == (dlx, q)
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"], death["exchange"], death["routing-keys"]) == (
        q,
        "maxlen",
        1,
        "",
        [q],
    )
    assert bodies_of(ch, q) == [b"kept"]


def test_reject_publish_dlx_without_confirms_still_dead_letters(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(
        arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlx}
    )
    ch = conn.channel()
    ch.basic_publish("", q, b"kept")
    ch.basic_publish("", q, b"refused")
    assert wait_ready(conn, dlq, 1) == 1
    assert ch.is_open
    assert bodies_of(ch, dlq) == [b"refused"]
    assert bodies_of(ch, q) == [b"kept"]


# -- invalid arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("x-max-length", -1),
        ("x-max-length", "ten"),
        ("x-max-length-bytes", -1),
        ("x-max-length-bytes", "x"),
        ("x-overflow", "bogus"),
    ],
)
def test_invalid_length_arguments_are_406(conn, uid, arg, value):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(f"{uid}-q", arguments={arg: value})
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith(f"PRECONDITION_FAILED - invalid arg '{arg}'")
    assert conn.is_open


@pytest.mark.parametrize(("value", "type_name"), [("ten", "longstr"), (True, "bool"), ({"a": 1}, "table")])
def test_wrong_type_is_named_by_its_amqp_type(conn, uid, value, type_name):
    """RabbitMQ's text names the AMQP field type (check_int_arg: ``"expected integer, got longstr"``), not a
    Python type (the text said ``{unacceptable_type,str}``)."""
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(f"{uid}-q", arguments={"x-max-length": value})
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-max-length' for queue '{uid}-q' in "
                                   f"vhost '/': \"expected integer, got {type_name}\"")
