"""One sample of everything the HTTP API shows with a rate: the node's message counters and churn, and per
exchange, queue, vhost, connection and channel the counters its object shows (the presenters' ``*_counts``),
into the :class:`~broker.management.presenters.rates.RateSampler` (the app calls :func:`sample` every
``collect_statistics_interval``). It sits above the presenters, which only read the rates."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from broker.amqp.reader import open_connections
from broker.management.presenters.connections import channel_message_counts, connection_byte_counts
from broker.management.presenters.exchanges import all_exchanges, exchange_message_counts
from broker.management.presenters.overview import churn_counts, global_message_counts
from broker.management.presenters.queue_figures import figures_of

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot
    from broker.management.presenters.rates import RateSampler
    from broker.node import Node


def sample(sampler: RateSampler, node: Node, shared: Snapshot | None = None) -> None:
    """``shared``: a cluster member's count of the shared queues (their figures are taken from it)."""
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
        for q in vh.queues:
            key = id(q)
            live.add(key)
            f = figures_of(q, shared)
            ready += f.ready
            unacked += f.unacked
            sampler.sample_queue(key, q.stats, f, now)
            sampler.idle.observe(q, key, f, shared)
        vkey = ("vhost", vh.name)  # the vhost's totals (its HTTP API object, /api/overview's queue_totals)
        live.add(vkey)
        for name, value in (("messages", ready + unacked), ("messages_ready", ready),
                            ("messages_unacknowledged", unacked)):
            sampler.observe((vkey, name), value, now)
    for conn in open_connections(node):
        key = id(conn)
        live.add(key)
        for name, value in connection_byte_counts(conn).items():
            sampler.observe((key, name), value, now)
        for ch in list(conn.channels.values()):
            key = id(ch)
            live.add(key)
            for name, value in channel_message_counts(ch).items():
                sampler.observe((key, name), value, now)
    sampler.forget_all_but(live)
