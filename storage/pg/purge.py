"""A quorum queue's purge across the members of a cluster (issue 35): every ready message goes, those another
member has reserved for its consumers and not delivered yet included, as RabbitMQ's quorum queue purges every
ready message; what a consumer holds unacked stays; purge-ok counts what was removed.

Why the members must take part: a member reserves ready rows (state 1, owner = its epoch) into a local prefix
and delivers from it without telling PostgreSQL (storage/pg/backing_queue.py), so PostgreSQL cannot tell a
reserved row from a delivered one; only its holder can. So the purge is two steps:

1. The purging member's acker, in one transaction holding the queue's purge lock exclusively (below), deletes
   the ready rows (and its own prefix), then *marks* every row other members hold (state 1 -> 2) and NOTIFYs
   :data:`PURGE_BELL` naming the queue, a token and those members' epochs.
2. Each of them, on that notice, hands its prefix back (a release only touches state 1: a marked row stays
   marked) and answers through its own acker, after the ops it made before: it deletes its marked rows that it
   has not delivered and unmarks the delivered ones (its ``pending``), and NOTIFYs :data:`PURGED_BELL` with how
   many it deleted. The purging member's purge-ok waits for every answer (at most :data:`ANSWER_WAIT`).

The race with a holder that is delivering a reserved row is decided on the holder's event loop: a row fetched
before it takes the notice is in ``pending`` (delivered, unmarked, not counted); one still in the prefix then is
never delivered (the prefix is handed back at that instant and a marked row cannot be released or reserved
again) and is deleted and counted by the answer. Never both, never neither.

The purge lock (``pg_advisory_xact_lock(PURGE_LOCK_CLASS, queue_id)``): every acker transaction takes it, shared,
for every queue it touches, and the purge exclusively, all at its start in queue-id order. So no ack, requeue or
release of another member runs between the purge's DELETE and its mark (a release committed in between would make
a reserved row ready again, neither deleted nor marked), and no acker waits for another's rows while holding
some (the purge locks other members' rows, which their ackers lock too: without the lock two ackers could
deadlock). Reservations (the fetcher's ``SKIP LOCKED``) never wait, so they take no lock: one in flight during
the DELETE makes it wait for that row and skip it, and the mark that follows sees it reserved.

A holder that dies or is fenced before it answers has its rows, marked or not, requeued by the reaper
(redelivered): they were reserved and may have been delivered, so they come back rather than being lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

log = logging.getLogger("leveret.pg")

PURGE_LOCK_CLASS = 4263  # pg_advisory_xact_lock[_shared](PURGE_LOCK_CLASS, queue_id): see the module docstring
PURGE_BELL = "leveret_purge"  # payload: "queue_id lo hi token epoch,epoch,..." (the holders asked to answer)
PURGED_BELL = "leveret_purged"  # payload: "token epoch deleted"
# How long a purge-ok waits for the holders' answers. A live member answers within milliseconds; one that does
# not (its session lost, killed) has its rows requeued by the reaper, and the purge-ok counts without them.
ANSWER_WAIT = 5.0

# The acker's first statement: its queues' purge locks, in queue-id order (shared, or exclusive for a purge).
LOCK_QUEUES = ("SELECT CASE WHEN x THEN pg_advisory_xact_lock($1, q) ELSE pg_advisory_xact_lock_shared($1, q) END "
               "FROM unnest($2::int[], $3::bool[]) AS t(q, x)")
# Step 1's mark: the rows other members hold become state 2; the distinct holders are returned.
MARK = """
WITH m AS (UPDATE leveret.message SET state = 2
            WHERE queue_id = $1 AND priority BETWEEN $2 AND $3 AND state = 1 AND owner <> $4 RETURNING owner)
SELECT DISTINCT owner FROM m
"""
# Step 2's answer: the holder's marked rows it has not delivered are deleted, the delivered ones ($5) unmarked;
# the count goes to the purging member ($7 is "token epoch "), delivered with the commit. (A data-modifying WITH
# runs to completion whether or not the query reads it.)
ANSWER = """
WITH d AS (DELETE FROM leveret.message
            WHERE queue_id = $1 AND priority BETWEEN $2 AND $3 AND state = 2 AND owner = $4
              AND NOT (seq = ANY($5::bigint[])) RETURNING 1),
     u AS (UPDATE leveret.message SET state = 1
            WHERE queue_id = $1 AND priority BETWEEN $2 AND $3 AND state = 2 AND owner = $4
              AND seq = ANY($5::bigint[]))
SELECT pg_notify($6, $7 || (SELECT count(*) FROM d)::text)
"""


class Request(NamedTuple):
    """A purge's request to the members that hold rows of the queue (PURGE_BELL)."""

    queue_id: int
    lo: int
    hi: int
    token: str
    holders: tuple[int, ...]

    def payload(self) -> str:
        return f"{self.queue_id} {self.lo} {self.hi} {self.token} {','.join(map(str, self.holders))}"

    @classmethod
    def parse(cls, payload: str) -> Request | None:
        try:
            qid, lo, hi, token, holders = payload.split(" ")
            return cls(int(qid), int(lo), int(hi), token, tuple(int(h) for h in holders.split(",") if h))
        except ValueError:
            log.warning("pg purge: unreadable request %r", payload)
            return None


class Answer(NamedTuple):
    """A holder's answer to a Request, for its acker: the rows it delivered (kept) as of taking the notice."""

    request: Request
    delivered: list[int]
    epoch: int  # the holder's epoch when it took the notice: after a reconnect the reaper has those rows


class Waits:
    """The purging member's purges waiting for their holders' answers (PURGED_BELL), each with a deadline.

    A purge is *expected* before its request is sent (inside the acker's transaction, so the request goes out at
    its commit) and *waited for* once that commit returned. A holder can answer in between: its notice and the
    commit's reply come on different connections, and a loaded machine can hold the reply back past the whole
    answer. An answer that came early is kept and counted; dropping it made purge-ok wait the full deadline
    and leave the holder's rows out of its count."""

    def __init__(self, loop: asyncio.AbstractEventLoop, epoch: Callable[[], int]) -> None:
        self.loop = loop
        self._epoch = epoch  # the member's current epoch: tokens differ across its reconnects
        self._made = 0
        self._waits: dict[str, _Wait] = {}

    def token(self) -> str:
        self._made += 1
        return f"{self._epoch()}.{self._made}"

    def expect(self, token: str, holders: tuple[int, ...]) -> None:
        """Before the request naming ``holders`` is sent: their answers are counted from now on."""
        if holders:
            self._waits[token] = _Wait(set(holders))

    def forget(self, token: str) -> None:
        """The request's transaction failed: it was never sent, nobody answers."""
        wait = self._waits.pop(token, None)
        if wait is not None and wait.timer is not None:
            wait.timer.cancel()

    def wait(self, token: str, callback: Callable[[int], None]) -> None:
        """After the commit: ``callback(deleted)`` once every holder expected answered (the rows their answers
        deleted), or at the deadline with those that did; at once when none is left to answer (or none was
        expected)."""
        wait = self._waits.get(token)
        if wait is None:
            callback(0)
            return
        wait.callback = callback
        if not wait.holders:
            self._finish(token)
            return
        wait.timer = self.loop.call_later(ANSWER_WAIT, self._expire, token)

    def answered(self, payload: str) -> None:
        """A PURGED_BELL notice: ``token epoch deleted``."""
        try:
            token, epoch, deleted = payload.split(" ")
            holder, n = int(epoch), int(deleted)
        except ValueError:
            log.warning("pg purge: unreadable answer %r", payload)
            return
        wait = self._waits.get(token)
        if wait is None or holder not in wait.holders:
            return
        wait.holders.discard(holder)
        wait.deleted += n
        if not wait.holders and wait.callback is not None:
            self._finish(token)

    def _expire(self, token: str) -> None:
        wait = self._waits.get(token)
        if wait is not None:
            log.warning("pg purge %s: no answer from epochs %s within %.0f s; purge-ok counts without them",
                        token, sorted(wait.holders), ANSWER_WAIT)
            self._finish(token)

    def _finish(self, token: str) -> None:
        wait = self._waits.pop(token)
        if wait.timer is not None:
            wait.timer.cancel()
        if wait.callback is not None:
            wait.callback(wait.deleted)

    def finish_all(self) -> None:
        """The member was fenced or is closing: every purge-ok goes now with what its answers counted so far (a
        purge whose commit has not returned yet answers at its :meth:`wait`, with nothing counted)."""
        for token in list(self._waits):
            self._finish(token)


class _Wait:
    """One purge's wait: the holders still to answer, the rows their answers deleted, purge-ok's call (set once
    the purge committed) and its deadline (from then)."""

    __slots__ = ("callback", "deleted", "holders", "timer")

    def __init__(self, holders: set[int]) -> None:
        self.holders = holders
        self.deleted = 0
        self.callback: Callable[[int], None] | None = None
        self.timer: asyncio.TimerHandle | None = None
