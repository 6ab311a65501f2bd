"""What a queue type declares about itself (RabbitMQ's ``rabbit_queue_type:capabilities/0`` and the info keys
its ``info/2`` adds), so that the channel, the HTTP API, ctl and metrics ask the queue instead of switching on
its class.

Each queue class carries one :class:`QueueCapabilities` record as a class attribute (``capabilities``) and
answers ``info_items(node_name)`` with the items its type adds to the common ones (a stream's offsets,
segments and consumer groups; nothing for a classic or quorum queue), and ``consumer_groups()`` with its
:class:`ConsumerGroups` (a stream's; None for a type without groups). A new queue type declares all three; no
renderer changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from storage.stream_log import GroupLog


class QueueCapabilities(NamedTuple):
    """What a queue type offers; read at a request or a scrape, never per message."""

    # Messages are taken one by one: basic.get, and the HTTP API's get, peek and move (False: a stream's are
    # read from an offset, and those answer 540 / 405 / 400).
    basic_get: bool
    purge: bool  # queue.purge (a stream refuses it)
    # basic.qos global=true with consumers of this queue (a quorum queue refuses it, a stream too)
    global_qos: bool
    # A log read from offsets, with consumer groups: its info items are a stream's (/api/stream-groups, the
    # leveret_stream_* series)
    offsets: bool
    # Reports the rabbitmq_raft_* series (a quorum queue; broker/prometheus/metrics_runtime.py raft_families)
    raft: bool


CLASSIC = QueueCapabilities(basic_get=True, purge=True, global_qos=True, offsets=False, raft=False)
QUORUM = QueueCapabilities(basic_get=True, purge=True, global_qos=False, offsets=False, raft=True)
STREAM = QueueCapabilities(basic_get=False, purge=False, global_qos=False, offsets=True, raft=False)


class ConsumerGroups(Protocol):
    """A queue's consumer groups (Leveret's own, a stream's: broker/queues/stream_queue.py), what
    ``/api/stream-groups`` and ``leveret ctl list_stream_groups`` read and the Spark source's commit writes. A
    queue answers it from ``consumer_groups()``; a type without groups answers None there."""

    def groups(self) -> dict[str, GroupLog]:
        """Every group by name."""
        ...

    def group_consumers(self) -> dict[str, int]:
        """How many consumers each group has now, by group name."""
        ...

    def group_info(self, name: str, group: GroupLog, members: dict[str, int] | None = None) -> dict[str, Any]:
        """One group's row (committed offset, cursor, outstanding, lag, consumers, next offset)."""
        ...

    def commit_group_offset(self, name: str, offset: int) -> GroupLog:
        """Move the group's committed offset forward to ``offset`` (creating the group there); AMQPError while
        it has consumers."""
        ...
