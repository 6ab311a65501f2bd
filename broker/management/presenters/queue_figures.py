"""A queue's message figures as a member shows them: its own, or, for a queue every cluster member serves
(a quorum queue in a Leveret cluster), the cluster's count from PostgreSQL. What the queue, vhost and overview
presenters and the rate sampler read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.queues.queue_types import Queue, queue_type_of
from storage.backing_queue import Figures

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot


def is_shared(q: Queue) -> bool:
    """Whether every member of a cluster serves the queue (a quorum queue: its messages are in PostgreSQL)."""
    return queue_type_of(q.arguments).cluster_shared


def figures_of(q: Queue, shared: Snapshot | None) -> Figures:
    """The queue's figures: for a shared queue of a cluster member, as PostgreSQL counts them (``shared``,
    storage/pg/queue_figures.py: the same on every member), else the queue's own."""
    if shared is not None and is_shared(q):
        c = shared.counts(q.vhost.name, q.name)
        return Figures(c.ready, c.unacked, c.ready_bytes, c.unacked_bytes, 0)
    return q.figures()
