"""A queue or exchange declared on one cluster member is usable on another at once (issue 15).

Clients behind a load balancer declare on one node and consume or publish on another a millisecond later;
RabbitMQ's cluster answers from its replicated tables. A Leveret member learns of the other members'
definitions from the change feed it polls twice a second, so without more it answered 404 (found by
bench/cluster_quorum.py: a consumer on the second node refused, the run measuring a third of the rate). A
member that is asked for a name it does not know reads the feed at once before answering.
"""

from __future__ import annotations

import pika
import pytest

from tests.integration.cluster.test_cluster_definitions import member

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

QUORUM = {"x-queue-type": "quorum"}
ROUNDS = 20


def test_declared_on_one_member_usable_on_the_other_at_once(start_broker, pg_dsn, uid):
    a = member(start_broker, pg_dsn, "a")
    b = member(start_broker, pg_dsn, "b")
    ca = pika.BlockingConnection(a.pika_params())
    cb = pika.BlockingConnection(b.pika_params())
    try:
        cha, chb = ca.channel(), cb.channel()
        chb.confirm_delivery()
        for i in range(ROUNDS):
            queue, exchange = f"{uid}-q{i}", f"{uid}-x{i}"
            cha.queue_declare(queue, durable=True, arguments=QUORUM)
            # At once on b: a passive declare, a consume, a publish by the default exchange (mandatory, so
            # a message routed nowhere would come back rather than vanish).
            chb.queue_declare(queue, passive=True)
            tag = chb.basic_consume(queue, lambda *args: None)
            chb.basic_cancel(tag)
            chb.basic_publish("", queue, b"m", pika.BasicProperties(delivery_mode=2), mandatory=True)
            # An exchange declared on a, bound and published to through b at once.
            cha.exchange_declare(exchange, "direct", durable=True)
            chb.queue_bind(queue, exchange, "k")
            chb.basic_publish(exchange, "k", b"n", pika.BasicProperties(delivery_mode=2), mandatory=True)
        for i in range(ROUNDS):
            assert chb.queue_declare(f"{uid}-q{i}", passive=True).method.message_count == 2
    finally:
        ca.close()
        cb.close()


def test_a_missing_name_is_still_404(start_broker, pg_dsn, uid):
    """Reading the feed on a miss changes nothing for a name nobody declared."""
    member(start_broker, pg_dsn, "a")
    b = member(start_broker, pg_dsn, "b")
    conn = pika.BlockingConnection(b.pika_params())
    try:
        for _ in range(5):
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
                ch.queue_declare(f"{uid}-nobody", passive=True)
            assert exc.value.reply_code == 404
    finally:
        conn.close()
