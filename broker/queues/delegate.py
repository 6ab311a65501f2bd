"""Hands one routed message to every target queue process in one step (RabbitMQ's ``delegate``).

A single node needs no remote batching, so this is where the per-publish fan-out lives, and where credit
flow accounts each hand-over to a queue (docs/decisions/message-path.md). Called by ``VHost.publish``, and by
broker/clustering/cluster_forwarding.py for messages another cluster member already routed.

Being the one place a routed message enters a queue of any type, it is also where queue-level message
deduplication happens (broker/deduplication.py): a queue whose ``dedup`` is set drops a message whose key it
has seen, whatever its type, and the queue types know nothing of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.message import Message
from broker.publish import PENDING, REFUSED, Publisher
from broker.queues.queue_shell import ACCEPTED, CONFIRM_LATER, REJECTED
from storage.backing_queue import new_msg_id

if TYPE_CHECKING:
    from collections.abc import Sequence

    from broker.deduplication import DedupCache
    from broker.queues.queue_types import Queue
    from broker.topology import OtherMembersQueue


class HandOvers:
    """How many times a message has been handed to a queue since start: the reader measures a turn's work
    by it (broker/amqp/reader.py's ROUTED_PER_TURN), whoever published (a client, a dead-lettering it caused)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


handovers = HandOvers()


def deliver(queues: Sequence[Queue | OtherMembersQueue], msg: Message, persistent: bool, publisher: Publisher | None = None,
            confirm_seq: int = 0) -> int:
    """Give ``msg`` to each queue (a persistent message stays persistent only in durable queues).

    Returns the confirm part of broker/publish.py's result: ``REFUSED`` set if any queue refused the message
    (overflow reject-publish; its publisher is then nacked while the queues that took it keep their copy),
    and, above ``PENDING``, how many queues will confirm later, after an fsync (``confirm_seq`` asks for
    confirms: > 0 a confirm-mode channel's sequence number, < 0 a transaction's token).
    A queue with too many publishes awaiting their fsync stops reading the publisher's socket (credit flow).
    """
    token = (publisher, confirm_seq) if confirm_seq else None
    if persistent and msg.msg_id is None:
        # Its id, once, on the message: every queue (and store) it reaches keeps it under the same id, so a
        # shared store holds one copy. Transient messages get none: a store numbers its own copy if it pages.
        msg.msg_id = new_msg_id()
    refused = 0
    pending = 0
    handovers.count += len(queues)
    for q in queues:
        if publisher is not None and publisher not in q.publisher_channels:
            q.publisher_channels.add(publisher)
            publisher.published_to.add(q)
        dedup = q.dedup
        if dedup is None:
            result = q.deliver_or_enqueue(msg, persistent and q.durable, token)
        else:
            result = deliver_deduplicated(q, dedup, msg, persistent and q.durable, token)
        if result == CONFIRM_LATER:
            pending += 1
        elif result == REJECTED:
            refused = REFUSED
        if publisher is not None and q.overloaded:
            q.throttle(publisher.reader)
    return (pending << PENDING) | refused


def deliver_run(queues: Sequence[Queue | OtherMembersQueue], msgs: list[Message], persistent: bool,
                publisher: Publisher | None, first_seq: int = 0) -> list[int]:
    """:func:`deliver` for a run of messages routed alike and alike in what a queue reads of their properties
    (delivery mode, expiration, priority, a stream's filter value): a run of a client's publishes with one
    content header (broker/amqp/publish_run.py), or the firehose's events of one turn (no publisher, no
    confirms). Returns deliver's confirm part for each message, in order; ``first_seq`` (> 0) is the first
    message's confirm sequence number, the others following it.

    One queue takes the whole run in one call (``deliver_or_enqueue_run``; its publisher's credit looked at once
    a run). Several take it message by message, each message given to every queue before the next, as
    :func:`deliver` would: one queue's run taken whole before the next queue's would change which messages a
    consumer with a prefetch shared by both queues gets first."""
    if len(queues) != 1:
        return [deliver(queues, msg, persistent, publisher, first_seq + i if first_seq else 0)
                for i, msg in enumerate(msgs)]
    if persistent:
        for msg in msgs:
            if msg.msg_id is None:
                msg.msg_id = new_msg_id()
    q = queues[0]
    handovers.count += len(msgs)
    if publisher is not None and publisher not in q.publisher_channels:
        q.publisher_channels.add(publisher)
        publisher.published_to.add(q)
    durable = persistent and q.durable
    dedup = q.dedup
    if dedup is None:
        taken = q.deliver_or_enqueue_run(msgs, durable, publisher, first_seq)
    else:
        taken = [deliver_deduplicated(q, dedup, msg, durable, (publisher, first_seq + i) if first_seq else None)
                 for i, msg in enumerate(msgs)]
    if publisher is not None and q.overloaded:
        q.throttle(publisher.reader)
    return [1 << PENDING if result == CONFIRM_LATER else REFUSED if result == REJECTED else 0 for result in taken]


def deliver_deduplicated(q: Queue | OtherMembersQueue, cache: DedupCache, msg: Message, persistent: bool,
                         confirm: tuple[Publisher | None, int] | None) -> int:
    """``q.deliver_or_enqueue`` for a queue with a deduplication cache. A message whose key the cache has seen
    is dropped and accepted: ACCEPTED, or CONFIRM_LATER when the entry it matched is not on disk yet (its
    confirm then follows that fsync). Anything else is the queue's to take; its key is admitted once taken,
    in the same burst as the queue's write, so the fsync that confirms the message covers the entry too. A
    message the queue refused is not remembered: its re-publish must not be a duplicate."""
    key = cache.key_of(msg)
    if key is None:
        return q.deliver_or_enqueue(msg, persistent, confirm)
    if cache.seen(key):
        cache.dropped += 1
        if confirm is None or confirm[0] is None or cache.durable:
            return ACCEPTED
        cache.confirm_when_durable(confirm[0], confirm[1])
        return CONFIRM_LATER
    result = q.deliver_or_enqueue(msg, persistent, confirm)
    if result != REJECTED:
        cache.admit(key, msg)
    return result
