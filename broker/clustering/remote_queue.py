"""What a cluster member knows of the queues that live on other members (docs/decisions/postgres-cluster.md; broker/clustering/cluster_forwarding.py
keeps it up to date): a :class:`RemoteQueue` stands for each, and the bindings of shared exchanges to them are
routed by :class:`RemoteRoutes`, one per vhost, the routing part of the vhost's topology (broker/topology.py; a
single node's LocalTopology is never asked: the publish path tests ``VHost.clustered``, one attribute read).

A remote queue is a proxy, never a queue of this node: it is not in the vhost's queue registry (not counted,
not consumable here; the HTTP API lists it as its owner answers). Publishing to it is what it does:
:meth:`RemoteQueue.deliver_or_enqueue` hands the message to the forwarder, which commits it to PostgreSQL for
the owner (its publisher confirm comes after that commit, through the channel's CONFIRM_LATER path, as for a
PostgreSQL-backed queue). Its figures and arguments are asked of the owner (a declare's equivalence check and
declare-ok counts): a channel waits for the answer without blocking the event loop
(:meth:`RemoteQueue.message_count_wait`, the same hook a quorum queue's recount gives the channel), a coroutine
awaits :func:`answered`; :meth:`RemoteQueue.info` reads the last answer, never asking.

Bindings of the shared exchanges to remote queues live in *shadow* exchanges: one per source exchange, of the
source's routing type (direct, fanout, topic, headers), holding only those bindings. Routing a message runs
the exchange's own bindings and then its shadow's, into the same set of queue names, so alternate exchanges,
exchange-to-exchange hops, CC/BCC and mandatory behave as for local queues; a name is then resolved to the
local queue first, else to the remote one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import structlog

from broker.errors import AMQPError
from broker.exchanges.exchange import (
    QUEUE,
    Binding,
    DirectExchange,
    Exchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
)
from broker.message import Message
from broker.queues.queue_info import CLASSIC, QueueCapabilities
from broker.queues.queue_shell import ACCEPTED, CONFIRM_LATER, take_one_by_one
from protocol.constants import RESOURCE_LOCKED

if TYPE_CHECKING:
    from broker.deduplication import DedupCache
    from broker.queues.queue_types import Queue
    from broker.topology import OtherMembersQueue

log = structlog.get_logger("leveret.cluster")

ROUTING_TYPES: dict[str, type[Exchange]] = {"direct": DirectExchange, "fanout": FanoutExchange,
                                            "topic": TopicExchange, "headers": HeadersExchange}


def routing_type(ex: Exchange) -> str:
    """How ``ex`` routes, as one of the four built-in types (a delayed-message exchange routes as its
    ``x-delayed-type``, a deduplication exchange as the fanout it extends)."""
    ex = ex.routes_as
    for name, cls in ROUTING_TYPES.items():
        if isinstance(ex, cls):
            return name
    return "direct"


class _NoConsumers:
    count = 0


class _Consumers:
    """The consumer count the owner last answered (queue.declare-ok reads ``queue.consumers.count``)."""

    def __init__(self, count: int) -> None:
        self.count = count


INFO_MAX_AGE = 0.25  # seconds an answer of the owner (or its silence) serves again (a declare asks, then reads)


class RemoteQueue:
    """A queue of another member (see the module docstring): broker/topology.py's ``OtherMembersQueue``, what
    routing, the publish path and a queue.declare use of it (mypy checks it where the topology hands it out)."""

    remote: ClassVar[bool] = True
    capabilities: ClassVar[QueueCapabilities] = CLASSIC  # (as a node-local queue of its owner is classic)
    type_name: ClassVar[str] = "classic"
    dedup: DedupCache | None = None  # (the owner deduplicates)
    exclusive_owner = None
    auto_delete = False
    consumers: Any = _NoConsumers()
    # The persistence a message asked for travels with it; the owner applies its queue's durability.
    durable = True

    def __init__(self, vhost: str, name: str, node: str, durable: bool, exclusive: bool,
                 forward: Callable[[RemoteQueue, Message, bool, Any], None], overloaded: Callable[[str], bool],
                 throttle: Callable[[Any], None],
                 ask: Callable[[RemoteQueue], Awaitable[dict[str, Any] | None]] | None = None) -> None:
        self.vhost_name = vhost
        self.name = name
        self.node = node
        self.queue_durable = durable
        self.exclusive = exclusive
        self.publisher_channels: set[Any] = set()
        self._forward = forward
        self._overloaded = overloaded
        self._throttle = throttle
        self._ask = ask
        self._info: dict[str, Any] | None = None
        self._info_at: float | None = None  # when the owner last answered (or did not in time); None: never asked
        # The question being asked without blocking (message_count_wait) and who waits for its answer.
        self._asking: asyncio.Task[None] | None = None
        self._waiters: list[Callable[[], None]] = []

    def deliver_or_enqueue(self, msg: Message, persistent: bool, confirm: Any = None) -> int:
        self._forward(self, msg, persistent, confirm)
        return CONFIRM_LATER if confirm is not None else ACCEPTED

    def deliver_or_enqueue_run(self, msgs: list[Message], persistent: bool, publisher: Any, first_seq: int
                               ) -> list[int]:
        return take_one_by_one(self.deliver_or_enqueue, msgs, persistent, publisher, first_seq)

    @property
    def dead_letters_on_publish(self) -> bool:
        return False

    @property
    def overloaded(self) -> bool:
        return self._overloaded(self.node)

    def throttle(self, reader: Any) -> None:
        self._throttle(reader)

    def origins_held(self, seqs: set[int]) -> set[int]:
        return set()

    def _fresh(self) -> bool:
        return self._info_at is not None and time.monotonic() - self._info_at < INFO_MAX_AGE

    def _answered(self, info: dict[str, Any] | None) -> None:
        self._info = info
        self._info_at = time.monotonic()
        if info is not None:
            self.consumers = _Consumers(int(info.get("consumers", 0)))

    def info(self) -> dict[str, Any] | None:
        """What the owner last answered of this queue (broker/clustering/cluster_forwarding.py ``queue_answer``: figures,
        flags, arguments), or None if it did not answer (gone, or slower than the question's timeout) or was
        never asked; never asks (nothing on the event loop waits for it: :meth:`message_count_wait` asks)."""
        return self._info

    def answer(self) -> dict[str, Any] | None:
        """:meth:`info` (read after :meth:`message_count_wait` called back)."""
        return self._info

    def message_count_wait(self, answer: Callable[[], None]) -> bool:
        """Whether a queue.declare-ok (and the equivalence check before it) should wait for the owner's answer:
        False if one is at hand (less than INFO_MAX_AGE old: read it now), else the owner is asked without
        blocking the event loop (one question for every declare waiting meanwhile) and ``answer`` is called
        once it answered or gave up (:data:`broker.clustering.cluster_forwarding.ASK_TIMEOUT`); :meth:`info` and
        :meth:`message_count` then read that answer."""
        if self._fresh() or self._ask is None:
            return False
        self._waiters.append(answer)
        if self._asking is None:
            self._asking = asyncio.get_running_loop().create_task(self._ask_now())
        return True

    def basic_get_wait(self, retry: Callable[[], None]) -> bool:
        return False  # (not reached: the registry's lookup refuses another member's queue with 405)

    def info_items(self, node_name: str) -> dict[str, Any]:
        return {}  # (the HTTP API shows what its owner answers: broker/management/presenters/cluster.py)

    def purge_count_wait(self, answer: Callable[[int], None]) -> bool:
        return False  # (not reached, as basic_get_wait)

    async def _ask_now(self) -> None:
        assert self._ask is not None
        try:
            info = await self._ask(self)
        except Exception as exc:  # noqa: BLE001 (an owner that cannot be asked is one that did not answer)
            log.warning("asking another member about its queue failed", queue=self.name, member=self.node,
                        error=str(exc))
            info = None
        finally:
            self._asking = None
        self._answered(info)
        waiters, self._waiters = self._waiters, []
        for then in waiters:
            try:
                then()
            except Exception:
                log.exception("answering a declare of another member's queue failed", queue=self.name)

    def message_count(self) -> int:
        """The owner's count as it last answered (asked for a queue.declare-ok), 0 if it did not."""
        info = self.info()
        return int(info.get("count", 0)) if info is not None else 0

    def refuse(self, action: str) -> AMQPError:
        """The error for what only the owner can do (consume, get, purge, delete, bind anew)."""
        return AMQPError(RESOURCE_LOCKED, f"queue '{self.name}' in vhost '{self.vhost_name}' is a node-local "
                         f"queue of cluster member '{self.node}': {action} it on a connection to that member "
                         "(a quorum queue is served by every member)")

    def __repr__(self) -> str:
        return f"RemoteQueue({self.vhost_name!r}, {self.name!r}, node={self.node!r})"


class RemoteRoutes:
    """One vhost's remote queues and the shadow exchanges of their bindings (see the module docstring).

    ``lookup(name)`` (optional) is asked for a default-exchange name nobody here knows: the directory in
    PostgreSQL, answering a RemoteQueue or None (the caller caches negative answers)."""

    def __init__(self, vhost: str) -> None:
        self.vhost = vhost
        self.queues: dict[str, RemoteQueue] = {}
        self.shadows: dict[str, Exchange] = {}
        self.lookup: Callable[[str], RemoteQueue | None] | None = None

    def replace(self, queues: dict[str, RemoteQueue],
                bindings: Iterable[tuple[str, str, str, dict[str, Any], str]]) -> None:
        """The directory as read now: ``bindings`` are (source, routing type, routing key, arguments, queue)."""
        shadows: dict[str, Exchange] = {}
        for source, routing, key, arguments, queue in bindings:
            if queue not in queues:
                continue
            shadow = shadows.get(source)
            if shadow is None:
                shadow = shadows[source] = ROUTING_TYPES.get(routing, DirectExchange)(source)
            shadow.add_binding(Binding(source, queue, QUEUE, key, arguments))
        self.queues = queues
        self.shadows = shadows

    def route(self, exchange: str, keys: Iterable[str], msg: Message, queue_names: set[str]) -> None:
        """Add the remote queues ``exchange``'s shadow selects to ``queue_names``."""
        shadow = self.shadows.get(exchange)
        if shadow is None:
            return
        unused: set[str] = set()
        for key in keys:
            shadow.route(key, msg, queue_names, unused)

    def queue(self, name: str) -> RemoteQueue | None:
        """The remote queue named ``name``, known already or found in the directory."""
        q = self.queues.get(name)
        if q is None and self.lookup is not None:
            q = self.lookup(name)
        return q

    def forget_binding(self, source: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> None:
        """Stop routing this binding here at once (an unbind made on this member; the directory follows)."""
        shadow = self.shadows.get(source)
        if shadow is not None:
            shadow.remove_binding(Binding(source, queue, QUEUE, routing_key, arguments).key)

    def bound(self, source: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> bool:
        """Whether the owner has made this binding (a redeclare of it from here is then a no-op)."""
        shadow = self.shadows.get(source)
        return shadow is not None and Binding(source, queue, QUEUE, routing_key, arguments).key in shadow.bindings


async def answered(queue: Queue | OtherMembersQueue) -> None:
    """Until ``queue``'s message count (and a RemoteQueue's owner's answer) may be read without blocking, with
    the event loop free meanwhile: ``message_count_wait`` as a coroutine, for callers that can await (the HTTP
    API's declare, a definitions import). At once for a queue that has them at hand."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_answer() -> None:
        if not done.done():
            done.set_result(None)

    if queue.message_count_wait(on_answer):
        await done
