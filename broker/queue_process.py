"""The queue process: one object per queue, the queue's actor (RabbitMQ's ``rabbit_amqqueue_process``).

It owns the queue's backing queue and consumers. Publishing calls :meth:`deliver_or_enqueue` directly
(no task, no future); delivery is pull: :meth:`run_message_queue` hands ready messages to consumers with
room until either runs out, yielding to the event loop after a budget so one busy queue cannot starve
the rest, and is scheduled again when a consumer gains room or a message arrives.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from broker.message import Message
from broker.queue_consumers import Consumer, ConsumerSet
from storage.backing_queue import BackingQueue

if TYPE_CHECKING:
    from broker.reader import Reader
    from broker.vhost import VHost

# Deliveries per turn of the deliver loop before yielding to other work.
DELIVERY_BUDGET = 256


class QueueStats:
    """Plain-integer counters (seed 004's per-queue statistics), read by metrics at scrape time."""

    __slots__ = ("published", "delivered", "acked", "redelivered", "get", "publishers")

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.redelivered = 0
        self.get = 0
        self.publishers = 0


class QueueProcess:
    def __init__(self, vhost: "VHost", name: str, durable: bool, exclusive_owner: "Reader | None",
                 auto_delete: bool, arguments: dict[str, Any], bq: BackingQueue) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.bq = bq
        self.consumers = ConsumerSet()
        self.exclusive_consumer: Consumer | None = None
        self.has_had_consumers = False
        self.deleted = False
        self.stats = QueueStats()
        self._run_scheduled = False
        self._loop = asyncio.get_event_loop()

    # -- publishing ------------------------------------------------------------------------------------
    def deliver_or_enqueue(self, msg: Message, persistent: bool) -> None:
        """Hand a routed message to a waiting consumer, or enqueue it (seed 003's order of work)."""
        self.stats.published += 1
        if not self.attempt_delivery(msg, persistent):
            self.bq.publish(msg, len(msg.body), persistent)

    def attempt_delivery(self, msg: Message, persistent: bool) -> bool:
        """Deliver straight to a consumer when nothing is queued ahead of the message."""
        if not self.consumers.count or not self.bq.is_empty():
            return False
        consumer = self.consumers.next_with_room()
        if consumer is None:
            return False
        if consumer.no_ack:
            seq_id = -1
        else:
            seq_id = self.bq.publish_delivered(msg, len(msg.body), persistent)
        self.stats.delivered += 1
        consumer.channel.deliver(consumer, self, seq_id, msg, False)
        return True

    # -- delivering --------------------------------------------------------------------------------------
    def schedule_run(self) -> None:
        """Run the deliver loop soon (once, however many times this is called before it runs)."""
        if not self._run_scheduled and not self.deleted and self.consumers.count:
            self._run_scheduled = True
            self._loop.call_soon(self.run_message_queue)

    def run_message_queue(self) -> None:
        self._run_scheduled = False
        if self.deleted:
            return
        bq = self.bq
        consumers = self.consumers
        stats = self.stats
        budget = DELIVERY_BUDGET
        while budget and not bq.is_empty():
            consumer = consumers.next_with_room()
            if consumer is None:
                return
            fetched = bq.fetch(not consumer.no_ack)
            if fetched is None:
                return
            seq_id, msg, redelivered = fetched
            stats.delivered += 1
            if redelivered:
                stats.redelivered += 1
            consumer.channel.deliver(consumer, self, -1 if consumer.no_ack else seq_id, msg, redelivered)
            budget -= 1
        if not budget and not bq.is_empty():
            self.schedule_run()

    def basic_get(self, no_ack: bool) -> tuple[int, Message, bool, int] | None:
        """Take one message for basic.get: (seq_id, message, redelivered, ready messages left)."""
        fetched = self.bq.fetch(not no_ack)
        if fetched is None:
            return None
        seq_id, msg, redelivered = fetched
        self.stats.get += 1
        if redelivered:
            self.stats.redelivered += 1
        return seq_id, msg, redelivered, self.bq.len()

    # -- acknowledgements --------------------------------------------------------------------------------
    def ack(self, seq_ids: list[int]) -> None:
        if self.deleted:
            return
        self.stats.acked += len(self.bq.ack(seq_ids))

    def requeue(self, seq_ids: list[int]) -> None:
        if self.deleted:
            return
        self.bq.requeue(seq_ids)
        self.schedule_run()

    def reject_discard(self, seq_ids: list[int]) -> None:
        """basic.reject / nack with requeue=false: the messages are dropped (dead-lettering comes later)."""
        if self.deleted:
            return
        self.bq.ack(seq_ids)

    # -- consumers -----------------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.add(consumer)
        if consumer.exclusive:
            self.exclusive_consumer = consumer
        self.has_had_consumers = True
        self.schedule_run()

    def remove_consumer(self, consumer: Consumer) -> None:
        if not self.consumers.remove(consumer):
            return
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None
        if self.auto_delete and not self.consumers.count and self.has_had_consumers and not self.deleted:
            self.vhost.queues.delete(self, reason="auto_delete")

    # -- queue-wide operations -------------------------------------------------------------------------------
    def message_count(self) -> int:
        return self.bq.len()

    def purge(self) -> int:
        return self.bq.purge()

    def terminate(self) -> int:
        """The queue is being deleted: cancel consumers (notifying their clients) and drop the messages."""
        self.deleted = True
        for consumer in list(self.consumers):
            self.consumers.remove(consumer)
            consumer.channel.consumer_cancelled_by_queue(consumer)
        self.exclusive_consumer = None
        return self.bq.delete_and_terminate()
