"""Queue types (RabbitMQ's ``rabbit_queue_type``): what kind of queue ``x-queue-type`` asks for, chosen from
one registry, :data:`QUEUE_TYPES`.

A queue type answers two questions for the queue registry (broker/queues/amqqueue.py): may a queue of this type be
declared with these properties (``check_declare``: RabbitMQ's ``rabbit_queue_type:declare`` refusals), and
what object is such a queue (``new_queue``). That object is the :class:`Queue` seam: the members the rest of
the broker (channel, delegate, vhost, management, metrics, memory budget) uses, in RabbitMQ's terms:

- **deliver**: ``deliver_or_enqueue`` (with ``overloaded`` / ``throttle`` for credit flow); ``dedup``, the
  queue's message-deduplication cache, checked before it by broker/queues/delegate.py for every queue type;
- **consume**: ``add_consumer`` / ``remove_consumer``, and ``schedule_run`` when a consumer gets room;
- **settle**: ``ack``, ``requeue``, ``reject_discard``;
- **dequeue**: ``basic_get``;
- **info / figures**: ``figures``, ``message_count``, ``awaiting_confirm``, ``stats``, ``consumers``,
  ``type_name``, ``capabilities``, ``info_items`` and ``consumer_groups`` (a stream's; None for other types),
  which the HTTP API and metrics read instead of testing the queue's class;
- **lifecycle**: ``apply_settings`` (policies), ``reset_expiry_timer``, ``purge``, ``terminate``;
- **memory**: ``set_ram_budget``, ``ram_bytes``, ``needs_paging``, ``page`` (no-ops for a queue holding no RAM).

Nobody outside a queue touches its backing queue, or names its class: the queue registry maps names to
:class:`Queue`. Classic and quorum queues are both
broker/queues/queue_process.py's QueueProcess over a backing queue built by :func:`new_backing_queue` (plain,
or one per priority); a quorum queue differs (on one node) only in its declare rules and in counting every
message's returns (``x-delivery-count``). A stream is broker/queues/stream_queue.py's StreamQueue over a log
(storage/stream_log.py), beside QueueProcess rather than under it. Both are broker/queues/queue_shell.py's
QueueShell around their store: identity, consumers, counters, credit flow towards publishers, the confirms
owed and the deliver loop's scheduling are written once there.

**Adding a queue type** (a stream, say) is one new class and one registry line::

    class StreamQueueType:
        name = "stream"

        def check_declare(self, where, durable, exclusive, auto_delete): ...  # 406 as RabbitMQ's stream does

        def new_queue(self, vhost, name, durable, owner, auto_delete, arguments, settings, open_store):
            return StreamQueue(...)  # any class with the members of ``Queue`` (its own log, offsets...)

    QUEUE_TYPES = {..., "stream": StreamQueueType()}

(The registry also tells broker/queues/queue_args.py which ``x-queue-type`` values a declare may name.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from broker.errors import AMQPError
from broker.queues import queue_args
from broker.queues.queue_args import QueueSettings
from broker.queues.queue_consumers import Consumer, ConsumerSet
from broker.queues.queue_info import QUORUM, ConsumerGroups, QueueCapabilities
from broker.queues.queue_process import QueueProcess
from broker.queues.queue_shell import QueueHost, QueueOwner, QueueStats
from broker.queues.stream_queue import StreamQueueType
from broker.resources.memory_budget import PagedQueue
from protocol.constants import NOT_IMPLEMENTED
from storage.backing_queue import BackingQueue, Figures
from storage.memory_queue import MemoryBackingQueue
from storage.priority_queue import PriorityBackingQueue

if TYPE_CHECKING:
    from broker.deduplication import DedupCache
    from broker.message import Message

# Opens one store-backed queue: (queue name, durable, priority or None, on_confirm) → BackingQueue. The node
# hands the registry one once its storage is open (broker/persistence.py BackingQueueFactory); until then
# queues are in memory (:func:`memory_store`). The store is the node's choice; the queue type's is above it.
OpenStore = Callable[..., BackingQueue]


def memory_store(name: str, durable: bool, priority: int | None = None,
                 on_confirm: Callable[[], None] | None = None) -> BackingQueue:
    """The store of a node without storage (tests, before start): everything in RAM."""
    return MemoryBackingQueue()


def _message_priority(msg: Message) -> int:
    return msg.props.priority


def new_backing_queue(open_store: OpenStore, name: str, durable: bool, settings: QueueSettings) -> BackingQueue:
    """The one place a queue's backing queue is built: one store-backed queue, or, for ``x-max-priority``,
    a PriorityBackingQueue of one per priority (RabbitMQ's ``rabbit_priority_queue`` wrapping). The queue
    process sets its ``on_confirm`` / ``on_available`` callbacks itself."""
    if settings.max_priority:
        levels = [open_store(name, durable, p, None) for p in range(settings.max_priority + 1)]
        # (Over a cluster's shared store, a priority quorum queue, it is shared and passes those calls on.)
        return PriorityBackingQueue(settings.max_priority, _message_priority, levels.__getitem__)
    return open_store(name, durable, None, None)


class Queue(PagedQueue, Protocol):
    """What the broker outside a queue may use of it (see the module docstring): the queue registry maps names to
    this, and the channel, delegate, vhost, persistence, the HTTP API and metrics read nothing else. QueueProcess
    (classic, quorum) and StreamQueue are two; a new queue type offers these members and nothing is switched on
    its class."""

    name: str
    vhost: QueueHost
    """The vhost the queue lives in (its clock, policies, the publish path for dead letters)."""
    durable: bool
    auto_delete: bool
    exclusive_owner: QueueOwner | None
    """The connection an exclusive queue belongs to; None for any other queue."""
    arguments: dict[str, Any]
    """The arguments it was declared with, as the client sent them (shown, compared on redeclare, persisted)."""
    settings: QueueSettings
    """Its effective settings: arguments, policy and operator policy merged (broker/queues/queue_args.py)."""
    stats: QueueStats
    """Its plain-integer counters (published, delivered, acked...), read by the HTTP API and metrics."""
    consumers: ConsumerSet
    """Its consumers (count, single-active consumer), read by declare-ok, the HTTP API and metrics."""
    exclusive_consumer: Consumer | None
    publisher_channels: set[Any]
    """The channels that published to it and are open (the HTTP API's and metrics' ``publishers``)."""
    deleted: bool
    type_name: ClassVar[str]
    """Its ``x-queue-type`` as the HTTP API shows it ("classic", "quorum", "stream")."""
    remote: ClassVar[bool]
    """Whether this is another cluster member's queue, seen from here (broker/clustering/remote_queue.py's
    RemoteQueue): publishing to it forwards; it is not consumed, counted or listed here. False for every queue
    type's own."""
    capabilities: ClassVar[QueueCapabilities]
    """What the type offers and which info items it reports (broker/queues/queue_info.py): the channel, the HTTP
    API, ctl and metrics read these instead of switching on classes."""
    dedup: DedupCache | None
    """Message deduplication (broker/deduplication.py): set by the queue registry, checked by
    broker/queues/delegate.py before deliver_or_enqueue, so a queue type needs nothing of its own for it."""

    # deliver
    def deliver_or_enqueue(self, msg: Message, persistent: bool, confirm: Any = None) -> int:
        """Take one published message: REJECTED, ACCEPTED, or CONFIRM_LATER (its confirm comes once stored)."""
        ...

    def deliver_or_enqueue_run(self, msgs: list[Message], persistent: bool, publisher: Any, first_seq: int
                               ) -> list[int]:
        """A run of messages routed alike and alike in what a queue reads of their properties (delivery mode,
        expiration, priority, a stream's filter value: broker/queues/delegate.py's ``deliver_run``), taken in
        order as :meth:`deliver_or_enqueue` takes each; their results in order. ``first_seq`` > 0: the first one's
        confirm sequence number on ``publisher`` (the others follow it); 0: no confirms. A type with nothing to
        gain from the run takes it with broker/queues/queue_shell.py's ``take_one_by_one``."""
        ...

    @property
    def dead_letters_on_publish(self) -> bool:
        """Whether taking a publish may dead-letter messages there and then (into other queues, through the one
        publish path): a run of publishes (broker/amqp/publish_run.py) then goes message by message, so that its
        dead letters reach their queues in the order they would and count towards the reader's turn."""
        ...

    @property
    def overloaded(self) -> bool:
        """Credit flow: whether the publisher that just published should stop until :meth:`throttle` lets go."""
        ...

    def throttle(self, reader: Any) -> None:
        """Stop reading ``reader``'s socket until the queue has caught up (credit flow)."""
        ...

    def origins_held(self, seqs: set[int]) -> set[int]:
        """Which delayed-message dispatches (delay-store seqs) the queue holds (recovery: broker/exchanges'
        Route, storage/dispatch_evidence.py)."""
        ...

    # consume
    def add_consumer(self, consumer: Consumer) -> None:
        """basic.consume: raises AMQPError for a consumer the type refuses (a quorum queue's global QoS...)."""
        ...

    def remove_consumer(self, consumer: Consumer) -> None: ...

    def schedule_run(self) -> None:
        """Run the deliver loop soon: a consumer got room (an ack, a qos, flow back on)."""
        ...

    # settle
    def ack(self, seq_ids: list[int]) -> None: ...

    def requeue(self, seq_ids: list[int]) -> None: ...

    def reject_discard(self, seq_ids: list[int]) -> None: ...

    # dequeue
    def basic_get(self, no_ack: bool) -> tuple[int, Message, bool, int] | None:
        """basic.get: (seq_id, message, redelivered, messages left), or None when empty."""
        ...

    # replies that may come later: True means the queue calls back once it knows (a cluster's quorum queue asks
    # PostgreSQL, another member's queue its owner) and the channel answers then; False, answer now
    def basic_get_wait(self, retry: Callable[[], None]) -> bool: ...

    def message_count_wait(self, answer: Callable[[], None]) -> bool: ...

    def purge_count_wait(self, answer: Callable[[int], None]) -> bool: ...

    # info
    def figures(self) -> Figures:
        """Its message figures (ready, unacked, their bytes, paged out), asked at a request or a scrape."""
        ...

    def message_count(self) -> int:
        """The ready messages a queue.declare-ok or purge-ok reports."""
        ...

    def awaiting_confirm(self) -> int:
        """Publishes accepted and not yet confirmed (waiting for the fsync or commit that covers them): the
        rabbitmq_raft_* series' uncommitted entries of a quorum queue."""
        ...

    def info_items(self, node_name: str) -> dict[str, Any]:
        """The items its type adds to the HTTP API's queue object (a stream's offsets); {} for most types."""
        ...

    def consumer_groups(self) -> ConsumerGroups | None:
        """Its consumer groups (a stream's: /api/stream-groups), or None for a type that has none: the HTTP
        API asks this instead of testing the queue's class."""
        ...

    # lifecycle
    def apply_settings(self, settings: QueueSettings) -> None:
        """New effective settings (a policy changed)."""
        ...

    def reset_expiry_timer(self) -> None:
        """The queue was used: its ``x-expires`` lease starts again."""
        ...

    def purge(self) -> int:
        """Drop the ready messages; how many."""
        ...

    def terminate(self) -> int:
        """The queue is deleted: cancel its consumers, settle its confirms, drop its messages; how many."""
        ...

    # memory: the members the memory budget uses (broker/resources/memory_budget.py's PagedQueue, inherited)


class QueueType(Protocol):
    """One kind of queue: its declare rules and how its queues are made."""

    name: str  # the x-queue-type value; also the policy target ("classic" matches apply-to classic_queues)
    # In a cluster (broker/clustering/cluster.py), whether every member serves this type's queues from the cluster's
    # store (the registry then opens them with its ``shared_store``), rather than one node from its files.
    cluster_shared: bool

    def check_declare(self, where: str, durable: bool, exclusive: bool, auto_delete: bool,
                      server_named: bool = False) -> None: ...

    def new_queue(self, vhost: QueueHost, name: str, durable: bool, owner: QueueOwner | None, auto_delete: bool,
                  arguments: dict[str, Any], settings: QueueSettings, open_store: OpenStore) -> Queue: ...


class ClassicQueueType:
    """RabbitMQ's ``rabbit_classic_queue``: any properties; the queue process over a (variable) backing queue."""

    name = "classic"
    cluster_shared = False
    process: ClassVar[type[QueueProcess]] = QueueProcess

    def check_declare(self, where: str, durable: bool, exclusive: bool, auto_delete: bool,
                      server_named: bool = False) -> None:
        pass

    def new_queue(self, vhost: QueueHost, name: str, durable: bool, owner: QueueOwner | None, auto_delete: bool,
                  arguments: dict[str, Any], settings: QueueSettings, open_store: OpenStore) -> Queue:
        return self.process(vhost, name, durable, owner, auto_delete, arguments,
                            new_backing_queue(open_store, name, durable, settings), settings)


class QuorumQueue(QueueProcess):
    """A quorum queue on one node: a queue process that counts every message's returns, so a redelivery
    carries ``x-delivery-count`` whether or not ``x-delivery-limit`` is set (as RabbitMQ's quorum queues do)."""

    type_name = "quorum"
    counts_deliveries = True
    capabilities = QUORUM

    def add_consumer(self, consumer: Consumer) -> None:
        """RabbitMQ 3.10 refuses a consumer of a quorum queue on a channel whose client asked for a shared
        (global) prefetch, unless the consumer has a prefetch of its own (basic.qos global=false before the
        consume): 540, a connection error (probed against 3.10.8). kombu's global=false, which Leveret takes
        as the channel's limit, is not a global QoS the client asked for (Channel.global_qos)."""
        if consumer.channel.global_qos and not consumer.prefetch:
            raise AMQPError(NOT_IMPLEMENTED, f"queue '{self.name}' in vhost '{self.vhost.name}' does not "
                            "support global qos")
        super().add_consumer(consumer)


class QuorumQueueType(ClassicQueueType):
    """RabbitMQ's ``rabbit_quorum_queue``: durable, shared and lasting (its declare refusals and their texts)."""

    name = "quorum"
    cluster_shared = True  # RabbitMQ's replicated type: in a Leveret cluster, its messages are in PostgreSQL
    process = QuorumQueue

    def check_declare(self, where: str, durable: bool, exclusive: bool, auto_delete: bool,
                      server_named: bool = False) -> None:
        queue_args.refuse_unless_lasting(where, durable, exclusive, auto_delete)


# The registry: x-queue-type → its queue type. A new type is one line here (and its class).
QUEUE_TYPES: dict[str, QueueType] = {
    "classic": ClassicQueueType(),
    "quorum": QuorumQueueType(),
    "stream": StreamQueueType(),
}
queue_args.QUEUE_TYPES[:] = QUEUE_TYPES  # what x-queue-type may name at declare (checked below this module)


def queue_type_of(arguments: dict[str, Any]) -> QueueType:
    """The type ``x-queue-type`` names (classic when absent). Arguments were validated before, so an
    unknown name cannot reach here; it would be a KeyError."""
    value = arguments.get("x-queue-type")
    if value is None:
        return QUEUE_TYPES["classic"]
    if isinstance(value, (bytes, bytearray)):
        value = value.decode(errors="replace")
    return QUEUE_TYPES[value or "classic"]
