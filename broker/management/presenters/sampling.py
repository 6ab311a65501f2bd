"""One sample of everything the HTTP API shows with a rate: the node's message counters and churn, and per
exchange, queue, vhost, connection and channel the counters its object shows (the presenters' ``*_counts``),
into the :class:`~broker.management.presenters.rates.RateSampler` (the app calls :func:`sample` every
``collect_statistics_interval``). It sits above the presenters, which only read the rates."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from broker.amqp.reader import open_connections
from broker.management.presenters.connections import (
    CHANNEL_SAMPLED,
    CONNECTION_SAMPLED,
    channel_message_values,
    connection_byte_values,
)
from broker.management.presenters.exchanges import all_exchanges, exchange_message_counts
from broker.management.presenters.overview import churn_counts, global_message_counts
from broker.management.presenters.queue_figures import figures_of, is_shared
from broker.observability.chunked import in_chunks

CONNECTION_CHUNK = 500  # a connection and its channels cost several times a queue

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot
    from broker.management.presenters.rates import RateSampler
    from broker.node import Node
    from broker.queues.queue_types import Queue


def may_fill_unseen(q: Queue) -> bool:
    """Whether messages can reach the queue without its publish path on this node adding it to the vhost's
    ``occupied`` set: a stream (its own append path) or a queue every cluster member serves (another member's
    publishes fill it). Such queues stay in the set, empty or not."""
    return q.capabilities.offsets or is_shared(q)


async def sample(sampler: RateSampler, node: Node, shared: Snapshot | None = None) -> None:
    """``shared``: a cluster member's count of the shared queues (their figures are taken from it). Queues,
    connections and channels are walked a chunk at a time (broker/observability/chunked.py: at 100,000 queues
    one pass is most of a second of Python), each chunk's samples stamped when the chunk is read."""
    now = time.monotonic()
    for name, value in global_message_counts(node, shared).items():
        sampler.observe(("global", name), value, now)
    for name, value in churn_counts(node).items():
        sampler.observe(("global", name), value, now)
    live: set[Any] = set()
    for vh in node.vhosts.values():
        for ex in all_exchanges(vh):
            key = id(ex)
            live.add(key)
            for name, value in exchange_message_counts(ex).items():
                sampler.observe((key, name), value, now)
        ready = unacked = 0
        registry = vh.queues
        occupied = registry.occupied
        async for chunk in in_chunks(list(vh.queues)):
            now = time.monotonic()
            for q in chunk:
                key = id(q)
                live.add(key)
                f = figures_of(q, shared)
                ready += f.ready
                unacked += f.unacked
                if f.ready or f.unacked:
                    if registry.get(q.name) is q:  # (not one deleted since the pass began: it would stay)
                        occupied.add(q)
                elif not may_fill_unseen(q):
                    occupied.discard(q)
                sampler.sample_queue(key, q.stats, f, now)
                sampler.idle.observe(q, key, f, shared)
        vkey = ("vhost", vh.name)  # the vhost's totals (its HTTP API object, /api/overview's queue_totals)
        live.add(vkey)
        for name, value in (("messages", ready + unacked), ("messages_ready", ready),
                            ("messages_unacknowledged", unacked)):
            sampler.observe((vkey, name), value, now)
    async for conns in in_chunks(open_connections(node), CONNECTION_CHUNK):
        now = time.monotonic()
        for conn in conns:
            key = id(conn)
            live.add(key)
            sampler.sample_object(key, CONNECTION_SAMPLED, connection_byte_values(conn), now)
            for ch in list(conn.channels.values()):
                key = id(ch)
                live.add(key)
                sampler.sample_object(key, CHANNEL_SAMPLED, channel_message_values(ch), now)
    sampler.forget_all_but(live)
