"""kombu's ``test_ack_from_another_thread`` (t/integration/common.py, run with the py-amqp transport), and the order
it depends on: queue.delete-ok before the basic.cancel of the deleting channel's own consumer.

The kombu test consumes two messages with prefetch 1 and acks each from a timer thread through the hub; in its
``finally`` it deletes the queue on the channel its consumer still consumes on. py-amqp raises ConsumerCancelled
for a server basic.cancel of a consumer registered without ``on_cancel`` (kombu registers none), and it raises it
from whatever call is reading at that moment. RabbitMQ's channel answers delete-ok as soon as the queue process
has gone and learns of its consumers' end only afterwards (the queue's exit reaches it later): the cancel comes
after delete-ok, and kombu's Consumer.__exit__, which swallows the error of its own basic.cancel, reads it. A
cancel ahead of delete-ok made ``queue_delete`` itself raise, failing the test.
"""

from __future__ import annotations

import threading
from time import monotonic

import amqp
import kombu
import pytest
from kombu.asynchronous import Hub


def _connection(broker) -> kombu.Connection:
    return kombu.Connection(f"pyamqp://{broker.user}:{broker.password}@{broker.host}:{broker.port}/{broker.vhost}")


def test_ack_from_another_thread_then_delete_the_consumed_queue(broker, uid):
    """kombu's test as it is (names of our own; a 5 s deadline for its 1 s: the machine is shared)."""
    name = f"{uid}-ack-from-thread"
    test_queue = kombu.Queue(name, routing_key=name)
    acked: list[int] = []
    hub = Hub()

    def ack(message) -> None:
        message.ack()
        acked.append(message.payload)

    def callback(body, message) -> None:
        threading.Timer(0.1, hub.call_soon, (ack, message)).start()

    with _connection(broker) as conn:
        with conn.channel() as channel:
            producer = kombu.Producer(channel)
            for body in range(2):
                producer.publish(body, exchange=test_queue.exchange, routing_key=test_queue.routing_key,
                                 declare=[test_queue])
        consumer = kombu.Consumer(conn, [test_queue], callbacks=[callback], prefetch_count=1)
        with consumer:
            try:
                conn.register_with_event_loop(hub)
                deadline = monotonic() + 5
                while len(acked) < 2 and monotonic() < deadline:
                    hub.run_once()
                assert acked == [0, 1]
            finally:
                hub.close()
                test_queue(consumer.channel).delete()


def test_delete_ok_comes_before_the_cancel_of_the_deleting_channels_consumer(broker, uid):
    """The same order with py-amqp alone: queue_delete returns, and the server's cancel is read after it."""
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid=broker.user, password=broker.password,
                           virtual_host=broker.vhost)
    conn.connect()
    try:
        ch = conn.channel()
        queue = f"{uid}-deleted-under-consumer"
        ch.queue_declare(queue, auto_delete=False)
        tag = ch.basic_consume(queue, callback=lambda message: None)
        assert ch.queue_delete(queue) == 0
        with pytest.raises(amqp.exceptions.ConsumerCancelled) as cancelled:
            conn.drain_events(timeout=5)
        assert tag in str(cancelled.value)
    finally:
        conn.close()
