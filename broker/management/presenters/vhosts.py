"""Vhosts as the HTTP API shows them (``/api/vhosts``), with the messages in their queues and those
totals' rates, the same on every cluster member."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.management.presenters.cluster import ClusterView
from broker.management.presenters.queue_figures import figures_of, is_shared
from broker.management.presenters.rates import RateSampler

if TYPE_CHECKING:
    from broker.node import Node
    from broker.vhost import VHost


def vhost_message_totals(vh: VHost, view: ClusterView | None = None) -> dict[str, int]:
    """The messages in a vhost's queues (``messages``, ``messages_ready``, ``messages_unacknowledged``); on a
    cluster member (``view``) the shared queues as PostgreSQL counts them and the other members' queues too,
    so that every member answers the same totals."""
    ready = unacked = 0
    shared = view.shared if view is not None else None
    for q in list(vh.queues.occupied):  # every other queue holds no message (QueueRegistry.occupied)
        f = figures_of(q, shared)
        ready += f.ready
        unacked += f.unacked
    for other in view.others if view is not None else ():
        if other.vhost.name == vh.name:
            f = other.figures()
            ready += f.ready
            unacked += f.unacked
    return {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}


# The vhost totals' names (vhost_message_totals), whose rates vhost_message_rates works out.
TOTALS = ("messages", "messages_ready", "messages_unacknowledged")


def vhost_message_rates(vh: VHost, sampler: RateSampler | None, view: ClusterView | None = None) -> dict[str, float]:
    """The rates of a vhost's :func:`vhost_message_totals`. On one node, the sampler's rate of the totals. On a
    cluster member (``view``), the sum of the rates of the queues in them, each as every member shows it (a
    shared queue's as PostgreSQL sampled it, this member's own queues' from its sampler, another member's
    queues' as that member answered): the same on every member asked within one sample, where the rate of
    each member's own sum would count the other members' queues at zero."""
    if sampler is None:
        return dict.fromkeys(TOTALS, 0.0)
    if view is None:
        return {name: sampler.rate((("vhost", vh.name), name)) for name in TOTALS}
    shared = view.shared
    sums = dict.fromkeys(TOTALS, 0.0)
    for q in vh.queues:
        if shared is not None and is_shared(q):
            rates = shared.activity(q.vhost.name, q.name).rates
        else:
            rates = sampler.queue_rates(q)
        for name in TOTALS:
            sums[name] += rates.get(name, 0.0)
    for other in view.others:
        if other.vhost.name == vh.name:
            rates = other.rates()
            for name in TOTALS:
                sums[name] += float(rates.get(name, 0.0))
    return {name: round(value, 1) for name, value in sums.items()}


def vhost_info(node: Node, vh: VHost, sampler: RateSampler | None = None,
               view: ClusterView | None = None) -> dict[str, Any]:
    totals = vhost_message_totals(vh, view)
    rates = vhost_message_rates(vh, sampler, view)
    description = vh.description
    tags = list(vh.tags)
    dqt = vh.default_queue_type
    return {
        "name": vh.name,
        "description": description,
        "tags": tags,
        "default_queue_type": dqt,
        "metadata": {"description": description, "tags": tags, "default_queue_type": dqt},
        "tracing": vh.tracing is not None,
        "cluster_state": {node.name: "running"},
        **{field: value for name, count in totals.items()
           for field, value in ((name, count), (name + "_details", {"rate": rates[name]}))},
    }
