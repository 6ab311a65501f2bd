"""The ``leveret_federation_*`` Prometheus families (broker/prometheus/metrics.py yields them on both endpoints).

RabbitMQ 3.10's rabbitmq_prometheus has no federation families; these are Leveret's own, shaped like the
shovel's (broker/shovel/metrics.py): links by status, and per link the messages it published here, acked
upstream and dropped by the hop rule. Links are labelled one by one (vhost, exchange, upstream): there are as
many as federated exchanges times upstreams, a handful, and one that stopped must show. A queue's links
(broker/federation/queue_link.py) have families of their own, labelled (vhost, queue, upstream): an exchange
and a queue may share a name, and a dashboard of the exchange families must not change meaning.
``leveret_federation_links`` counts both kinds, as GET /api/federation-links lists both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from broker.federation.link import FederationLink
from broker.federation.queue_link import QueueLink

STATUSES = ("starting", "running", "error")


def federation_families(links: Iterable[FederationLink],
                         queue_links: Iterable[QueueLink] = ()) -> Iterator[Metric]:
    labels = ["vhost", "exchange", "upstream"]
    published = CounterMetricFamily("leveret_federation_messages_published",
                                    "Messages a federation link published into its exchange here (since the link "
                                    "started)", labels=labels)
    acked = CounterMetricFamily("leveret_federation_messages_acked",
                                "Messages a federation link acknowledged upstream (since the link started)",
                                labels=labels)
    dropped = CounterMetricFamily("leveret_federation_messages_dropped",
                                  "Messages a federation link dropped by the max-hops rule (since it started)",
                                  labels=labels)
    status = GaugeMetricFamily("leveret_federation_link_status", "1 for the status a federation link is in "
                               "(starting, running, error), 0 for the others", labels=[*labels, "status"])
    by_status = dict.fromkeys(STATUSES, 0)
    for link in list(links):
        lv = [link.vhost, link.exchange, link.upstream.name]
        published.add_metric(lv, link.published)
        acked.add_metric(lv, link.acked)
        dropped.add_metric(lv, link.dropped)
        for s in STATUSES:
            status.add_metric([*lv, s], int(link.state == s))
        by_status[link.state] = by_status.get(link.state, 0) + 1
    q_labels = ["vhost", "queue", "upstream"]
    q_published = CounterMetricFamily("leveret_federation_queue_messages_published",
                                      "Messages a queue's federation link fetched from its upstream queue and "
                                      "published into the queue here (since the link started)", labels=q_labels)
    q_acked = CounterMetricFamily("leveret_federation_queue_messages_acked",
                                  "Messages a queue's federation link acknowledged upstream (since it started)",
                                  labels=q_labels)
    q_status = GaugeMetricFamily("leveret_federation_queue_link_status", "1 for the status a queue's federation "
                                 "link is in (starting, running, error), 0 for the others",
                                 labels=[*q_labels, "status"])
    for qlink in list(queue_links):
        lv = [qlink.vhost, qlink.queue, qlink.upstream.name]
        q_published.add_metric(lv, qlink.published)
        q_acked.add_metric(lv, qlink.acked)
        for s in STATUSES:
            q_status.add_metric([*lv, s], int(qlink.state == s))
        by_status[qlink.state] = by_status.get(qlink.state, 0) + 1
    links_family = GaugeMetricFamily("leveret_federation_links", "Federation links on this node (of exchanges "
                                     "and of queues), by status", labels=["status"])
    for s, n in by_status.items():
        links_family.add_metric([s], n)
    yield links_family
    yield published
    yield acked
    yield dropped
    yield status
    yield q_published
    yield q_acked
    yield q_status
