"""Bindings as the HTTP API shows them (``/api/bindings``, a queue's or an exchange's bindings), with
RabbitMQ's ``properties_key`` (the binding's name in URLs) and the implicit default-exchange binding."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from broker.exchanges.exchange import EXCHANGE, QUEUE
from broker.json_values import json_safe

if TYPE_CHECKING:
    from broker.exchanges.exchange import Binding
    from broker.vhost import VHost


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding key in URLs: the routing key (``~`` when empty), plus ``~`` and a hash of the
    arguments when there are any."""
    rk = urllib.parse.quote(routing_key, safe="") if routing_key else ""
    if not arguments:
        return rk or "~"
    digest = hashlib.sha1(json.dumps(json_safe(arguments), sort_keys=True).encode()).digest()
    return f"{rk}~{base64.urlsafe_b64encode(digest[:12]).decode().rstrip('=')}"


def binding_info(vh: VHost, b: Binding) -> dict[str, Any]:
    return {
        "source": b.source,
        "vhost": vh.name,
        "destination": b.destination,
        "destination_type": "queue" if b.kind == QUEUE else "exchange",
        "routing_key": b.routing_key,
        "arguments": json_safe(b.arguments),
        "properties_key": properties_key(b.routing_key, b.arguments),
    }


def default_binding_info(vh: VHost, queue_name: str) -> dict[str, Any]:
    """The implicit binding of every queue to the default exchange, which RabbitMQ lists too."""
    return {"source": "", "vhost": vh.name, "destination": queue_name, "destination_type": "queue",
            "routing_key": queue_name, "arguments": {}, "properties_key": properties_key(queue_name, {})}


def vhost_bindings(vh: VHost, with_default: bool = True) -> list[dict[str, Any]]:
    out = [default_binding_info(vh, q.name) for q in vh.queues] if with_default else []
    out.extend(binding_info(vh, b) for b in sorted(vh.bindings(), key=lambda b: (b.source, b.destination,
                                                                                   b.routing_key)))
    return out


def kind_of(destination_type: str) -> str:
    return QUEUE if destination_type in ("q", "queue") else EXCHANGE
