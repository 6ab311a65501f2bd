"""TTL at the head, as RabbitMQ applies it, in the cases where Leveret answered differently (issue 10):

* after ``basic.get`` takes the head, the new head's expiry is scheduled: an expired message is dead-lettered
  on time without anything else touching the queue (the "TTL + dead-letter = delayed retry" pattern);
* a message published with ``expiration: "0"`` behind a live head is kept (counted, taking a length slot)
  until it reaches the head, and only then expires; only ``x-message-ttl: 0`` without a dead-letter
  exchange discards at publish.
"""

from __future__ import annotations

import pika
import pytest
from amqp_helpers import get_all, publish, ready_count, settle, wait_get

pytest_plugins = ["amqp_helpers"]
pytestmark = pytest.mark.timeout(60)


def test_new_head_expires_on_time_after_basic_get_took_the_old_one(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    publish(conn, q, b"no-ttl")
    publish(conn, q, b"ttl-300", properties=pika.BasicProperties(expiration="300"))
    ch = conn.channel()
    assert ch.basic_get(q, auto_ack=True)[2] == b"no-ttl"
    # Nothing touches q from now on: only its TTL timer can move "ttl-300" to the dead-letter queue.
    got = wait_get(conn.channel(), dlq, timeout=5.0)
    assert got is not None and got[2] == b"ttl-300"
    assert got[1].headers["x-death"][0]["reason"] == "expired"


def test_expiration_zero_behind_a_live_head_is_kept_until_it_reaches_the_head(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    publish(conn, q, b"head")
    publish(conn, q, b"zero", properties=pika.BasicProperties(expiration="0"))
    publish(conn, q, b"tail")
    assert ready_count(conn, q) == 3, "an expired message behind the head still counts until it is the head"
    assert get_all(conn.channel(), dlq) == []
    ch = conn.channel()
    assert ch.basic_get(q, auto_ack=True)[2] == b"head"
    assert ch.basic_get(q, auto_ack=True)[2] == b"tail"  # "zero" expired on reaching the head
    dead = wait_get(conn.channel(), dlq)
    assert dead is not None and dead[2] == b"zero"


def test_expiration_zero_takes_a_max_length_slot(conn, make_queue):
    q = make_queue(arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"head")
    ch.basic_publish("", q, b"zero", pika.BasicProperties(expiration="0"))
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"refused")  # the queue is full: "zero" holds a slot
    settle(conn)
    assert ready_count(conn, q) == 2
