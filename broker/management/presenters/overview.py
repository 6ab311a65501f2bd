"""The node's message counters and object churn as ``/api/overview`` shows them (``message_stats``,
``churn_rates``), a cluster member's summed over the members."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker.management.presenters.rates import RateSampler, with_details

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot
    from broker.node import Node


def global_message_counts(node: Node, shared: Snapshot | None = None) -> dict[str, int]:
    """The overview's ``message_stats``: this node's counters; on a cluster member (``shared``), plus every other
    live member's as it last wrote them to PostgreSQL (at most a flush, ~1 s, old), so that every member shows
    the cluster's traffic, as RabbitMQ's overview does."""
    out = message_counts(node.counters.as_dict())
    if shared is not None:
        for member, counters in shared.member_counters.items():
            if member != node.name:
                for name, value in message_counts(counters).items():
                    out[name] += value
    return out


def overview_message_stats(node: Node, sampler: RateSampler | None, shared: Snapshot | None) -> dict[str, Any]:
    """The overview's ``message_stats`` with their rates. On a cluster member (``shared``) the rates are the
    members' counter growth over their last sampled slot as PostgreSQL holds it (storage/pg/queue_stats.py,
    schema version 7), summed in member order: the same on every member asked within one slot, where each
    member's own sampler would take the cluster's sums at its own moments. On one node, the sampler's."""
    counts = global_message_counts(node, shared)
    if shared is None:
        return with_details(counts, sampler, "global")
    rates = dict.fromkeys(counts, 0.0)
    for delta in shared.member_deltas:
        for name, grown in message_counts(delta.growth).items():
            rates[name] += grown / delta.seconds
    out: dict[str, Any] = {}
    for name, value in counts.items():
        out[name] = value
        out[name + "_details"] = {"rate": round(rates[name], 1)}
    return out


def message_counts(c: Mapping[str, int]) -> dict[str, int]:
    """``message_stats`` from node-wide counters by name (broker/observability/counters.py GlobalCounters.as_dict)."""
    def n(name: str) -> int:
        return int(c.get(name, 0))

    get = n("messages_delivered_get_manual_ack") + n("messages_delivered_get_auto_ack")
    deliver = n("messages_delivered_consume_manual_ack") + n("messages_delivered_consume_auto_ack")
    return {
        "publish": n("messages_received"),
        "confirm": n("messages_confirmed"),
        "return_unroutable": n("messages_unroutable_returned"),
        "drop_unroutable": n("messages_unroutable_dropped"),
        "deliver_get": max(n("messages_delivered"), deliver + get),
        "deliver": n("messages_delivered_consume_manual_ack"),
        "deliver_no_ack": n("messages_delivered_consume_auto_ack"),
        "get": n("messages_delivered_get_manual_ack"),
        "get_no_ack": n("messages_delivered_get_auto_ack"),
        "get_empty": n("messages_get_empty"),
        "redeliver": n("messages_redelivered"),
        "ack": n("messages_acknowledged"),
    }


def churn_counts(node: Node) -> dict[str, int]:
    """The node's object churn counters under the names of RabbitMQ's ``churn_rates`` (in /api/overview)."""
    c = node.counters
    return {
        "channel_closed": c.channels_closed,
        "channel_created": c.channels_opened,
        "connection_closed": c.connections_closed,
        "connection_created": c.connections_opened,
        "queue_created": c.queues_created,
        "queue_declared": c.queues_declared,
        "queue_deleted": c.queues_deleted,
    }
