"""What the exporter reports of one queue, by metric name (broker/prometheus/queue_series.py writes the
families; broker/prometheus/metrics.py's docstring says what each endpoint carries). On a cluster member a shared
(quorum) queue's figures and counters are PostgreSQL's, the same on every member, and one member reports it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.queues.queue_types import Queue, queue_type_of
from storage.backing_queue import Figures

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot

# Per-queue gauges and counters: (metric, help); their values come from queue_values.
QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages"),
    ("rabbitmq_queue_messages_unacked_bytes", "Size in bytes of all unacknowledged messages"),
    ("rabbitmq_queue_messages_bytes", "Size in bytes of ready and unacknowledged messages"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
    ("leveret_queue_publishers", "Channels that have published to a queue and are still open"),
    ("leveret_queue_messages_paged_out", "Ready messages whose body is on disk only (paged out: betas and delta)"),
)
QUEUE_COUNTERS = (
    ("rabbitmq_queue_messages_published_total", "Total number of messages published to queues"),
    ("rabbitmq_queue_messages_delivered_total", "Total number of messages delivered to consumers"),
    ("rabbitmq_queue_messages_redelivered_total", "Total number of messages redelivered to consumers"),
    ("rabbitmq_queue_messages_acked_total", "Total number of messages acknowledged by consumers"),
    ("rabbitmq_queue_get_total", "Total number of messages fetched with basic.get"),
)


def shared_figures_of(q: Queue, shared: Snapshot | None) -> Figures:
    """A cluster member's figures of a shared (quorum) queue as PostgreSQL counts them (``shared``:
    storage/pg/queue_figures.py, the same on every member); any other queue's own figures."""
    if shared is not None and queue_type_of(q.arguments).cluster_shared:
        c = shared.counts(q.vhost.name, q.name)
        return Figures(c.ready, c.unacked, c.ready_bytes, c.unacked_bytes, 0)
    return q.figures()


def queue_counters(q: Queue, shared: Snapshot | None) -> tuple[int, int, int, int, int]:
    """(published, delivered, redelivered, acked, get) of a queue: on a cluster member, a shared queue's are
    every member's summed as PostgreSQL holds them (storage/pg/queue_stats.py: the same on every member, up
    to about 2 s behind, never going down); any other queue's are its own (``Queue.stats``)."""
    if shared is not None and queue_type_of(q.arguments).cluster_shared:
        c = shared.activity(q.vhost.name, q.name).counts
        return c["publish"], c["deliver"], c["redeliver"], c["ack"], c["get"]
    s = q.stats
    return s.published, s.delivered, s.redelivered, s.acked, s.get


# Per-queue gauges that are a member's own even for a shared queue (its consumers and publishers are on it).
MEMBER_LOCAL_GAUGES = frozenset({"rabbitmq_queue_consumers", "leveret_queue_publishers"})


def reports_queue(q: Queue, shared: Snapshot | None, member: str) -> bool:
    """Whether this member reports the queue's messages and counters to Prometheus: always for its own
    queues; for a shared (quorum) queue, which every member serves with the same cluster-wide figures, only
    on the member :meth:`Snapshot.reporter` picks (RabbitMQ reports a quorum queue on its leader's node), so
    that a sum over the members' scrapes counts it once. A member that does not see itself among the live
    members (PostgreSQL out of reach, its lease lapsed) reports it: better twice than not at all
    (:meth:`Snapshot.leader`, the rule the HTTP API's ``leader`` follows too)."""
    if shared is None or not queue_type_of(q.arguments).cluster_shared:
        return True
    return shared.leader(q.vhost.name, q.name, member) == member


def queue_values(q: Queue, shared: Snapshot | None = None) -> dict[str, int]:
    """Every per-queue metric of one queue process, by name: its figures (``Queue.figures``, read
    now; a shared queue's from ``shared`` on a cluster member), consumers and publishers, and its counters
    (``Queue.stats``; a shared queue's summed over the members: queue_counters)."""
    f = shared_figures_of(q, shared)
    published, delivered, redelivered, acked, get = queue_counters(q, shared)
    return {
        "rabbitmq_queue_messages_ready": f.ready,
        "rabbitmq_queue_messages_unacked": f.unacked,
        "rabbitmq_queue_messages": f.messages,
        "rabbitmq_queue_messages_ready_bytes": f.ready_bytes,
        "rabbitmq_queue_messages_unacked_bytes": f.unacked_bytes,
        "rabbitmq_queue_messages_bytes": f.bytes,
        "rabbitmq_queue_consumers": q.consumers.count,
        "leveret_queue_publishers": len(q.publisher_channels),
        "leveret_queue_messages_paged_out": f.paged_out,
        "rabbitmq_queue_messages_published_total": published,
        "rabbitmq_queue_messages_delivered_total": delivered,
        "rabbitmq_queue_messages_redelivered_total": redelivered,
        "rabbitmq_queue_messages_acked_total": acked,
        "rabbitmq_queue_get_total": get,
    }
