"""One channel's transaction (RabbitMQ's ``rabbit_channel`` tx state, ``tx`` / ``uncommitted_*``): the
publishes and acknowledgements held back until tx.commit, and the commits waiting for their persistent
messages to reach the disk before commit-ok.

Pure: the channel routes and settles what :meth:`Transaction.commit` hands back, says when that is done
(:meth:`Transaction.applied`) and tells the transaction when a committed publish reaches the disk
(:meth:`Transaction.synced`); both answer how many commit-oks may now be sent, or that the commit failed. Only tx-mode channels build one; the publish and ack hot paths of
other channels only test ``channel.tx is not None``.

Each committed publish gets a token of its own (:meth:`Transaction.next_token`, negative, so a queue's fsync
answer tells it from a confirm-mode sequence number) because queues keep pending confirms in sets.
"""

from __future__ import annotations

from typing import Any

# What Transaction.synced answers when a committed publish failed to reach the disk.
COMMIT_FAILED = -1

# A held-back acknowledgement: (delivery tag, delivery), as the channel's ``unacked`` holds them.
Pair = tuple[int, Any]


class Transaction:
    """From tx.select to the channel's close. ``work`` is the uncommitted work, in order: ("publish", item)
    or (settle action, [pairs]) with action "ack", "requeue" or "discard"."""

    __slots__ = ("_awaiting_sync", "_commits_waiting", "_store_failed", "_token", "work")

    def __init__(self) -> None:
        self.work: list[tuple[str, Any]] = []
        self._token = 0
        self._awaiting_sync = 0  # committed persistent publishes not yet on disk
        self._commits_waiting = 0  # tx.commits not answered yet
        self._store_failed = False  # a committed publish's fsync failed: no commit-ok may be sent

    def __len__(self) -> int:
        """Uncommitted publishes and acks (the management API's ``messages_uncommitted``)."""
        return len(self.work)

    def add_publish(self, item: Any) -> None:
        self.work.append(("publish", item))

    def add_settle(self, action: str, pairs: list[Pair]) -> None:
        self.work.append((action, pairs))

    def commit(self) -> list[tuple[str, Any]]:
        """tx.commit: the work to apply now, in order; then :meth:`applied`."""
        work, self.work = self.work, []
        return work

    def applied(self) -> int:
        """The commit's work is applied (its publishes routed): it waits for their fsync, as a confirm would.
        Answers as :meth:`synced` does (commit-ok at once if nothing is awaited)."""
        self._commits_waiting += 1
        return self.synced(0)

    def next_token(self) -> int:
        """The confirm token of one committed publish (negative)."""
        self._token -= 1
        return self._token

    def routed(self, queues_pending: int) -> None:
        """A committed publish went to ``queues_pending`` queues that will answer after their fsync."""
        self._awaiting_sync += queues_pending

    def synced(self, count: int = 1, stored: bool = True) -> int:
        """``count`` committed publishes reached the disk (``stored``) or failed to (0 right after a commit
        applied its work). Answers :data:`COMMIT_FAILED` once every publish answered and one failed (there is
        no tx.commit failure reply in AMQP 0-9-1: the channel closes the connection), else how many
        commit-oks may now be sent (0 while publishes are still awaited)."""
        if not stored:
            self._store_failed = True
        self._awaiting_sync -= count
        if self._awaiting_sync > 0:
            return 0
        if self._store_failed:
            self._store_failed = False
            return COMMIT_FAILED
        answered, self._commits_waiting = self._commits_waiting, 0
        return answered

    def rollback(self) -> list[Pair]:
        """tx.rollback: drop the uncommitted work; the acks it held are returned, to be unacked again."""
        restored = self.held_acks()
        self.work = []
        return restored

    def held_acks(self) -> list[Pair]:
        """The deliveries that uncommitted acks, nacks and rejects name."""
        return [pair for kind, item in self.work if kind != "publish" for pair in item]
