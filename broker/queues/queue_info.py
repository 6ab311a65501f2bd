"""What a queue type declares about itself (RabbitMQ's ``rabbit_queue_type:capabilities/0`` and the info keys
its ``info/2`` adds), so that the channel, the HTTP API, ctl and metrics ask the queue instead of switching on
its class.

Each queue class carries one :class:`QueueCapabilities` record as a class attribute (``capabilities``) and
answers ``info_items(node_name)`` with the items its type adds to the common ones (a stream's offsets,
segments and consumer groups; nothing for a classic or quorum queue). A new queue type declares both; no
renderer changes.
"""

from __future__ import annotations

from typing import NamedTuple


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
