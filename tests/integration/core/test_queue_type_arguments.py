"""Queue arguments a queue type does not take are refused when the queue is declared, whatever their value, with
RabbitMQ 3.10.8's 406 "invalid arg 'KEY' for queue 'Q' in vhost 'V' of queue type rabbit_TYPE_queue"; the
arguments each type does take are accepted. Each case was tried against RabbitMQ 3.10.8 (make test-rabbitmq).
Two arguments RabbitMQ refuses are Leveret's extensions, tested where they work: x-delivery-limit on a classic
queue (test_queue_features.py), x-max-priority on a quorum queue (test_cluster_suite_quorum.py)."""

from __future__ import annotations

import pytest
from pika.exceptions import ChannelClosedByBroker

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange

VALUES = {"x-max-in-memory-length": 10, "x-max-in-memory-bytes": 1000, "x-quorum-initial-group-size": 3,
          "x-queue-leader-locator": "client-local", "x-initial-cluster-size": 1, "x-max-age": "1D",
          "x-stream-max-segment-size-bytes": 100_000, "x-queue-version": 2, "x-queue-master-locator": "min-masters",
          "x-queue-mode": "lazy", "x-dead-letter-strategy": "at-most-once", "x-single-active-consumer": True,
          "x-max-length-bytes": 500, "x-max-priority": 5, "x-expires": 100_000, "x-message-ttl": 1000}
REFUSED = {
    "classic": ["x-max-in-memory-length", "x-max-in-memory-bytes", "x-quorum-initial-group-size",
                "x-queue-leader-locator", "x-initial-cluster-size", "x-max-age", "x-stream-max-segment-size-bytes",
                "x-dead-letter-strategy"],
    "quorum": ["x-initial-cluster-size", "x-max-age", "x-stream-max-segment-size-bytes", "x-queue-version",
               "x-queue-master-locator", "x-queue-mode"],
    "stream": ["x-max-in-memory-length", "x-max-in-memory-bytes", "x-quorum-initial-group-size", "x-queue-version",
               "x-queue-master-locator", "x-dead-letter-strategy", "x-max-priority", "x-single-active-consumer"],
}
TAKEN = {
    "classic": ["x-queue-version", "x-queue-master-locator", "x-queue-mode", "x-single-active-consumer",
                "x-max-priority", "x-max-length-bytes"],
    "quorum": ["x-max-in-memory-length", "x-max-in-memory-bytes", "x-quorum-initial-group-size",
               "x-queue-leader-locator", "x-dead-letter-strategy", "x-single-active-consumer"],
    "stream": ["x-queue-leader-locator", "x-initial-cluster-size", "x-max-age", "x-stream-max-segment-size-bytes",
               "x-max-length-bytes"],
}


@pytest.mark.parametrize(("queue_type", "key"), [(t, k) for t, keys in REFUSED.items() for k in keys])
def test_an_argument_the_type_does_not_take_is_refused(conn, uid, queue_type, key):
    name = f"{uid}-{queue_type}"
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type, key: VALUES[key]})
    text = (f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/' "
            f"of queue type rabbit_{queue_type}_queue")
    assert (err.value.reply_code, err.value.reply_text) == (406, text)


@pytest.mark.parametrize(("queue_type", "key"), [(t, k) for t, keys in TAKEN.items() for k in keys])
def test_an_argument_the_type_takes_is_accepted(conn, uid, queue_type, key):
    name = f"{uid}-{queue_type}"
    ch = conn.channel()
    ok = ch.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type, key: VALUES[key]}).method
    assert (ok.queue, ok.message_count) == (name, 0)
    ch.queue_delete(name)


@pytest.mark.parametrize(("queue_type", "key"), [("classic", "x-max-age"), ("quorum", "x-queue-mode"),
                                                 ("classic", "x-dead-letter-strategy"), ("stream", "x-queue-version")])
def test_a_redeclare_with_an_argument_the_type_does_not_take_is_equivalent(conn, uid, queue_type, key):
    """Refused when a queue is created, such an argument is neither refused nor compared when it exists."""
    name = f"{uid}-{queue_type}"
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
    ok = ch.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type, key: VALUES[key]}).method
    assert ok.queue == name
    ch.queue_delete(name)


# (type, argument, value, what RabbitMQ 3.10.8 says of it after "invalid arg 'KEY' for queue 'Q' in vhost '/': ",
# None where it takes the value)
VALUE_CASES = [
    ("classic", "x-queue-type", "bogus", "\"unsupported queue type 'bogus'\""),
    ("classic", "x-queue-mode", "bogus", "\"unsupported queue mode 'bogus'\""),
    ("classic", "x-queue-mode", "default", None),
    ("classic", "x-queue-version", 3, "\"unsupported queue version '3'\""),
    ("classic", "x-queue-version", 1, None),
    ("classic", "x-max-priority", 256, "{max_value_exceeded,256}"),
    ("quorum", "x-dead-letter-strategy", "bogus", "invalid_dlx_strategy"),
    ("quorum", "x-dead-letter-strategy", "at-least-once", None),
    ("quorum", "x-queue-leader-locator", "bogus", "invalid_queue_locator_arg"),
    ("quorum", "x-queue-leader-locator", "balanced", None),
    ("quorum", "x-queue-leader-locator", "client-local", None),
    ("quorum", "x-queue-leader-locator", "random", None),
    ("stream", "x-queue-leader-locator", "least-leaders", None),
    ("stream", "x-queue-leader-locator", "bogus", "invalid_queue_locator_arg"),
    ("quorum", "x-max-in-memory-length", -1, "{value_negative,-1}"),
    ("quorum", "x-max-in-memory-bytes", -1, "{value_negative,-1}"),
    ("quorum", "x-max-in-memory-length", 0, None),
    ("quorum", "x-quorum-initial-group-size", 0, "{value_zero,0}"),
    ("quorum", "x-quorum-initial-group-size", -1, "{value_negative,-1}"),
    ("stream", "x-initial-cluster-size", 0, "{value_zero,0}"),
    ("stream", "x-initial-cluster-size", 2, None),
]


@pytest.mark.parametrize(("queue_type", "key", "value", "problem"), VALUE_CASES)
def test_an_arguments_value_is_judged_as_rabbitmq_judges_it(conn, uid, queue_type, key, value, problem):
    name = f"{uid}-{queue_type}"
    ch = conn.channel()
    arguments = {"x-queue-type": queue_type, key: value}
    if problem is None:
        assert ch.queue_declare(name, durable=True, arguments=arguments).method.queue == name
        ch.queue_delete(name)
        return
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_declare(name, durable=True, arguments=arguments)
    text = f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/': {problem}"
    assert (err.value.reply_code, err.value.reply_text) == (406, text)
