"""The queue process: one object per queue, the queue's actor (RabbitMQ's ``rabbit_amqqueue_process``).

It owns the queue's backing queue and consumers. Publishing calls :meth:`deliver_or_enqueue` directly
(no task, no future), which does the work in the order seed 003 gives: overflow check (reject-publish),
``attempt_delivery`` to a waiting consumer, else the TTL-0 shortcut or ``publish`` into the backing queue
followed by ``maybe_drop_head`` and ``drop_expired_msgs``. Delivery is pull: :meth:`run_message_queue`
hands ready messages to consumers with room until either runs out, yielding to the loop after a budget so
one busy queue cannot starve the rest.

TTL is enforced at the head only, with one timer per queue (``ensure_ttl_timer``), as RabbitMQ does:
an expired message behind a live one waits, but is never delivered. Each message's deadline is computed
once, when it is enqueued (its ``expiration`` or the queue's TTL, whichever is shorter), and handed to the
backing queue as ``expiry``; the head is then judged by ``head_expiry`` and expired messages leave by
``dropwhile`` (or ``fetchwhile`` when they are dead-lettered), so a paged-out head is never read from disk
just to learn that it is still alive. Only after a policy changed the TTL of a queue holding messages (their
deadlines were computed with the old one) does the queue judge its head by reading it
(``_ttl_from_messages``), until the messages of before the change are gone.

Time comes from the vhost's clock (broker/clock.py): message timestamps, TTL deadlines and timers, and the
queue's own expiry (``x-expires``), so a test moves time with a ManualClock instead of sleeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from broker.message import Message
from broker.publish import ROUTED
from broker.queues import dead_letter
from broker.queues.confirm_book import ConfirmBook
from broker.queues.credit_flow import DELIVER_BACKLOG_HIGH, DELIVER_BACKLOG_LOW, FLOW_HIGH, FLOW_LOW
from broker.queues.queue_args import QueueSettings
from broker.queues.queue_consumers import Consumer, ConsumerSet
from broker.queues.queue_info import CLASSIC, ConsumerGroups, QueueCapabilities
from broker.queues.queue_shell import (
    ACCEPTED,
    CONFIRM_LATER,
    DELIVERY_BUDGET,
    REJECTED,
    QueueHost,
    QueueOwner,
    QueueShell,
    take_one_by_one,
)
from broker.resources import memory_budget
from protocol.properties import Long, with_properties
from storage.backing_queue import BackingQueue, Figures

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.clock import TimerHandle


class QueueProcess(QueueShell):
    """A classic queue's process over its backing queue; the quorum queue of one node subclasses it, the stream
    stands beside it (broker/queues/queue_types.py), both on broker/queues/queue_shell.py's QueueShell.

    The backing queue is private: callers outside use the queue's own methods (``figures``, ``purge``,
    ``set_ram_budget``...), so a queue type may hold its messages any way it likes."""

    # The queue type's name (``x-queue-type``), and whether the queue counts every message's returns
    # (quorum queues do, for the ``x-delivery-count`` header, whether or not a delivery limit is set).
    type_name: ClassVar[str] = "classic"
    counts_deliveries: ClassVar[bool] = False
    capabilities: ClassVar[QueueCapabilities] = CLASSIC  # (broker/queues/queue_info.py)
    confirms: ConfirmBook
    # Class-level until set (QueueShell's note: an idle queue's instance dictionary stays small).
    has_had_consumers = False
    _consumers_full = False  # the deliver loop last stopped because no consumer had room
    _ttl_timer: TimerHandle | None = None
    _ttl_timer_at = 0.0
    _expiry_timer: TimerHandle | None = None

    def __init__(self, vhost: QueueHost, name: str, durable: bool, exclusive_owner: QueueOwner | None,
                 auto_delete: bool, arguments: dict[str, Any], bq: BackingQueue,
                 settings: QueueSettings) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments, settings,
                         ConsumerSet(single_active=settings.single_active_consumer), ConfirmBook())
        self.bq = bq
        self._occupied = vhost.queues.occupied  # joined on every publish (QueueRegistry.occupied)
        self._ram_budget_given: int | None | bool = False  # the last set_ram_budget (False: none yet)
        bq.on_confirm = self.on_confirmed
        bq.on_available = self._store_brought_messages  # an asynchronous store has brought messages in
        # A single-active-consumer queue whose store is shared by a cluster's members: only the member holding
        # the queue's lock delivers (its first consumer is the active one), so one consumer is active
        # cluster-wide (storage/pg/cluster.py SAC_KEY).
        # (``bq.shared`` is read here, once: a node-local store's null members are then never called.)
        self._sac_store: BackingQueue | None = bq if settings.single_active_consumer and bq.shared else None
        if self._sac_store is not None:
            bq.on_sac_change = lambda _active: self.schedule_run()
        # A store others deliver from too (a cluster's quorum queue): rows it brought in that no consumer here
        # has room for (reserved to judge the head: TTL, drop-head) go back at once.
        self._hand_back_unused: Callable[[], None] | None = bq.hand_back_unused if bq.shared else None
        # ... and reserves no more than this member's consumers can take (their free prefetch).
        bq.set_room(self.consumers.room)
        # ... and holds back while another member's consumers of higher priority have room (x-priority ranks
        # consumers queue-wide, as RabbitMQ's quorum queue does).
        bq.set_rank(self.consumers.rank)
        # ... and deals a publish made here to this member's consumers only for their share of the cluster's
        # free credit (the rest is left to other members' consumers: issue 35). Not for a single active
        # consumer: its cluster-wide lock says which member delivers.
        self._deal: Callable[[], bool] | None = (
            bq.deal_here if bq.shared and not settings.single_active_consumer else None)
        recovered = not bq.is_empty()
        # Whether any message may carry a deadline (a recovered queue's may: their expiries were stored).
        self._ttl_possible = settings.message_ttl is not None or recovered
        # Judge the head by its message rather than its stored expiry (see the module docstring): recovered
        # messages of a TTL queue may have been stored without one.
        self._ttl_from_messages = settings.message_ttl is not None and recovered
        # Returns so far, by seq_id, for queues with a delivery limit (and quorum queues).
        self._delivery_counts: dict[int, int] | None = (
            {} if settings.delivery_limit is not None or self.counts_deliveries else None)
        # A store shared by several nodes (a cluster's quorum queue, storage/pg) counts the returns itself,
        # whichever node delivered the message then: ``returns(seq_id)`` of the message just fetched. Then
        # the dict above holds only the messages delivered here and not yet settled.
        self._store_returns: Callable[[int], int] | None = bq.returns if bq.shared else None
        # Such a store keeps every message as persistent, transient ones too, so a confirm means stored (as a
        # quorum queue confirms every message once a quorum has it).
        self._persist_all = bq.persists_every_message
        self.reset_expiry_timer()

    # -- settings that can change (policies) ---------------------------------------------------------------
    def apply_settings(self, settings: QueueSettings) -> None:
        """A policy changed: take the new limits at once (TTL, length, expiry, delivery limit)."""
        settings.max_priority = self.settings.max_priority
        settings.single_active_consumer = self.settings.single_active_consumer
        settings.queue_type = self.settings.queue_type
        if settings.message_ttl != self.settings.message_ttl and (
                not self.bq.is_empty() or self.bq.pending_ack_count()):
            # The messages held now have deadlines of the old TTL: judge them by reading them.
            self._ttl_from_messages = self._ttl_possible = True
        self.settings = settings
        if settings.message_ttl is not None:
            self._ttl_possible = True
        if self._delivery_counts is None and settings.delivery_limit is not None:
            self._delivery_counts = {}
        self.reset_expiry_timer()
        self.maybe_drop_head()
        self.drop_expired_msgs()

    # -- publishing ------------------------------------------------------------------------------------
    def deliver_or_enqueue(self, msg: Message, persistent: bool, confirm: Any = None) -> int:
        """Hand a routed message to a waiting consumer, or enqueue it (seed 003's order of work).

        ``persistent`` means persistent in this queue (a durable one). ``confirm`` is the publisher's
        confirm token, if it wants one: a persistent message is confirmed only after the fsync that covers
        it (CONFIRM_LATER, then :meth:`on_confirmed`); anything else at once (ACCEPTED). REJECTED when the
        queue refuses the message (overflow reject-publish): the publisher is nacked."""
        self.stats.published += 1
        self._occupied.add(self)
        settings = self.settings
        if settings.overflow != "drop-head" and self._will_overflow(msg):
            self.stats.rejected_publishes += 1
            if settings.overflow == "reject-publish-dlx":
                self.dead_letter_msgs([msg], dead_letter.MAXLEN)
            return REJECTED
        if self._persist_all:
            persistent = True
        if confirm is not None and persistent:
            self.confirms.add(confirm)
        else:
            confirm = None
        if settings.message_ttl is None and msg.expiration_ms is None:
            expiry = None
        else:
            expiry = self._expiry_of(msg)
            self._ttl_possible = True
        if self.attempt_delivery(msg, persistent, confirm, expiry):
            return CONFIRM_LATER if confirm is not None else ACCEPTED
        if settings.message_ttl == 0 and settings.dlx is None:
            # RabbitMQ's shortcut for x-message-ttl 0 without a dead-letter exchange: nobody could take it
            # now and it may not wait, so it is discarded rather than enqueued. Any other expired message
            # (an expiration of "0" included) is enqueued, counts towards the length, and expires when it
            # reaches the head: TTL applies at the head only.
            self.stats.expired += 1
            if confirm is not None:
                self.confirms.discard(confirm)
            return ACCEPTED
        self.bq.publish(msg, len(msg.body), persistent, expiry, confirm, msg.msg_id)
        if settings.max_length is not None or settings.max_length_bytes is not None:
            self.maybe_drop_head()
        if self._ttl_possible:
            self.drop_expired_msgs()
        return CONFIRM_LATER if confirm is not None else ACCEPTED

    def deliver_or_enqueue_run(self, msgs: list[Message], persistent: bool, publisher: Any, first_seq: int
                               ) -> list[int]:
        """A run (broker/amqp/publish_run.py). Transient messages into an empty queue without limits or TTL,
        with consumers waiting, go straight to them as :meth:`attempt_delivery` hands each (the consumers taken
        in turn, each while it has room), with the checks made once; from the first message no consumer has
        room for, and for any other run, message by message through :meth:`deliver_or_enqueue`."""
        settings = self.settings
        if (persistent or self._persist_all or settings.max_length is not None
                or settings.max_length_bytes is not None or settings.message_ttl is not None
                or msgs[0].expiration_ms is not None  # (a run shares its properties: its TTL too)
                or not self.consumers.count or self._sac_store is not None or self._deal is not None
                or not self.bq.is_empty()):
            return take_one_by_one(self.deliver_or_enqueue, msgs, persistent, publisher, first_seq)
        self._occupied.add(self)
        stats = self.stats
        next_with_room = self.consumers.next_with_room
        bq = self.bq
        for i, msg in enumerate(msgs):
            consumer = next_with_room()
            if consumer is None:
                rest = msgs[i:]
                return [ACCEPTED] * i + take_one_by_one(self.deliver_or_enqueue, rest, persistent, publisher,
                                                        first_seq + i if first_seq else 0)
            stats.published += 1
            seq_id = -1 if consumer.no_ack else bq.publish_delivered(msg, len(msg.body), False, None, None,
                                                                      msg.msg_id)
            stats.delivered += 1
            consumer.channel.deliver(consumer, self, seq_id, msg, False)
        return [ACCEPTED] * len(msgs)

    # -- publisher confirms and credit flow ----------------------------------------------------------------
    def on_confirmed(self) -> None:
        """The backing queue's fsync covered some persistent messages: confirm them to their publishers
        (or nack them, where the fsync failed)."""
        self.confirms.settle(self.bq.drain_confirmed(), True)
        self.confirms.settle(self.bq.drain_failed(), False)  # their fsync failed: the publisher is nacked
        if self.flow:
            self.maybe_release_publishers()

    def maybe_release_publishers(self) -> None:
        """Down to :data:`FLOW_LOW` owed confirms, and the deliver loop caught up (or its consumers full)."""
        if len(self.confirms) > FLOW_LOW:
            return
        if self.bq.len() > DELIVER_BACKLOG_LOW and self.consumers.count and not self._consumers_full:
            return
        self.release_publishers()

    @property
    def overloaded(self) -> bool:
        """Whether the publisher that just handed over a message should wait (credit flow): too many of
        the queue's publishes await their fsync, or its consumers have room but the deliver loop lags."""
        if len(self.confirms) > FLOW_HIGH:
            return True
        if not self.consumers.count or self.bq.len() <= DELIVER_BACKLOG_HIGH:
            return False
        if not self.consumers.any_with_room():
            return False
        self.schedule_run()  # the deliver loop is what releases the publisher again
        return True

    def attempt_delivery(self, msg: Message, persistent: bool, confirm: Any = None,
                         expiry: int | None = None) -> bool:
        """Deliver straight to a consumer when nothing is queued ahead of the message (``expiry``: its
        deadline, kept in case it is requeued)."""
        if not self.consumers.count or not self.bq.is_empty():
            return False
        if self._sac_store is not None and not self._sac_store.sac_active:
            return False  # another member's consumer is the active one: the message goes by the store
        if self._deal is not None and not self._deal():
            return False  # other members' consumers' share: the message goes by the store, left to them
        consumer = self.consumers.next_with_room()
        if consumer is None:
            return False
        if consumer.no_ack and confirm is None:
            seq_id = -1
        elif confirm is None:
            seq_id = self.bq.publish_delivered(msg, len(msg.body), persistent, expiry, None, msg.msg_id)
        else:
            # Written (and fsynced) even though a consumer has it: the confirm promises it is on disk.
            seq_id = self.bq.publish_delivered(msg, len(msg.body), persistent, expiry, confirm, msg.msg_id)
            if consumer.no_ack:
                self.bq.ack([seq_id])
                seq_id = -1
        self.stats.delivered += 1
        consumer.channel.deliver(consumer, self, seq_id, msg, False)
        return True

    def _will_overflow(self, msg: Message) -> bool:
        s = self.settings
        if s.max_length is not None and self.bq.len() >= s.max_length:
            return True
        return s.max_length_bytes is not None and self.bq.ready_bytes() + len(msg.body) > s.max_length_bytes

    def _store_brought_messages(self) -> None:
        """An asynchronous store (a cluster's quorum queue in PostgreSQL) has the head at hand now. What
        found nothing at hand when it looked acts now: a drop-head when the queue went over its limit (the
        rows were still in the store, or another member's publishes made it overflow), and the TTL check of
        the head (expired: dropped or dead-lettered; else its timer armed), which the deliver loop makes only
        when there are consumers. With no consumer here that has room, what is left goes back to the store at
        once (a basic.get waiting keeps it). Then deliveries."""
        s = self.settings
        if s.overflow == "drop-head" and (s.max_length is not None or s.max_length_bytes is not None):
            self.maybe_drop_head()
        if self._ttl_possible:
            self.drop_expired_msgs()
        if self._hand_back_unused is not None and not self.consumers.any_with_room():
            # Held here, the rows would wait for the idle prefix's return (2 s), or for a full consumer, while
            # other members' consumers and gets found nothing (a publisher's member reserving to judge the
            # TTL; a member whose consumers filled their prefetch meanwhile).
            self._hand_back_unused()
        self.schedule_run()

    def maybe_drop_head(self) -> None:
        """drop-head overflow: drop (or dead-letter, reason maxlen) the oldest ready messages."""
        s = self.settings
        if s.overflow != "drop-head" or (s.max_length is None and s.max_length_bytes is None):
            return
        bq = self.bq
        excess = bq.len() - s.max_length if s.max_length is not None else 0
        if excess <= 0 and (s.max_length_bytes is None or bq.ready_bytes() <= s.max_length_bytes):
            return  # (the common case, at every publish: nothing to drop, nothing to tell the store)
        # The excess by count, for a shared store that must reserve the head first (by bytes it is not known).
        bq.expect_takes(max(excess, 0))
        dropped: list[Message] = []
        while (s.max_length is not None and bq.len() > s.max_length) or \
                (s.max_length_bytes is not None and bq.ready_bytes() > s.max_length_bytes):
            got = bq.fetch(False)
            if got is None:
                break
            self._forget(got[0])
            dropped.append(got[1])
        if dropped:
            self.stats.dropped += len(dropped)
            self.dead_letter_msgs(dropped, dead_letter.MAXLEN)

    # -- TTL -------------------------------------------------------------------------------------------
    def _expires_at(self, msg: Message) -> float | None:
        """The message's deadline under the queue's current TTL: the shorter of it and its ``expiration``."""
        ttl = self.settings.message_ttl
        mttl = msg.expiration_ms
        if mttl is not None and (ttl is None or mttl < ttl):
            ttl = mttl
        return None if ttl is None else msg.published_at + ttl

    def _expiry_of(self, msg: Message) -> int | None:
        """The deadline stored with the message, in whole ms as RabbitMQ keeps it (rounded down: a TTL of 0
        has expired by the time it is looked at)."""
        at = self._expires_at(msg)
        return None if at is None else int(at)

    def drop_expired_msgs(self) -> None:
        """Drop (or dead-letter) expired messages at the head; arm the timer for the next head.

        Judged by the deadlines the backing queue keeps (``head_expiry``), so a paged-out head is not read;
        messages are read only to dead-letter them (``fetchwhile``)."""
        if not self._ttl_possible or self.deleted:
            return
        bq = self.bq
        if self._ttl_from_messages:
            if bq.is_empty() and not bq.pending_ack_count():
                self._ttl_from_messages = False  # every message of before the TTL change is gone
            else:
                self._drop_expired_by_reading()
                return
        expiry = bq.head_expiry()
        if expiry is None:
            return
        now = self._clock.now_ms()
        if expiry > now:
            self.ensure_ttl_timer(expiry)
            return

        def expired(e: int | None) -> bool:
            return e is not None and e <= now

        if self.settings.dlx is None and not self._delivery_counts and self.vhost.tracing is None:
            # Nobody needs the messages (no dead-lettering, no trace event): drop them unread.
            dropped, expiry = bq.dropwhile(expired)
            self.stats.expired += dropped
        else:
            fetched = bq.fetchwhile(expired)
            seq_ids = [seq_id for seq_id, _, _ in fetched]
            for seq_id in seq_ids:
                self._forget(seq_id)
            bq.ack(seq_ids)
            self.stats.expired += len(fetched)
            self.dead_letter_msgs([m for _, m, _ in fetched], dead_letter.EXPIRED)
            expiry = bq.head_expiry()
        if expiry is not None:
            self.ensure_ttl_timer(expiry)

    def _drop_expired_by_reading(self) -> None:
        """The slow path after a TTL change: each head message's deadline under the current TTL."""
        bq = self.bq
        now = self._clock.now_ms()
        expired: list[Message] = []
        next_expiry = None
        while True:
            head = bq.peek()
            if head is None:
                break
            expires_at = self._expires_at(head)
            if expires_at is None:
                break
            if expires_at > now:
                next_expiry = expires_at
                break
            got = bq.fetch(False)
            if got is None:
                break
            self._forget(got[0])
            expired.append(got[1])
        if expired:
            self.stats.expired += len(expired)
            self.dead_letter_msgs(expired, dead_letter.EXPIRED)
        if next_expiry is not None:
            self.ensure_ttl_timer(next_expiry)

    def ensure_ttl_timer(self, at_ms: float) -> None:
        if self._ttl_timer is not None:
            if self._ttl_timer_at <= at_ms:
                return
            self._ttl_timer.cancel()
        self._ttl_timer_at = at_ms
        delay = max(0.0, (at_ms - self._clock.now_ms()) / 1000.0) + 0.001
        self._ttl_timer = self._clock.call_later(delay, self._ttl_timer_fired)

    def _ttl_timer_fired(self) -> None:
        self._ttl_timer = None
        self.drop_expired_msgs()

    # -- queue expiry (x-expires) ------------------------------------------------------------------------
    def reset_expiry_timer(self) -> None:
        """Renew the lease of an x-expires queue: on declare, consume, basic.get and policy change."""
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        expires = self.settings.expires
        if expires is not None and not self.deleted:
            self._expiry_timer = self._clock.call_later(expires / 1000.0, self._expiry_timer_fired)

    def _expiry_timer_fired(self) -> None:
        self._expiry_timer = None
        if self.deleted:
            return
        if self.consumers.count:
            self.reset_expiry_timer()  # in use: look again one period later
            return
        # An expired queue is deleted with its messages; they are not dead-lettered (RabbitMQ's rule).
        self.vhost.queues.delete(self, reason="expired")

    # -- dead-lettering ----------------------------------------------------------------------------------
    def dead_letter_msgs(self, msgs: list[Message], reason: str) -> None:
        """Republish to the dead-letter exchange, if there is one (at most once, as classic queues do),
        through the vhost's one publish path (which drops a dead letter that would come back to a queue it
        already died in: dead_letter.is_cycle)."""
        dlx_name = self.settings.dlx
        vhost = self.vhost
        tracer = vhost.tracing
        if tracer is not None and msgs:
            tracer.dead_lettered(self.name, msgs, reason, dlx_name)
        if dlx_name is None or not msgs:
            return
        exchange = vhost.default_exchange if dlx_name == "" else vhost.exchanges.get(dlx_name)
        if exchange is None:
            return
        now = self._clock.now_ms()
        if vhost.counters is not None:
            vhost.counters.dead_lettered(reason, len(msgs))
        for msg in msgs:
            dead = dead_letter.make_dead_letter(msg, self.name, reason, dlx_name, self.settings.dlrk, now)
            if vhost.publish(exchange, dead, dead.props.delivery_mode == 2, dead_letter=True) & ROUTED:
                self.stats.dead_lettered += 1

    # -- delivering --------------------------------------------------------------------------------------
    def run_message_queue(self) -> None:
        self._run_scheduled = False
        if self.deleted:
            return
        bq = self.bq
        if self._sac_store is not None and not self._sac_store.sac_active:
            return  # another member's consumer is the active one
        consumers = self.consumers
        stats = self.stats
        budget = DELIVERY_BUDGET
        self._consumers_full = False
        while budget and not bq.is_empty():
            consumer = consumers.next_with_room()
            if consumer is None:
                self._consumers_full = True
                if self._ttl_possible:
                    self.drop_expired_msgs()  # the head waits for room: its expiry needs its timer
                if self.flow:
                    self.release_publishers()
                return
            if self._ttl_possible:
                self.drop_expired_msgs()
                if bq.is_empty():
                    return
            fetched = bq.fetch(not consumer.no_ack)
            if fetched is None:
                return
            seq_id, msg, redelivered = fetched
            stats.delivered += 1
            if redelivered:
                stats.redelivered += 1
                if self._delivery_counts is not None:
                    msg = self._with_delivery_count(seq_id, msg)
            if consumer.no_ack:
                self._forget(seq_id)
                seq_id = -1
            consumer.channel.deliver(consumer, self, seq_id, msg, redelivered)
            budget -= 1
        if self._ttl_possible:
            self.drop_expired_msgs()  # the new head's expiry needs its timer (consumers may be full now)
        if self.flow:
            self.maybe_release_publishers()
        if not budget and not bq.is_empty():
            self.schedule_run()
        elif bq.is_empty() and consumers.count:
            bq.set_demand(True)  # a store others publish to looks for their messages meanwhile

    def _with_delivery_count(self, seq_id: int, msg: Message) -> Message:
        counts = self._delivery_counts
        if counts is None:
            return msg
        if self._store_returns is not None:
            count = self._store_returns(seq_id)
            if count:
                counts[seq_id] = count  # the next return counts from here (delivery limit)
        else:
            count = counts.get(seq_id, 0)
        if not count:
            return msg
        return msg.with_header(with_properties(msg.header, headers_set={"x-delivery-count": Long(count)}))

    def basic_get(self, no_ack: bool) -> tuple[int, Message, bool, int] | None:
        """Take one message for basic.get: (seq_id, message, redelivered, ready messages left)."""
        self.reset_expiry_timer()
        if self._ttl_possible:
            self.drop_expired_msgs()
        fetched = self.bq.fetch(not no_ack)
        if fetched is None:
            return None
        seq_id, msg, redelivered = fetched
        self.stats.get += 1
        if redelivered:
            self.stats.redelivered += 1
            if self._delivery_counts is not None:
                msg = self._with_delivery_count(seq_id, msg)
        if no_ack:
            self._forget(seq_id)
        if self._ttl_possible:
            self.drop_expired_msgs()  # a new head: expire it now or arm the timer for it
        return seq_id, msg, redelivered, self.bq.len()

    def basic_get_wait(self, retry: Callable[[], None]) -> bool:
        """basic.get found nothing at hand (``basic_get`` answered None): whether to wait before answering
        get-empty. A store shared by a cluster's members (storage/pg) holds its rows in PostgreSQL and reserves
        them asynchronously, so "nothing at hand" does not mean an empty queue (another member may have
        published, or this one's rows are still being reserved); it then reserves at once and calls ``retry``
        when that round is over (at most a second later), and the caller asks ``basic_get`` again and answers
        what that says. False (no call): answer get-empty now."""
        return not self.deleted and self.bq.when_fetched(retry)

    def message_count_wait(self, answer: Callable[[], None]) -> bool:
        """Whether a queue.declare-ok should wait before it reads ``message_count``: a store shared by a
        cluster's members (storage/pg) knows other members' publishes only by recounting, so it recounts now and
        calls ``answer`` once that is done (at most a second later), and the count then includes every message
        another member confirmed before the declare came. False (no call): answer now."""
        return not self.deleted and self.bq.when_counted(answer)

    def peek_messages(self, count: int) -> list[tuple[Message, bool]]:
        """The first ``count`` ready messages and their redelivered flags, in delivery order, left exactly
        where they are (the HTTP API's peek: no delivery, no counter, no TTL or expiry timer touched)."""
        return [(msg, delivered) for _, msg, delivered in self.bq.peek_many(count)]

    # -- acknowledgements --------------------------------------------------------------------------------
    def _forget(self, seq_id: int) -> None:
        if self._delivery_counts:
            self._delivery_counts.pop(seq_id, None)

    def ack(self, seq_ids: list[int]) -> None:
        if self.deleted:
            return
        if self._delivery_counts:
            for seq_id in seq_ids:
                self._delivery_counts.pop(seq_id, None)
        acked = self.bq.ack(seq_ids)
        self.stats.acked += len(acked)
        tracer = self.vhost.tracing
        if tracer is not None:
            tracer.acked(self.name, acked)  # here, not in the channel: the queue has the messages

    def requeue(self, seq_ids: list[int]) -> None:
        """Back to their original places, marked redelivered; over the delivery limit they die instead."""
        if self.deleted:
            return
        counts = self._delivery_counts
        if counts is not None:
            limit = self.settings.delivery_limit
            over = []
            for seq_id in seq_ids:
                n = counts.get(seq_id, 0) + 1
                counts[seq_id] = n
                if limit is not None and n > limit:
                    over.append(seq_id)
            if over:
                for seq_id in over:
                    counts.pop(seq_id, None)
                self.dead_letter_msgs(self.bq.ack(over), dead_letter.DELIVERY_LIMIT)
                dead = set(over)
                seq_ids = [s for s in seq_ids if s not in dead]
            if self._store_returns is not None:  # the store counts this return; whoever delivers it next reads it
                for seq_id in seq_ids:
                    counts.pop(seq_id, None)
        self.bq.requeue(seq_ids)
        if self.settings.max_length is not None or self.settings.max_length_bytes is not None:
            self.maybe_drop_head()
        if self._ttl_possible:
            self.drop_expired_msgs()
        self.schedule_run()

    def reject_discard(self, seq_ids: list[int]) -> None:
        """basic.reject / nack with requeue=false: dead-letter (reason rejected) or drop."""
        if self.deleted:
            return
        if self._delivery_counts:
            for seq_id in seq_ids:
                self._delivery_counts.pop(seq_id, None)
        msgs = self.bq.ack(seq_ids)
        self.dead_letter_msgs(msgs, dead_letter.REJECTED)

    # -- consumers -----------------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.add(consumer)
        if self.consumers.count == 1:
            memory_budget.consumers_changed(self)  # a consumed queue's default budget is larger
            if self._sac_store is not None:
                self._sac_store.want_single_active(True)
        if consumer.exclusive:
            self.exclusive_consumer = consumer
        self.has_had_consumers = True
        self.reset_expiry_timer()
        self.schedule_run()

    def remove_consumer(self, consumer: Consumer) -> None:
        if not self.consumers.remove(consumer):
            return
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None
        if self.flow and not self.consumers.count:
            self.maybe_release_publishers()
        if not self.consumers.count:
            memory_budget.consumers_changed(self)
            self.bq.set_demand(False)
            if self._sac_store is not None:
                self._sac_store.want_single_active(False)
        if self.auto_delete and not self.consumers.count and self.has_had_consumers and not self.deleted:
            self.vhost.queues.delete(self, reason="auto_delete")
            return
        self.reset_expiry_timer()
        self.schedule_run()

    # -- queue-wide operations -------------------------------------------------------------------------------
    def message_count(self) -> int:
        return self.bq.len()

    # -- memory (broker/resources/memory_budget.py's PagedQueue) ------------------------------------------------------
    def set_ram_budget(self, max_bytes: int | None) -> None:
        """Bound the RAM this queue's ready messages use (None: no bound); paging is done by :meth:`page`.
        The same budget again for an empty queue changes nothing and is skipped: the memory budget hands
        every queue its default once a second, and with 10,000 idle queues that alone took 20 % of a core."""
        if max_bytes == self._ram_budget_given and self.bq.is_empty():
            return
        self._ram_budget_given = max_bytes
        self.bq.set_ram_budget(max_bytes)

    def ram_bytes(self) -> int:
        return self.bq.ram_bytes()

    def needs_paging(self) -> bool:
        return self.bq.needs_timeout()

    def page(self) -> None:
        """One bounded step of paging towards the budget."""
        self.bq.timeout()

    def origins_held(self, seqs: set[int]) -> set[int]:
        """Which delayed-message dispatches (delay-store seqs) this queue received (recovery only)."""
        return self.bq.origins_held(seqs)

    def consumer_groups(self) -> ConsumerGroups | None:
        """None: a classic or quorum queue has no consumer groups (broker/queues/queue_info.py)."""
        return None

    def figures(self) -> Figures:
        """The queue's message figures (ready, unacked, their bytes, paged out), for the HTTP API and metrics:
        asked of the backing queue at a scrape or a request, never per message."""
        return self.bq.figures()

    def info_items(self, node_name: str) -> dict[str, Any]:
        """The items this type adds to a queue's info (broker/queues/queue_info.py): none beyond the common ones."""
        return {}

    def purge(self) -> int:
        return self.bq.purge()

    def purge_count_wait(self, answer: Callable[[int], None]) -> bool:
        """Whether purge-ok should wait for the purge just made: a store shared by a cluster's members purges
        in PostgreSQL later, and calls ``answer(count)`` once it has (the rows it removed, other members'
        publishes included). False (no call): the purge is done, answer now."""
        return self.bq.when_purged(answer)

    def terminate(self) -> int:
        """The queue is being deleted: cancel consumers (notifying their clients) and drop the messages.
        Publishes still waiting for their fsync are confirmed: the queue has dealt with them."""
        self._end()
        for timer in (self._ttl_timer, self._expiry_timer):
            if timer is not None:
                timer.cancel()
        return self.bq.delete_and_terminate()
