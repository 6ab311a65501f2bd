"""A queue's consumers (RabbitMQ's ``rabbit_queue_consumers``): who may receive the next message.

Consumers are grouped by priority (``x-priority``, default 0). The next delivery goes to the first consumer
with room in the highest priority group that has one, and that consumer moves to the back of its group, so
equal consumers take turns. A single-active-consumer queue gives everything to the consumer that came
first; when it goes, the next in order of arrival takes over.

This module sits below the queue process and the channel: it knows a consumer's channel only as a
:class:`ConsumerChannel` (what the queue asks of it), and its queue not at all beyond holding it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker.message import Message


class ConsumerChannel(Protocol):
    """What a queue asks of the channel a consumer belongs to (broker/amqp/channel.py's Channel)."""

    # The channel's shared prefetch (basic.qos global=true; 0: none), and whether the client itself asked for
    # one: queue types that refuse a global QoS (a stream, a quorum queue) read them when a consumer is added.
    global_prefetch: int
    global_qos: bool

    def can_deliver(self) -> bool: ...

    def can_deliver_no_ack(self) -> bool: ...

    def deliver(self, consumer: Consumer, queue: Any, seq_id: int, msg: Message, redelivered: bool) -> None: ...

    def deliver_parts(self, consumer: Consumer, queue: Any, seq_id: int, names_raw: bytes, header: bytes,
                      body: bytes, redelivered: bool) -> None:
        """``deliver`` of ``Message.from_wire(names_raw, header, body)``, without building it (a stream)."""

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None: ...


class Consumer:
    """One basic.consume: its channel, its queue (a broker/queues/queue_types.py Queue), and the prefetch it
    was given (0 = no limit)."""

    __slots__ = (
        "arguments",
        "channel",
        "exclusive",
        "no_ack",
        "prefetch",
        "priority",
        "queue",
        "tag",
        "tag_raw",
        "unacked",
    )

    def __init__(self, tag: str, channel: ConsumerChannel, queue: Any, no_ack: bool, prefetch: int,
                 priority: int, exclusive: bool, arguments: dict[str, Any]) -> None:
        self.tag = tag
        raw = tag.encode()
        self.tag_raw = bytes([len(raw)]) + raw
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch
        self.unacked = 0
        self.priority = priority
        self.exclusive = exclusive
        self.arguments = arguments

    def has_room(self) -> bool:
        if self.no_ack:
            return self.channel.can_deliver_no_ack()
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()


class ConsumerSet:
    def __init__(self, single_active: bool = False) -> None:
        self._groups: dict[int, deque[Consumer]] = {}
        self._priorities: list[int] = []  # descending
        self.count = 0
        self.single_active = single_active
        self._arrival: list[Consumer] = []  # in order of arrival, for single active consumer
        # A single active consumer that went away holding unacked messages: the next one is activated only
        # once those are settled, so it sees them first (as RabbitMQ does on connection loss).
        self._retiring: Consumer | None = None

    @property
    def active(self) -> Consumer | None:
        """The single active consumer (None unless the queue has x-single-active-consumer)."""
        return self._arrival[0] if self.single_active and self._arrival else None

    def add(self, consumer: Consumer) -> None:
        if self.single_active:
            self._arrival.append(consumer)
        group = self._groups.get(consumer.priority)
        if group is None:
            group = self._groups[consumer.priority] = deque()
            self._priorities = sorted(self._groups, reverse=True)
        group.append(consumer)
        self.count += 1

    def remove(self, consumer: Consumer) -> bool:
        if self.single_active and consumer in self._arrival:
            if self._arrival[0] is consumer and consumer.unacked:
                self._retiring = consumer
            self._arrival.remove(consumer)
        group = self._groups.get(consumer.priority)
        if group is None:
            return False
        try:
            group.remove(consumer)
        except ValueError:
            return False
        if not group:
            del self._groups[consumer.priority]
            self._priorities = sorted(self._groups, reverse=True)
        self.count -= 1
        return True

    def next_with_room(self) -> Consumer | None:
        """The consumer to deliver to next, rotated to the back of its group; None if all are full."""
        if self.single_active:
            if self._retiring is not None:
                if self._retiring.unacked:
                    return None
                self._retiring = None
            active = self._arrival[0] if self._arrival else None
            return active if active is not None and active.has_room() else None
        for priority in self._priorities:
            group = self._groups[priority]
            for _ in range(len(group)):
                consumer = group[0]
                group.rotate(-1)
                if consumer.has_room():
                    return consumer
        return None

    def any_with_room(self) -> bool:
        """Whether some consumer could take a message now (without changing whose turn it is)."""
        if self.single_active:
            active = self._arrival[0] if self._arrival and self._retiring is None else None
            return active is not None and active.has_room()
        return any(c.has_room() for group in self._groups.values() for c in group)

    def room(self, most: int) -> int:
        """How many more messages the consumers could take now, at most ``most`` (a consumer without a
        prefetch limit, or acking automatically, counts as ``most``): what a store the cluster's members share
        reserves ahead for them, so that rows this member's consumers cannot take stay for the others'."""
        if self.single_active:
            active = self.active if self._retiring is None else None
            consumers: Iterable[Consumer] = (active,) if active is not None else ()
        else:
            consumers = (c for group in self._groups.values() for c in group)
        total = 0
        for c in consumers:
            if c.has_room():
                total += most if c.no_ack or not c.prefetch else c.prefetch - c.unacked
                if total >= most:
                    return most
        return total

    def rank(self) -> int | None:
        """The priority of the highest consumers that could take a message now (None: none could; always None
        for a single active consumer, whose cluster-wide lock decides). A store the cluster's members share
        compares it with the other members' (consumer priorities rank queue-wide, as RabbitMQ's quorum queue
        does: storage/pg/backing_queue.py ``outranked``)."""
        if self.single_active:
            return None
        for priority in self._priorities:
            if any(c.has_room() for c in self._groups[priority]):
                return priority
        return None

    def __iter__(self) -> Iterator[Consumer]:
        for priority in list(self._priorities):
            yield from list(self._groups[priority])

    def __len__(self) -> int:
        return self.count
