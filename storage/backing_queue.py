"""The BackingQueue interface: what a queue process asks of the store that holds its messages.

Modelled on RabbitMQ's ``rabbit_backing_queue`` behaviour. A queue's messages are identified by ``seq_id``,
an integer the backing queue assigns in publish order; a message is *ready* (waiting in the queue) or
*pending ack* (fetched, not yet acked). Every implementation runs the conformance suite in
``tests/unit/test_backing_queue_conformance.py``.

Contracts:
- ``publish`` appends a ready message and returns its seq_id, larger than every seq_id given before.
- ``publish_delivered`` records a message that went straight to a consumer without being enqueued
  (RabbitMQ's attempt_delivery on an empty queue): it is pending ack at once.
- ``fetch`` takes the ready message with the lowest seq_id. With ``ack_required`` it stays pending ack
  until ``ack`` or ``requeue``; without, it is gone. It returns ``(seq_id, msg, is_delivered)``, where
  is_delivered says the message may have been delivered before (the client's redelivered flag).
- ``ack`` forgets pending-ack messages; ``requeue`` puts them back among the ready messages at the places
  their seq_ids give (ahead of newer messages), marked delivered. Unknown seq_ids are ignored by both.
- ``purge`` drops every ready message (pending acks stay) and returns how many it dropped.
- ``len`` counts ready messages; ``pending_ack_count`` counts the rest; ``ready_bytes`` sums ready sizes.
- ``drain_confirmed`` returns the opaque confirm ids of persistent messages that reached disk since the
  last call (an in-memory store confirms nothing asynchronously and returns an empty list).
- ``delete_and_terminate`` drops everything, ready and pending ack, and releases any storage.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol


class BackingQueue(Protocol):
    def publish(self, msg: Any, size: int, persistent: bool) -> int: ...

    def publish_delivered(self, msg: Any, size: int, persistent: bool) -> int: ...

    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None: ...

    def ack(self, seq_ids: Iterable[int]) -> list[Any]: ...

    def requeue(self, seq_ids: Iterable[int]) -> None: ...

    def purge(self) -> int: ...

    def len(self) -> int: ...

    def is_empty(self) -> bool: ...

    def pending_ack_count(self) -> int: ...

    def ready_bytes(self) -> int: ...

    def drain_confirmed(self) -> list[Any]: ...

    def delete_and_terminate(self) -> int: ...
