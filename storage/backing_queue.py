"""The BackingQueue interface: what a queue process asks of the store that holds its messages.

Modelled on RabbitMQ's ``rabbit_backing_queue`` behaviour. A queue's messages are identified by ``seq_id``,
an integer the backing queue assigns in publish order; a message is *ready* (waiting in the queue) or
*pending ack* (fetched, not yet acked). Every implementation, the priority queue included, runs the
conformance suite in ``tests/unit/storage/test_backing_queue_conformance.py``.

The Protocol below is exactly what the broker calls (its queue process, the memory budget and the queue
registry): no caller probes for optional members, so every implementation has them all, as no-ops where
they mean nothing (a store that cannot page ignores its RAM budget). A new store (a PostgreSQL one, say)
is one new module implementing this Protocol, one line where the node chooses the store that opens its
queues, and one variant in the conformance suite's ``VARIANTS``. Which implementation a queue gets (a
plain store, or a :class:`~storage.priority_queue.PriorityBackingQueue` of them) is decided in one place,
``broker/queues/queue_types.py``'s ``new_backing_queue``.

Messages are opaque: the owner passes the message (bytes, or any object when the implementation was
given an encode/decode pair), its ``size`` (body bytes, for ``ready_bytes`` and the decision to embed
it in the index), whether it is ``persistent`` (delivery_mode 2; it is kept across restarts only if the
queue is durable too), an optional ``expiry`` (absolute, in the owner's clock units, e.g. ms; stored,
never interpreted: the owner's TTL deadline), an optional ``confirm`` id (opaque) and an optional
``msg_id`` (an int from :func:`new_msg_id`, assigned once on the message by the broker and so the same for
every queue one message is routed to, which lets a shared store keep one copy; None lets a store number
its own copy when it needs to).

Contracts:
- ``publish`` appends a ready message and returns its seq_id, larger than every seq_id given before.
- ``publish_delivered`` records a message that went straight to a consumer without being enqueued
  (RabbitMQ's attempt_delivery on an empty queue): it is pending ack at once, marked delivered.
- ``fetch`` takes the ready message with the lowest seq_id. With ``ack_required`` it stays pending ack
  until ``ack`` or ``requeue``; without, it is gone. It returns ``(seq_id, msg, is_delivered)``, where
  is_delivered says the message may have been delivered before (the client's redelivered flag).
- ``ack`` forgets pending-ack messages and returns them; ``requeue`` puts them back among the ready
  messages at the places their seq_ids give (ahead of newer messages), marked delivered. Unknown seq_ids
  are ignored by both.
- ``purge`` drops every ready message (pending acks stay) and returns how many it dropped.
- ``len`` counts ready messages; ``pending_ack_count`` counts the rest; ``ready_bytes`` sums ready sizes.
- ``figures`` reports the queue's figures (:class:`Figures`: ready and pending-ack messages and bytes, and
  how many ready messages are paged out, their content on disk only) for statistics and metrics. It is
  called at a scrape or an API request, never per message, and answers from counters the queue keeps.
- Confirms: every ``confirm`` id given to ``publish`` / ``publish_delivered`` comes back exactly once
  from ``drain_confirmed``. If the message needs no fsync (not persistent, or the queue not durable) it
  is returned by the very next ``drain_confirmed``; otherwise only after the fsync covering the
  message's writes has completed. When confirms become ready that way (asynchronously) the
  implementation calls ``on_confirm()`` (an attribute the owner sets) on the event loop thread; the
  owner then calls ``drain_confirmed``. The owner should also call ``drain_confirmed`` at the end of each
  burst of publishes, for the immediate ones. (An owner may instead confirm transient messages itself
  and pass ``confirm`` only when it must wait for the disk.) Confirms still pending when the queue is
  deleted are released by ``delete_and_terminate``. If the fsync that was to cover a message fails, its
  ``confirm`` comes back from ``drain_failed`` instead (the owner nacks the publisher: the message may
  not be on disk), announced by ``on_confirm()`` in the same way; each id comes back from exactly one of
  the two.
- TTL works at the head only: ``head_expiry`` is the head's stored expiry; ``dropwhile(pred)`` drops
  head messages while ``pred(expiry)`` is true and returns ``(dropped, new head's expiry)``;
  ``fetchwhile(pred)`` instead fetches them with ack required (for dead-lettering). None of the three
  reads a paged-out message from disk except ``fetchwhile`` for the messages it takes. ``peek`` returns
  the head message without taking it (it may read it from disk: the owner uses it only on a slow path).
- ``peek_many(count)`` returns up to ``count`` ready messages as ``(seq_id, msg, is_delivered)`` in the
  order ``fetch`` would take them, changing nothing: no message moves between parts or to/from RAM, no
  delivered flag is set, no counter changes. It reads paged-out messages from disk (the HTTP API's peek,
  a slow path; the caller bounds ``count``). An asynchronous store may answer only the messages it has
  at hand (a prefix of that order, possibly shorter than ``count``), and never waits.
- Availability: ``fetch`` may answer None while ``len()`` is not 0 when the implementation is still
  bringing messages in (an asynchronous store); it then calls ``on_available()`` (an attribute the owner
  sets, like ``on_confirm``) on the event loop thread once they can be fetched, and the owner runs its
  deliveries again. A synchronous store never answers None while it holds ready messages, and never
  calls ``on_available``.
- Demand: ``set_demand(True)`` says the owner has consumers waiting while ``len()`` is 0, ``set_demand(False)``
  that it has none. A store whose messages others may add (a queue every member of a cluster serves) keeps
  looking for them while demand lasts and calls ``on_available`` when it finds some; a store only its owner
  publishes to ignores it.
- Memory: ``set_ram_budget(bytes | None)`` bounds the RAM the queue's ready messages use (None: no
  bound), paging to disk where the implementation can; ``needs_timeout()`` is True while that work is
  unfinished, and the owner then calls ``timeout()`` soon (each call does a bounded step). ``ram_bytes()``
  estimates the RAM the ready messages hold (contents and bookkeeping), for sharing a budget out.
- ``delete_and_terminate`` drops everything, ready and pending ack, releases any storage and returns how
  many messages it dropped. ``close`` is a clean shutdown: a durable queue's persistent messages (ready
  and pending ack) come back on the next start, the pending ones as ready and delivered.

A store shared by a cluster's members (storage/pg/backing_queue.py: every member publishes to it and delivers
from it) needs more of its owner, so the Protocol declares that too, and a store only its own queue process
uses inherits the null members of :class:`LocalStore` (as RabbitMQ's ``rabbit_backing_queue`` declares every
callback and a backend answers the ones it has no use for trivially). ``shared`` says which kind a store is,
read once when the queue process is made, so a node-local queue pays nothing for the others' members:
- ``persists_every_message``: transient messages are stored and confirmed as persistent ones (a quorum queue).
- ``returns(seq_id)``: how often the message ``fetch`` just answered went back before, on any member.
- ``when_fetched(cb)`` / ``when_counted(cb)`` / ``when_purged(cb)``: a basic.get that found nothing at hand,
  a declare-ok's count and a purge-ok's count may wait for PostgreSQL; True means ``cb`` (``cb(count)`` for
  a purge) is called once the store knows, False that the owner answers now from what it has.
- ``set_room(room)``: how many messages the owner's consumers here can take (a reservation takes no more);
  ``hand_back_unused()`` returns rows reserved only to judge the head; ``awaits_fetch()`` says a basic.get
  waits for a reservation (the rows are then kept). ``set_rank(rank)``: the priority of the highest consumers
  here with room, so consumers of higher priority on another member are served first.
- ``want_single_active(wanted)`` / ``sac_active`` / ``on_sac_change``: a single-active-consumer queue's
  cluster-wide lock (only the holder delivers).
- ``deal_here()``: whether a publish may go straight to a consumer here, or is left in the store for other
  members' consumers (their share of the free credit: delivery is fair across members).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

# Bit 127 stays clear: ids with it set are dispatches of delayed messages (storage/dispatch_evidence.py).
_id_base = (int.from_bytes(os.urandom(8), "little") >> 1) << 64
_id_counter = itertools.count(1)


def new_msg_id() -> int:
    """A node-unique message id: a random per-process prefix (so ids never repeat across restarts) and a
    counter. The broker gives one to a message once, before routing it to its queues, so every queue (and
    every store) sees the same id and a shared store keeps one copy."""
    return _id_base | next(_id_counter)


class Figures(NamedTuple):
    """A backing queue's figures (RabbitMQ's backing-queue ``info`` items), as ``figures()`` reports them."""

    ready: int  # ready messages: len()
    unacked: int  # messages pending ack: pending_ack_count()
    ready_bytes: int  # body bytes of the ready messages: ready_bytes()
    unacked_bytes: int  # body bytes of the messages pending ack
    paged_out: int  # ready messages whose content is on disk only, not in RAM (0 for a queue that never pages)

    @property
    def messages(self) -> int:
        return self.ready + self.unacked

    @property
    def bytes(self) -> int:
        return self.ready_bytes + self.unacked_bytes


class BackingQueue(Protocol):
    on_confirm: Callable[[], None] | None
    on_available: Callable[[], None] | None

    def publish(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                confirm: Any = None, msg_id: int | None = None) -> int: ...

    def publish_delivered(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                          confirm: Any = None, msg_id: int | None = None) -> int: ...

    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None: ...

    def ack(self, seq_ids: Iterable[int]) -> list[Any]: ...

    def requeue(self, seq_ids: Iterable[int]) -> None: ...

    def purge(self) -> int: ...

    def len(self) -> int: ...

    def is_empty(self) -> bool: ...

    def pending_ack_count(self) -> int: ...

    def ready_bytes(self) -> int: ...

    def figures(self) -> Figures: ...

    def drain_confirmed(self) -> list[Any]: ...

    def drain_failed(self) -> list[Any]: ...

    def head_expiry(self) -> int | None: ...

    def peek(self) -> Any | None: ...

    def peek_many(self, count: int) -> list[tuple[int, Any, bool]]: ...

    def dropwhile(self, pred: Callable[[int | None], bool]) -> tuple[int, int | None]: ...

    def fetchwhile(self, pred: Callable[[int | None], bool]) -> list[tuple[int, Any, bool]]: ...

    def set_ram_budget(self, max_bytes: int | None) -> None: ...

    def set_demand(self, wanted: bool) -> None: ...

    def needs_timeout(self) -> bool: ...

    def timeout(self) -> None: ...

    def ram_bytes(self) -> int: ...

    def delete_and_terminate(self) -> int: ...

    def close(self) -> None: ...

    def origins_held(self, seqs: set[int]) -> set[int]:
        """Which of the delay store's ``seqs`` this queue received as delayed-message dispatches, acked
        since or not (storage/dispatch_evidence.py). Asked only at recovery, for messages in doubt."""
        ...

    # -- a store shared by a cluster's members (the module docstring); LocalStore's null members elsewhere --
    on_sac_change: Callable[[bool], None] | None

    @property
    def shared(self) -> bool: ...

    @property
    def persists_every_message(self) -> bool: ...

    @property
    def sac_active(self) -> bool: ...

    def returns(self, seq_id: int) -> int: ...

    def when_fetched(self, callback: Callable[[], None]) -> bool: ...

    def when_counted(self, callback: Callable[[], None]) -> bool: ...

    def when_purged(self, callback: Callable[[int], None]) -> bool: ...

    def set_room(self, room: Callable[[int], int]) -> None: ...

    def set_rank(self, rank: Callable[[], int | None]) -> None: ...

    def awaits_fetch(self) -> bool: ...

    def hand_back_unused(self) -> None: ...

    def expect_takes(self, count: int) -> None:
        """The owner's next takes off the head for itself, with no consumer to hand them to (a drop-head's
        excess over max-length; 0: none known): a shared store that has to reserve rows for them reserves that
        many rather than a batch, so that the other members' consumers are not kept from the rows behind."""
        ...

    def want_single_active(self, wanted: bool) -> None: ...

    def deal_here(self) -> bool: ...


class LocalStore:
    """The shared-store members of the Protocol, as a store only its own queue process uses answers them: it
    is not shared, every answer is at hand (nothing to wait for), and its queue's single active consumer is
    the queue process's own choice. Memory and variable queues inherit it, so no caller probes for them."""

    shared = False
    persists_every_message = False
    sac_active = True
    on_sac_change: Callable[[bool], None] | None = None

    def returns(self, seq_id: int) -> int:
        return 0  # the owner counts returns itself (its delivery-count dict)

    def when_fetched(self, callback: Callable[[], None]) -> bool:
        return False

    def when_counted(self, callback: Callable[[], None]) -> bool:
        return False

    def when_purged(self, callback: Callable[[int], None]) -> bool:
        return False

    def set_room(self, room: Callable[[int], int]) -> None:
        pass

    def set_rank(self, rank: Callable[[], int | None]) -> None:
        pass

    def awaits_fetch(self) -> bool:
        return False

    def hand_back_unused(self) -> None:
        pass

    def expect_takes(self, count: int) -> None:
        pass

    def want_single_active(self, wanted: bool) -> None:
        pass

    def deal_here(self) -> bool:
        return True  # nobody else delivers from it
