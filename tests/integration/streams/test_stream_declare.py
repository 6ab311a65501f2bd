"""Redeclaring a stream with other retention or segment-size arguments (issue 12): RabbitMQ compares
``x-max-age``, ``x-max-length-bytes`` and ``x-stream-max-segment-size-bytes`` on redeclare and answers 406
with its ``inequivalent arg`` text (texts checked against RabbitMQ 3.10.8 with pika; run against RabbitMQ too
with ``LEVERET_TEST_AMQP_URL``). The same arguments again are accepted.
"""

from __future__ import annotations

import pytest

from tests.integration.streams.test_streams import channel_error

pytest_plugins = ["amqp_helpers"]
pytestmark = pytest.mark.timeout(60)

STREAM = {"x-queue-type": "stream"}
# (argument, the value it is declared with, another value); pika sends str as longstr, small ints as signedint.
CASES = [("x-max-age", "7D", "1h"),
         ("x-max-length-bytes", 1_000_000, 2_000_000),
         ("x-stream-max-segment-size-bytes", 1_000_000, 2_000_000)]
TYPES = {str: "longstr", int: "signedint"}


def declare(conn, name: str, **arguments) -> None:
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    ch.close()


@pytest.mark.parametrize(("key", "value", "other"), CASES)
def test_redeclare_with_another_value_is_inequivalent(conn, uid, cleanup, key, value, other):
    name = f"{uid}-s"
    declare(conn, name, **{key: value})
    cleanup[0].append(name)
    where = f"for queue '{name}' in vhost '/'"
    err = channel_error(conn, lambda ch: ch.queue_declare(name, durable=True, arguments={**STREAM, key: other}))
    assert err.reply_code == 406
    assert err.reply_text == (f"PRECONDITION_FAILED - inequivalent arg '{key}' {where}: "
                              f"received '{other}' but current is '{value}'")

    err = channel_error(conn, lambda ch: ch.queue_declare(name, durable=True, arguments=dict(STREAM)))
    assert err.reply_code == 406
    assert err.reply_text == (f"PRECONDITION_FAILED - inequivalent arg '{key}' {where}: received none but "
                              f"current is the value '{value}' of type '{TYPES[type(value)]}'")

    declare(conn, name, **{key: value})  # the same value again: accepted


@pytest.mark.parametrize(("key", "value", "_other"), CASES)
def test_redeclare_adding_the_argument_is_inequivalent(conn, uid, cleanup, key, value, _other):
    name = f"{uid}-s"
    declare(conn, name)
    cleanup[0].append(name)
    err = channel_error(conn, lambda ch: ch.queue_declare(name, durable=True, arguments={**STREAM, key: value}))
    assert err.reply_code == 406
    assert err.reply_text == (f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{name}' in vhost '/': "
                              f"received the value '{value}' of type '{TYPES[type(value)]}' but current is none")
