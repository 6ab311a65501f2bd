"""Exchanges as the HTTP API shows them (``/api/exchanges``), with their message counters and, for the
plugins' exchange types, their own items (the deduplication cache, the delayed messages)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.exchanges.deduplication_exchange import DeduplicationExchange
from broker.exchanges.delayed_exchange import DelayedExchange
from broker.json_values import json_safe
from broker.management.presenters.rates import RateSampler, with_details
from broker.management.presenters.times import iso_ms

if TYPE_CHECKING:
    from broker.exchanges.exchange import Exchange
    from broker.node import Node
    from broker.vhost import VHost

DEFAULT_EXCHANGE_PATH = "amq.default"


def exchange_info(node: Node, vh: VHost, ex: Exchange, sampler: RateSampler | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": ex.name,
        "vhost": vh.name,
        "type": ex.type_name,
        "durable": ex.durable,
        "auto_delete": ex.auto_delete,
        "internal": ex.internal,
        "arguments": json_safe(ex.arguments),
        "user_who_performed_action": "rmq-internal",  # exchanges do not record who declared them
        "policy": None,  # policies apply to queues only (broker/policies/policy.py)
        "message_stats": with_details(exchange_message_counts(ex), sampler, id(ex)),
    }
    if isinstance(ex, DeduplicationExchange) and ex.cache is not None:
        info["cache_info"] = ex.cache.info()  # the plugin's exchange info item
    if isinstance(ex, DelayedExchange):
        stats = ex.delayed_stats()
        nxt = None if stats is None else stats.next_due_ms
        info["delayed_pending"] = 0 if stats is None else stats.count
        info["delayed_bytes"] = 0 if stats is None else stats.nbytes
        info["delayed_next_due"] = None if nxt is None else iso_ms(nxt)
        info["delayed_next_due_ms"] = nxt
    return info


def all_exchanges(vh: VHost) -> list[Exchange]:
    """The default exchange first (as RabbitMQ lists it, name ""), then the others by name."""
    return [vh.default_exchange, *sorted(vh.exchanges.values(), key=lambda e: e.name)]


def lookup_exchange(vh: VHost, path_name: str) -> Exchange | None:
    if path_name in (DEFAULT_EXCHANGE_PATH, ""):
        return vh.default_exchange
    return vh.exchanges.get(path_name)


def exchange_message_counts(ex: Exchange) -> dict[str, int]:
    """An exchange's ``message_stats``: ``publish_in`` (messages clients published to it) and ``publish_out``
    (one per queue such a message reached), counted by VHost.publish."""
    return {"publish_in": ex.publish_in, "publish_out": ex.publish_out}
