"""Message TTL and dead-lettering of a quorum queue in a cluster, nobody consuming (issue 15).

A queue with ``x-message-ttl`` 800 ms and a dead-letter exchange routing to a second quorum queue; five messages
published one by one with confirms, on the member that declared the queues or on the other one. All five
expire and reach the dead-letter queue, whichever member is asked. (Before: the rows a member reserved after
its first expiries were never looked at again when no consumer was there, since the check of the head ran in
the deliver loop only: 2 of 5 were dead-lettered and 3 stayed in the queue for good.)
"""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration.cluster.test_cluster_forwarding import channel, drain, two

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]


def counts(b) -> tuple[int, int]:
    conn, ch = channel(b)
    try:
        return (ch.queue_declare("ttlq", passive=True).method.message_count,
                ch.queue_declare("dlq", passive=True).method.message_count)
    finally:
        conn.close()


@pytest.mark.parametrize("publisher", ["declarer", "other"])
def test_expired_messages_are_dead_lettered_with_nobody_consuming(start_broker, pg_dsn, publisher):
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.exchange_declare("dlx", "fanout", durable=True)
    ch.queue_declare("dlq", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind("dlq", "dlx")
    ch.queue_declare("ttlq", durable=True, arguments={"x-queue-type": "quorum", "x-message-ttl": 800,
                                                      "x-dead-letter-exchange": "dlx"})
    conn.close()
    conn, ch = channel(a if publisher == "declarer" else b)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", "ttlq", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (counts(a) != (0, 5) or counts(b) != (0, 5)):
        time.sleep(0.2)
    assert counts(a) == (0, 5) and counts(b) == (0, 5), (counts(a), counts(b))
    conn, ch = channel(b)
    assert sorted(drain(conn, ch, "dlq", 5)) == [b"m%d" % i for i in range(5)]
    conn.close()
