"""The confirms a queue owes its publishers: publishes it accepted whose fsync (or commit) has not come yet.

A confirm token is ``(publisher channel, delivery tag)`` (broker/amqp/channel.py); settling one calls the
channel's ``confirm_from_queue(tag, stored)``, which acks or nacks once every queue the message went to has
answered. A classic queue's store hands back the tokens it made durable, in any order (:class:`ConfirmBook`); a
stream's log reports a durable offset, below which everything is stored (:class:`OffsetConfirmBook`). Both are
the builtin collections they extend, so that owing a confirm on the publish path is one ``add`` / ``append``,
and both confirm everything they still owe when their queue is deleted: the queue has dealt with those
publishes (tests/integration/durability/test_durability.py holds a publisher to that).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol


class OwedConfirms(Protocol):
    """What the queue shell (broker/queues/queue_shell.py) reads of either book."""

    def __len__(self) -> int: ...

    def settle_all(self) -> None:
        """Confirm every publish still owed (the queue is being deleted)."""
        ...


class ConfirmBook(set[Any]):
    """Confirm tokens owed, settled in whatever order the store makes them durable (``add`` owes one)."""

    __slots__ = ()

    def settle(self, tokens: Iterable[Any], stored: bool) -> None:
        """Ack (``stored``) or nack the publishers of those ``tokens`` still owed; others were settled already
        (the queue was deleted meanwhile) and are skipped."""
        discard = self.discard
        for token in tokens:
            if token in self:
                discard(token)
                token[0].confirm_from_queue(token[1], stored)

    def settle_all(self) -> None:
        for token in self:
            token[0].confirm_from_queue(token[1], True)
        self.clear()


class OffsetConfirmBook(deque[tuple[int, Any]]):
    """``(offset, token)`` owed, in offset order (``append`` owes one): a log makes a prefix durable at once."""

    __slots__ = ()

    def settle_below(self, below: int, stored: bool) -> None:
        """Ack (``stored``) or nack every publish owed at an offset below ``below``."""
        while self and self[0][0] < below:
            _offset, token = self.popleft()
            token[0].confirm_from_queue(token[1], stored)

    def settle_all(self) -> None:
        for _offset, token in self:
            token[0].confirm_from_queue(token[1], True)
        self.clear()
