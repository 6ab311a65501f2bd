"""Hands one routed message to every target queue process in one step (RabbitMQ's ``delegate``).

A single node needs no remote batching, so this is where the per-publish fan-out lives, and where
credit flow will account each hand-over to a queue (seed 003, DESIGN.md §2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.message import Message

if TYPE_CHECKING:
    from broker.queue_process import QueueProcess


def deliver(queues: list[QueueProcess], msg: Message, persistent: bool) -> bool:
    """Give ``msg`` to each queue (a persistent message stays persistent only in durable queues).
    Returns False if any queue refused it (overflow reject-publish): its publisher is then nacked,
    while the queues that took it keep their copy."""
    accepted = True
    for q in queues:
        if not q.deliver_or_enqueue(msg, persistent and q.durable):
            accepted = False
    return accepted
