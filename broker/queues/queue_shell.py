"""The queue shell: what every queue type of this node is around its store (RabbitMQ's ``rabbit_amqqueue_process``
around a backing queue).

A queue's identity (name, vhost, durability, owner, arguments, settings), its consumers, its counters, the
publishers it has paused (credit flow: broker/queues/credit_flow.py), the confirms it owes
(broker/queues/confirm_book.py) and the scheduling of its deliver loop are the same whatever holds the messages,
so they are here once; a queue type (broker/queues/queue_process.py's classic and quorum queue, the stream of
broker/queues/stream_queue.py) adds how it stores, delivers and settles, and its own judgement of when it is
behind (``overloaded``, ``maybe_release_publishers``). The rest of the broker sees either through
broker/queues/queue_types.py's ``Queue`` Protocol, never through this class.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from broker.queues.credit_flow import Pausable, PublisherFlow
from broker.queues.queue_args import QueueSettings
from broker.queues.queue_consumers import Consumer, ConsumerSet
from broker.queues.queue_info import QueueCapabilities

if TYPE_CHECKING:
    from broker.clock import Clock
    from broker.deduplication import DedupCache
    from broker.exchanges.exchange import Exchange
    from broker.message import Message
    from broker.observability.trace import Tracer
    from broker.policies.policy import Policy
    from broker.queues.confirm_book import OwedConfirms

# Deliveries per turn of a deliver loop before it yields to other work.
DELIVERY_BUDGET = 256
# What deliver_or_enqueue tells the publisher's channel.
REJECTED, ACCEPTED, CONFIRM_LATER = 0, 1, 2


def take_one_by_one(take: Callable[[Message, bool, Any], int], msgs: list[Message], persistent: bool,
                    publisher: Any, first_seq: int) -> list[int]:
    """A run of messages (``deliver_or_enqueue_run``) taken the plain way: each by ``take`` (the queue's
    ``deliver_or_enqueue``), with its confirm token when ``first_seq`` asks for confirms."""
    if not first_seq:
        return [take(msg, persistent, None) for msg in msgs]
    return [take(msg, persistent, (publisher, first_seq + i)) for i, msg in enumerate(msgs)]


class QueueOwner(Protocol):
    """The connection an exclusive queue belongs to (broker/amqp/reader.py's Reader), as the queue layer sees it."""

    name: str
    exclusive_queues: list[Any]


class QueueDeleter(Protocol):
    # The vhost's queues that may hold messages (QueueRegistry.occupied): a queue adds itself on every publish.
    occupied: set[Any]

    def delete(self, q: Any, reason: str = ...) -> int: ...


class QueueHost(Protocol):
    """What a queue asks of its vhost (broker/vhost.py's VHost), declared here so that the queue layer need not
    import the layer above it: its clock, counters, policies, the dead-letter exchanges and the one publish
    path, and the registry that deletes an expired queue."""

    name: str
    clock: Clock
    counters: Any  # broker/observability/counters.py GlobalCounters, or None
    default_exchange: Exchange
    exchanges: dict[str, Exchange]
    policies: dict[str, Policy]
    operator_policies: dict[str, Policy]
    # broker/observability/trace.py's Tracer while the vhost traces, else None (acks and dead-letterings are traced here).
    tracing: Tracer | None

    @property
    def queues(self) -> QueueDeleter: ...

    def publish(self, exchange: Exchange, msg: Message, persistent: bool, mandatory: bool = False,
                publisher: Any = None, confirm_seq: int = 0, dead_letter: bool = False) -> int: ...


class QueueStats:
    """Plain-integer counters (seed 004's per-queue statistics), read by metrics at scrape time."""

    __slots__ = (
        "acked",
        "dead_lettered",
        "delivered",
        "dropped",
        "expired",
        "get",
        "published",
        "redelivered",
        "rejected_publishes",
    )

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.redelivered = 0
        self.get = 0
        self.dead_lettered = 0
        self.expired = 0
        self.dropped = 0
        self.rejected_publishes = 0

    def message_stats(self) -> dict[str, int]:
        """The counters as the HTTP API's queue ``message_stats`` names them (its rates are sampled apart)."""
        return {"publish": self.published, "deliver_get": self.delivered + self.get, "deliver": self.delivered,
                "get": self.get, "redeliver": self.redelivered, "ack": self.acked}


class QueueShell(ABC):
    """The part of a queue that does not depend on its store (see the module docstring)."""

    type_name: ClassVar[str]
    remote: ClassVar[bool] = False  # a queue of this node (broker/clustering/remote_queue.py's stand for other members')
    capabilities: ClassVar[QueueCapabilities]  # (broker/queues/queue_info.py)
    # Message deduplication (broker/deduplication.py): the queue's cache, set by the queue registry and checked
    # by broker/queues/delegate.py before deliver_or_enqueue; None (no deduplication) costs one attribute read.
    dedup: DedupCache | None = None
    # Class-level until set, so that an idle queue's instance dictionary stays small (VariableQueue's docstring
    # says why: 100,000 queues; tests/unit/storage/test_queue_footprint.py keeps count).
    exclusive_consumer: Consumer | None = None
    deleted = False
    _run_scheduled = False
    _loop: asyncio.AbstractEventLoop | None = None  # bound at the first delivery run

    def __init__(self, vhost: QueueHost, name: str, durable: bool, exclusive_owner: QueueOwner | None,
                 auto_delete: bool, arguments: dict[str, Any], settings: QueueSettings, consumers: ConsumerSet,
                 confirms: OwedConfirms) -> None:
        self.vhost = vhost
        self._clock = vhost.clock
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.settings = settings
        self.consumers = consumers
        self.stats = QueueStats()
        # Open channels that have published to this queue (seed 004's "publishers"), kept by delegate.
        self.publisher_channels: set[Any] = set()
        # Publishers' readers this queue paused (credit flow), and the confirms it owes.
        self.flow = PublisherFlow(self)
        self.confirms = confirms

    # -- consumers and delivery ----------------------------------------------------------------------------
    @property
    def consumer_count(self) -> int:
        return self.consumers.count

    def schedule_run(self) -> None:
        """Run the deliver loop soon (once, however many times this is called before it runs)."""
        if not self._run_scheduled and not self.deleted and self.consumers.count:
            self._run_scheduled = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self.run_message_queue)

    @abstractmethod
    def run_message_queue(self) -> None:
        """One turn of delivery to consumers with room, within :data:`DELIVERY_BUDGET`."""

    # -- publisher confirms and credit flow ----------------------------------------------------------------
    def awaiting_confirm(self) -> int:
        """Publishes accepted and not yet confirmed: waiting for the fsync (or commit) that covers them."""
        return len(self.confirms)

    @property
    def dead_letters_on_publish(self) -> bool:
        """Whether taking a publish may dead-letter messages there and then: a dead-letter exchange with a length
        limit (drop-head, reject-publish-dlx) or a queue TTL (expired heads go as messages arrive)."""
        s = self.settings
        return s.dlx is not None and (s.max_length is not None or s.max_length_bytes is not None
                                      or s.message_ttl is not None)

    @property
    @abstractmethod
    def overloaded(self) -> bool:
        """Whether the publisher that just published should wait until :meth:`throttle` lets it go."""

    def throttle(self, reader: Pausable) -> None:
        """Credit flow: stop reading ``reader``'s socket until the queue has caught up."""
        self.flow.pause(reader)

    @abstractmethod
    def maybe_release_publishers(self) -> None:
        """Let the paused publishers go if the queue has caught up (its low marks)."""

    def release_publishers(self) -> None:
        self.flow.release()

    # -- deletion ------------------------------------------------------------------------------------------
    def _end(self) -> None:
        """The shell's part of deleting the queue: owed confirms are confirmed (the queue has dealt with those
        publishes), paused publishers let go, and consumers cancelled (their clients told)."""
        self.deleted = True
        self.confirms.settle_all()
        self.flow.release()
        for consumer in list(self.consumers):
            self.consumers.remove(consumer)
            consumer.channel.consumer_cancelled_by_queue(consumer)
        self.exclusive_consumer = None
