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


NO_FIGURES = Figures(0, 0, 0, 0, 0)


def queue_values(q: Queue, shared: Snapshot | None, occupied: set[Queue]) -> tuple[int, ...]:
    """Every per-queue metric of one queue, in the order of QUEUE_GAUGES then QUEUE_COUNTERS: its figures
    (``Queue.figures``, read now; zeros without asking for a queue outside ``occupied``, its vhost's
    QueueRegistry.occupied, which holds no message), consumers and publishers, and its counters
    (``Queue.stats``). On a cluster member (``shared``) a shared (quorum) queue's figures are PostgreSQL's count
    (storage/pg/queue_figures.py) and its counters every member's summed (storage/pg/queue_stats.py: the same on
    every member, up to about 2 s behind, never going down)."""
    if shared is not None and queue_type_of(q.arguments).cluster_shared:
        n = shared.counts(q.vhost.name, q.name)
        f = Figures(n.ready, n.unacked, n.ready_bytes, n.unacked_bytes, 0)
        c = shared.activity(q.vhost.name, q.name).counts
        published, delivered, redelivered, acked, get = c["publish"], c["deliver"], c["redeliver"], c["ack"], c["get"]
    else:
        f = q.figures() if q in occupied else NO_FIGURES
        s = q.stats
        published, delivered, redelivered, acked, get = s.published, s.delivered, s.redelivered, s.acked, s.get
    return (f.ready, f.unacked, f.ready + f.unacked, f.ready_bytes, f.unacked_bytes, f.ready_bytes + f.unacked_bytes,
            q.consumers.count, len(q.publisher_channels), f.paged_out,
            published, delivered, redelivered, acked, get)
