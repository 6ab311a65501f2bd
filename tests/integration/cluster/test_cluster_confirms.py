"""Publisher confirms on a quorum queue of a Leveret cluster when the consumer is on the same node (issue 15).

A message handed straight to a waiting consumer is kept for insertion in PostgreSQL at the end of the burst;
if the consumer acks it first (auto-ack: within the publish itself) it is never inserted, and no commit
confirms it. It must be confirmed all the same, as RabbitMQ confirms a message consumed and acked before it
reached the disk: found by bench/cluster_quorum.py, where a single node's confirming publisher stalled after
its first window (377 msg/s with manual acks, 25 msg/s with auto-ack, then nothing).
"""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest

from tests.integration.cluster.test_cluster_definitions import member

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

QUORUM = {"x-queue-type": "quorum"}
MESSAGES = 300
WINDOW = 50


async def publish_and_consume(url: str, queue: str, no_ack: bool) -> tuple[int, int]:
    """Publish MESSAGES persistent messages with confirms, WINDOW outstanding, while a consumer on the same
    node takes them (``no_ack``: auto-ack; else acked as each arrives). Returns (confirmed, consumed)."""
    consumer_conn = await aio_pika.connect(url)
    publisher_conn = await aio_pika.connect(url)
    try:
        cch = await consumer_conn.channel()
        await cch.set_qos(prefetch_count=100)
        q = await cch.declare_queue(queue, durable=True, arguments=QUORUM)
        consumed = 0
        all_in = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal consumed
            if not no_ack:
                await message.ack()
            consumed += 1
            if consumed == MESSAGES:
                all_in.set()

        await q.consume(on_message, no_ack=no_ack)
        pch = await publisher_conn.channel(publisher_confirms=True)
        window = asyncio.Semaphore(WINDOW)
        confirmed = 0

        async def publish_one(i: int) -> None:
            nonlocal confirmed
            async with window:
                await pch.default_exchange.publish(
                    aio_pika.Message(b"%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue)
                confirmed += 1

        await asyncio.wait_for(asyncio.gather(*(publish_one(i) for i in range(MESSAGES))), 30)
        await asyncio.wait_for(all_in.wait(), 30)
        return confirmed, consumed
    finally:
        await publisher_conn.close()
        await consumer_conn.close()


@pytest.mark.parametrize("no_ack", [True, False], ids=["auto-ack", "manual-ack"])
def test_every_publish_is_confirmed_with_the_consumer_on_the_same_node(start_broker, pg_dsn, uid, no_ack):
    node = member(start_broker, pg_dsn, "solo")
    confirmed, consumed = asyncio.run(publish_and_consume(node.url, f"{uid}-q", no_ack))
    assert (confirmed, consumed) == (MESSAGES, MESSAGES)


def test_a_confirmed_message_acked_before_insertion_is_not_in_the_queue_afterwards(start_broker, pg_dsn, uid):
    """The message confirmed on ack is not inserted later either: after the run the queue is empty on a
    node that restarted (its count comes from PostgreSQL)."""
    node = member(start_broker, pg_dsn, "solo")
    queue = f"{uid}-q"
    asyncio.run(publish_and_consume(node.url, queue, True))
    node.restart()
    conn = pika.BlockingConnection(node.pika_params())
    assert conn.channel().queue_declare(queue, passive=True).method.message_count == 0
    conn.close()
