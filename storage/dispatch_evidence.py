"""Evidence of delayed-message dispatches in the queues (docs/decisions/delayed-messages.md: exactly-once dispatch across a crash).

The delay store hands a due message out, the broker enqueues it into its target queues, and once the
queues have it on disk the store logs it DISPATCHED. A crash between the queues' fsync and that log record
used to hand the message out again after the restart: a duplicate. The store now logs BEGIN before the
enqueue (fsynced first), so after a crash it knows exactly which messages are *in doubt*; for each, the
queues are asked whether they hold it, and it goes again only to the durable target queues that do not.

For that a dispatched persistent message carries an **origin id** as its message id (the id every queue
index and message store keeps it under, so it costs no extra field on disk):

    bit 127 set | bits 64..111: the dispatch batch's epoch | bits 0..63: the delay store's seq

``storage.backing_queue.new_msg_id`` never sets bit 127, so no other message looks like a dispatch.

**Pinning.** A queue index deletes a segment file as soon as every message in it is acked, and a consumer
can receive, ack and so erase a dispatched message before its DISPATCHED record is on disk; after a crash
then, the queue would look as if it never had it. So a segment holding origin ids of an epoch whose
DISPATCHED records are not yet durable is not deleted (its acks are written instead) until
:data:`PIN` says that epoch is settled; the dispatcher settles epochs at its checkpoint (a few seconds).
At recovery, fully acked segments that are about to be deleted give up their origin ids first
(:func:`origins_in`), so an in-doubt message consumed before the crash is still found.

This module is process-wide on purpose: queue indexes are made deep inside the storage layer and must not
know the broker; several delay stores in one process (tests) share the epoch sequence harmlessly.
"""

from __future__ import annotations

import struct
import time
import weakref
from collections.abc import Iterable
from typing import Protocol

ORIGIN_HI_BIT = 1 << 63  # bit 127 of the message id, in its high 64-bit word
EPOCH_MASK = (1 << 48) - 1
M64 = (1 << 64) - 1
_PUB_HEAD = struct.Struct("<BQQQ")  # the queue index's publish record: kind, seq_id, msg id low, msg id high
K_PUB = 1


def origin_msg_id(epoch: int, seq: int) -> int:
    """The message id of a dispatch of delay-store record ``seq`` in batch ``epoch``."""
    return ((ORIGIN_HI_BIT | (epoch & EPOCH_MASK)) << 64) | (seq & M64)


def origin_epoch(hi: int) -> int:
    """The epoch of a message id's high word, 0 if it is not an origin id."""
    return hi & EPOCH_MASK if hi & ORIGIN_HI_BIT else 0


def origins_in(records: Iterable[tuple[int, int, int]], data: bytes | memoryview) -> set[int]:
    """The delay-store seqs of every origin-id publish among a queue-index segment's framed ``records``
    (``(_, start, length)`` as :func:`storage.segment.scan` gives them), acked or not."""
    out = set()
    for _, start, n in records:
        if n >= _PUB_HEAD.size and data[start] == K_PUB:
            _, _, lo, hi = _PUB_HEAD.unpack_from(data, start)
            if hi & ORIGIN_HI_BIT:
                out.add(lo)
    return out


class PinWaiter(Protocol):
    def retry_deferred(self) -> bool:
        """Delete what is no longer pinned; True while something is still deferred."""
        ...


class EvidencePin:
    """Which dispatch epochs are settled (their DISPATCHED records durable). Epochs are issued in
    increasing order; ``settled_through`` is the highest epoch below every unsettled one."""

    def __init__(self) -> None:
        # Epochs start from the wall clock in ms so that they keep increasing across restarts (an origin id
        # stays unique), whatever the previous run issued (less than one batch per ms on average).
        self._next = int(time.time() * 1000) & EPOCH_MASK
        self._open: set[int] = set()
        self.settled_through = self._next - 1
        self._waiters: weakref.WeakSet[PinWaiter] = weakref.WeakSet()

    def begin(self) -> int:
        """A new batch's epoch, unsettled until :meth:`settle`."""
        self._next += 1
        epoch = self._next
        self._open.add(epoch)
        return epoch

    def settle(self, epochs: Iterable[int]) -> None:
        """These epochs' DISPATCHED records are durable: segments pinned by them may go."""
        self._open.difference_update(epochs)
        through = (min(self._open) - 1) if self._open else self._next
        if through > self.settled_through:
            self.settled_through = through
            for w in list(self._waiters):
                if not w.retry_deferred():
                    self._waiters.discard(w)

    def pinned(self, epoch: int) -> bool:
        return epoch > self.settled_through

    def wait(self, waiter: PinWaiter) -> None:
        """Call ``waiter.retry_deferred`` each time epochs settle, until it returns False."""
        self._waiters.add(waiter)


PIN = EvidencePin()
