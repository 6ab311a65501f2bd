"""Publisher-confirm bookkeeping of one channel (the ``unconfirmed`` dtree and confirm batching of RabbitMQ's
``rabbit_channel``): the publish sequence numbers, the publishes still waiting for their queues' fsync, the
confirms settled this tick, and how they fold into as few basic.ack frames as possible.

Pure: it knows no socket and no queue. The channel numbers each publish (``seq``), tells the tracker what the
publish path answered (:meth:`Confirms.published`) and what each queue answered later
(:meth:`Confirms.queue_answered`); both say True when the first confirm of a tick is settled, so the channel
asks its connection for one flush per tick, not one per message. At the flush the channel takes the settled
confirms (:meth:`Confirms.take`) and writes them: nacks one by one, then the acks as :func:`fold_acks` groups
them.

Publishes in a transaction are not numbered here (tx and confirm mode exclude each other); their later
fsync answers go to broker/amqp/tx.py.
"""

from __future__ import annotations

import bisect


def fold_acks(acks: list[int], oldest_waiting: int | None) -> list[tuple[int, bool]]:
    """The basic.ack frames, as (delivery tag, multiple), that confirm ``acks`` (sorted, ascending).

    Every publish numbered below the oldest one still waiting for a queue (``oldest_waiting``; None when
    none waits) is settled, acked now, acked before or nacked (nacks are written first), so the acks below it
    fold into one ``multiple=true`` ack of the highest; a single one goes as ``multiple=false``. Acks above it
    were confirmed out of order and go one by one, since a multiple ack would cover the waiting one."""
    folded = len(acks) if oldest_waiting is None else bisect.bisect_left(acks, oldest_waiting)
    frames: list[tuple[int, bool]] = []
    if folded == 1:
        frames.append((acks[0], False))
    elif folded > 1:
        frames.append((acks[folded - 1], True))
    frames.extend((tag, False) for tag in acks[folded:])
    return frames


class Confirms:
    """One confirm-mode channel's confirms.

    ``seq`` is the number of the last publish (the channel increments it in its publish path, where the
    number is passed on to the queues). ``unconfirmed`` maps a publish waiting for queues to [queues left,
    accepted so far], in publish order (dict order), so its first key is the oldest waiting."""

    __slots__ = ("_flush_asked", "acks", "nacks", "seq", "unconfirmed")

    def __init__(self) -> None:
        self.seq = 0
        self.unconfirmed: dict[int, list[int]] = {}  # [queues left, accepted so far (a bool)]
        self.acks: list[int] = []
        self.nacks: list[int] = []
        self._flush_asked = False  # a confirm was settled since the last take(): a flush is on its way

    def published(self, seq: int, queues_pending: int, refused: int) -> bool:
        """The publish path's answer for publish ``seq``: ``queues_pending`` queues will confirm it after
        their fsync; ``refused`` (nonzero) if a queue refused it (it is nacked). With no queue to wait for it is settled
        now. True if it is the first settled this tick (the connection must be asked to flush)."""
        if queues_pending:
            self.unconfirmed[seq] = [queues_pending, not refused]
            return False
        if refused:
            self.nacks.append(seq)
        else:
            self.acks.append(seq)
        if self._flush_asked:
            return False
        self._flush_asked = True
        return True

    def queue_answered(self, seq: int, stored: bool) -> bool:
        """A queue has publish ``seq`` on disk (``stored``) or failed to put it there. Once every queue it went
        to has answered it is settled: acked, or nacked if any failed. True as :meth:`published` says."""
        entry = self.unconfirmed.get(seq)
        if entry is None:
            return False
        if not stored:
            entry[1] = False
        entry[0] -= 1
        if entry[0]:
            return False
        del self.unconfirmed[seq]
        (self.acks if entry[1] else self.nacks).append(seq)
        if self._flush_asked:
            return False
        self._flush_asked = True
        return True

    @property
    def settled(self) -> bool:
        """Whether confirms are settled and not yet taken."""
        return bool(self.acks or self.nacks)

    @property
    def messages_unconfirmed(self) -> int:
        """RabbitMQ's ``messages_unconfirmed``: publishes waiting for their queues, and those settled this tick
        whose basic.ack / basic.nack is not written yet."""
        return len(self.unconfirmed) + len(self.acks) + len(self.nacks)

    def take(self) -> tuple[list[int], list[tuple[int, bool]], int]:
        """Take the settled confirms: (nack tags, ack frames as :func:`fold_acks` gives them, acks count)."""
        acks, nacks = self.acks, self.nacks
        self.acks, self.nacks = [], []
        self._flush_asked = False
        if not acks:
            return nacks, [], 0
        acks.sort()
        return nacks, fold_acks(acks, next(iter(self.unconfirmed), None)), len(acks)

    def clear(self) -> None:
        """Forget everything (the channel closed: nothing more is written)."""
        self.unconfirmed.clear()
        self.acks = []
        self.nacks = []
        self._flush_asked = False
