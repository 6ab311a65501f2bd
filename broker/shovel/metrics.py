"""The ``leveret_shovel_*`` Prometheus families (broker/prometheus/metrics.py yields them on both endpoints).

RabbitMQ 3.10's rabbitmq_prometheus has no shovel families at all, so these are Leveret's own; a team moving
in watches its move with them (how many messages a shovel has moved, whether it runs).

Shovels are labelled one by one (``vhost``, ``shovel``) on /metrics too, unlike queues: there are as many
series as shovel parameters an operator wrote, a handful, and a sum over shovels would hide the one that
stopped. The counters are the current worker's: ``restart_shovel`` (or a parameter set again) makes a new
worker whose counts start at 0, which Prometheus takes as a counter reset (``rate``/``increase`` handle it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from broker.shovel.worker import ShovelWorker

# The states a worker reports (ShovelWorker.state, GET /api/shovels' ``state``): every one is a series, 1 for
# the state the shovel is in, so an alert is ``leveret_shovel_state{state="terminated"} == 1``.
STATES = ("starting", "running", "terminated")


def shovel_families(workers: Iterable[ShovelWorker]) -> Iterator[Metric]:
    """Messages published to the destination and acknowledged at the source (the ones moved: with
    ``on-confirm`` acked only once the destination confirmed them) per shovel, its state, and the count of
    shovels. Every family is there even with no shovel (a dashboard's zero)."""
    labels = ["vhost", "shovel"]
    published = CounterMetricFamily("leveret_shovel_messages_published",
                                    "Messages a shovel published to its destination (since its worker started)",
                                    labels=labels)
    acked = CounterMetricFamily("leveret_shovel_messages_acked",
                                "Messages a shovel acknowledged at its source, moved for good (since its worker "
                                "started)", labels=labels)
    state = GaugeMetricFamily("leveret_shovel_state", "1 for the state a shovel is in (starting, running, "
                              "terminated), 0 for the others", labels=[*labels, "state"])
    n = 0
    for w in list(workers):
        n += 1
        lv = [w.d.vhost, w.d.name]
        published.add_metric(lv, w.published)
        acked.add_metric(lv, w.acked)
        for s in STATES:
            state.add_metric([*lv, s], int(w.state == s))
    yield GaugeMetricFamily("leveret_shovels", "Dynamic shovels on this node (shovel parameters)", value=n)
    yield published
    yield acked
    yield state
