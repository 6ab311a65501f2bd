"""The node's counters (broker/observability/counters.py) and the exporter's tables over them (broker/prometheus/metrics.py): every
metric reads a declared field, and a misspelt counter is an error rather than a silent new attribute."""

from __future__ import annotations

import pytest

from broker.observability.counters import GlobalCounters
from broker.prometheus import metrics


def test_every_exported_counter_is_a_declared_field():
    declared = set(GlobalCounters().as_dict())
    assert set(metrics.GLOBAL_MESSAGE_METRICS) <= declared
    assert set(metrics.OBJECT_COUNTER_METRICS) <= declared
    assert {"messages_dead_lettered_expired", "messages_dead_lettered_rejected",
            "messages_dead_lettered_maxlen"} <= declared


def test_counters_start_at_zero_and_reject_unknown_names() -> None:
    counters = GlobalCounters()
    assert set(counters.as_dict().values()) == {0}
    counters.messages_received += 2
    assert counters.as_dict()["messages_received"] == 2
    with pytest.raises(AttributeError):
        counters.messages_recieved = 1  # type: ignore[attr-defined]


def test_dead_lettered_counts_by_reason():
    counters = GlobalCounters()
    counters.dead_lettered("expired", 3)
    counters.dead_lettered("rejected", 1)
    counters.dead_lettered("maxlen", 2)
    counters.dead_lettered("delivery_limit", 5)  # no counter of its own (RabbitMQ's classic queues have none)
    values = counters.as_dict()
    assert (values["messages_dead_lettered_expired"], values["messages_dead_lettered_rejected"],
            values["messages_dead_lettered_maxlen"]) == (3, 1, 2)
    assert sum(values.values()) == 6
