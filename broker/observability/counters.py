"""Node-wide plain-integer counters (RabbitMQ's ``rabbit_global_counters``, and a few of ``rabbit_core_metrics``).

The bottom of the metrics stack: the message path adds to these fields (``node.counters.messages_received
+= 1``), and the readers above (the Prometheus exporter in broker/prometheus/metrics.py, the HTTP API's overview) read
them when asked. Nothing here runs on a timer or imports the rest of the broker, so any layer may count.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# rabbitmq_message_size_bytes's bucket bounds (RabbitMQ's): a size counts in the first bucket whose bound is >= it.
MESSAGE_SIZE_BOUNDS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)


@dataclass(slots=True)
class MessageSizes:
    """The histogram of published body sizes: per-bucket counts (MESSAGE_SIZE_BOUNDS, then +Inf) and their sum.
    The publish path adds with ``buckets[bisect_left(MESSAGE_SIZE_BOUNDS, size)] += 1`` (a C bisect over eight
    ints) and ``sum += size``; the exporter accumulates the buckets when scraped."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(MESSAGE_SIZE_BOUNDS) + 1))
    sum: int = 0


@dataclass(slots=True)
class GlobalCounters:
    """Every field maps to ``rabbitmq_global_<name>_total`` or to the metric named in the exporter's
    ``OBJECT_COUNTER_METRICS``. Declared and typed, so a misspelt counter is an error, not a new attribute."""

    # messages (rabbitmq_global_*_total{protocol="amqp091"})
    messages_received: int = 0
    messages_received_confirm: int = 0
    messages_routed: int = 0
    messages_unroutable_dropped: int = 0
    messages_unroutable_returned: int = 0
    messages_confirmed: int = 0
    messages_delivered: int = 0
    messages_delivered_consume_manual_ack: int = 0
    messages_delivered_consume_auto_ack: int = 0
    messages_delivered_get_manual_ack: int = 0
    messages_delivered_get_auto_ack: int = 0
    messages_get_empty: int = 0
    messages_redelivered: int = 0
    messages_acknowledged: int = 0
    # dead-lettering (rabbitmq_global_messages_dead_lettered_<reason>_total)
    messages_dead_lettered_expired: int = 0
    messages_dead_lettered_rejected: int = 0
    messages_dead_lettered_maxlen: int = 0
    # objects (rabbitmq_*_total)
    connections_opened: int = 0
    connections_closed: int = 0
    channels_opened: int = 0
    channels_closed: int = 0
    queues_declared: int = 0
    queues_created: int = 0
    queues_deleted: int = 0
    # authentication (rabbitmq_auth_attempts_*_total)
    auth_attempts: int = 0
    auth_attempts_succeeded: int = 0
    auth_attempts_failed: int = 0
    # rabbitmq_message_size_bytes (not a counter: left out of as_dict)
    message_sizes: MessageSizes = field(default_factory=MessageSizes)

    def dead_lettered(self, reason: str, count: int) -> None:
        """``count`` messages were dead-lettered for ``reason`` (``expired``, ``rejected``, ``maxlen``; the
        reasons RabbitMQ's classic queues count). Other reasons (``delivery_limit``) have no counter yet."""
        if reason == "expired":
            self.messages_dead_lettered_expired += count
        elif reason == "rejected":
            self.messages_dead_lettered_rejected += count
        elif reason == "maxlen":
            self.messages_dead_lettered_maxlen += count

    def as_dict(self) -> dict[str, int]:
        """Every plain counter by name (the histogram ``message_sizes`` is not one)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}  # declared fields
