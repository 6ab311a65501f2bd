"""Broker objects as the HTTP API shows them, with RabbitMQ's JSON field names (``messages_ready``,
``messages_unacknowledged``, ``message_stats``, ``consumers``, ...), and the rate sampler behind the
``*_details.rate`` fields.

The broker's objects are read with ``getattr`` defaults where a field is newer than the code that reads it,
so the API keeps answering while the message path grows.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

from broker.exchange import EXCHANGE, QUEUE
from broker.management.common import json_safe
from broker.metrics import queue_figures

if TYPE_CHECKING:
    from broker.node import Node
    from broker.vhost import VHost

DEFAULT_EXCHANGE_PATH = "amq.default"
EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
}


# -- rates ----------------------------------------------------------------------------------------------------------

class RateSampler:
    """Keeps the previous sample of every counter it is asked about; a rate is the change per second
    between the last two samples (taken every ``interval`` seconds by the app)."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._prev: dict[Any, tuple[float, int]] = {}
        self._rates: dict[Any, float] = {}

    def observe(self, key: Any, value: int, now: float) -> None:
        prev = self._prev.get(key)
        if prev is not None and now > prev[0]:
            self._rates[key] = max(0.0, (value - prev[1]) / (now - prev[0]))
        self._prev[key] = (now, value)

    def rate(self, key: Any) -> float:
        return round(self._rates.get(key, 0.0), 1)

    def sample(self, node: Node) -> None:
        now = time.monotonic()
        for name, value in global_message_counts(node).items():
            self.observe(("global", name), value, now)
        live = set()
        for vh in node.vhosts.values():
            for q in vh.queues:
                key = id(q)
                live.add(key)
                for name, value in queue_message_counts(q).items():
                    self.observe((key, name), value, now)
                ready, unacked, total = queue_figures(q)[:3]
                for name, value in (("messages_ready", ready), ("messages_unacknowledged", unacked),
                                    ("messages", total)):
                    self.observe((key, name), value, now)
        for key in [k for k in self._prev if k[0] != "global" and k[0] not in live]:
            self._prev.pop(key, None)
            self._rates.pop(key, None)


def with_details(counts: dict[str, int], sampler: RateSampler | None, key: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in counts.items():
        out[name] = value
        out[name + "_details"] = {"rate": sampler.rate((key, name)) if sampler else 0.0}
    return out


def global_message_counts(node: Node) -> dict[str, int]:
    c = node.counters
    get = c.messages_delivered_get_manual_ack + c.messages_delivered_get_auto_ack
    deliver = c.messages_delivered_consume_manual_ack + c.messages_delivered_consume_auto_ack
    return {
        "publish": c.messages_received,
        "confirm": c.messages_confirmed,
        "return_unroutable": c.messages_unroutable_returned,
        "drop_unroutable": c.messages_unroutable_dropped,
        "deliver_get": max(c.messages_delivered, deliver + get),
        "deliver": c.messages_delivered_consume_manual_ack,
        "deliver_no_ack": c.messages_delivered_consume_auto_ack,
        "get": c.messages_delivered_get_manual_ack,
        "get_no_ack": c.messages_delivered_get_auto_ack,
        "get_empty": c.messages_get_empty,
        "redeliver": c.messages_redelivered,
        "ack": c.messages_acknowledged,
    }


def queue_message_counts(q: Any) -> dict[str, int]:
    s = q.stats
    delivered = getattr(s, "delivered", 0)
    get = getattr(s, "get", 0)
    return {"publish": getattr(s, "published", 0), "deliver_get": delivered + get, "deliver": delivered,
            "get": get, "redeliver": getattr(s, "redelivered", 0), "ack": getattr(s, "acked", 0)}


# -- queues -------------------------------------------------------------------------------------------------------

def queue_type(q: Any) -> str:
    t = q.arguments.get("x-queue-type")
    if isinstance(t, bytes):
        t = t.decode(errors="replace")
    return t if isinstance(t, str) and t else "classic"


def queue_info(node: Node, q: Any, sampler: RateSampler | None = None) -> dict[str, Any]:
    ready, unacked, total, ready_bytes, all_bytes, consumers, publishers = queue_figures(q)
    key = id(q)
    info: dict[str, Any] = {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner is not None,
        "arguments": json_safe(q.arguments),
        "node": node.name,
        "type": queue_type(q),
        "state": "running",
        "consumers": consumers,
        "publishers": publishers,
        "consumer_capacity": 1.0 if consumers else 0.0,
        "consumer_utilisation": 1.0 if consumers else 0.0,
        "exclusive_consumer_tag": getattr(getattr(q, "exclusive_consumer", None), "tag", None),
        "policy": q.settings.policy,
        "operator_policy": q.settings.operator_policy,
        "effective_policy_definition": json_safe(getattr(q, "effective_policy_definition", None) or {}),
        "message_bytes": all_bytes,
        "message_bytes_ready": ready_bytes,
        "message_bytes_unacknowledged": all_bytes - ready_bytes,
        "messages_paged_out": _call(q.bq, "paged_out_count"),
        "message_stats": with_details(queue_message_counts(q), sampler, key),
    }
    for name, value in (("messages", total), ("messages_ready", ready), ("messages_unacknowledged", unacked)):
        info[name] = value
        info[name + "_details"] = {"rate": sampler.rate((key, name)) if sampler else 0.0}
    if q.exclusive_owner is not None:
        info["owner_pid_details"] = {"name": getattr(q.exclusive_owner, "name", "")}
    return info


def _call(obj: Any, name: str) -> int:
    fn = getattr(obj, name, None)
    try:
        return int(fn()) if callable(fn) else 0
    except Exception:
        return 0


# -- exchanges and bindings ------------------------------------------------------------------------------------

def exchange_info(node: Node, vh: VHost, ex: Any) -> dict[str, Any]:
    return {
        "name": ex.name,
        "vhost": vh.name,
        "type": ex.type_name,
        "durable": ex.durable,
        "auto_delete": ex.auto_delete,
        "internal": ex.internal,
        "arguments": json_safe(ex.arguments),
        "user_who_performed_action": getattr(ex, "created_by", "rmq-internal"),
        "policy": getattr(ex, "policy_name", None),
    }


def all_exchanges(vh: VHost) -> list[Any]:
    """The default exchange first (as RabbitMQ lists it, name ""), then the others by name."""
    return [vh.default_exchange, *sorted(vh.exchanges.values(), key=lambda e: e.name)]


def lookup_exchange(vh: VHost, path_name: str) -> Any | None:
    if path_name in (DEFAULT_EXCHANGE_PATH, ""):
        return vh.default_exchange
    return vh.exchanges.get(path_name)


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding key in URLs: the routing key (``~`` when empty), plus ``~`` and a hash of the
    arguments when there are any."""
    rk = urllib.parse.quote(routing_key, safe="") if routing_key else ""
    if not arguments:
        return rk or "~"
    digest = hashlib.sha1(json.dumps(json_safe(arguments), sort_keys=True).encode()).digest()
    return f"{rk}~{base64.urlsafe_b64encode(digest[:12]).decode().rstrip('=')}"


def binding_info(vh: VHost, b: Any) -> dict[str, Any]:
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


# -- connections, channels, consumers -----------------------------------------------------------------------

def _ms(ts: float) -> int:
    return int(ts * 1000)


def connection_info(node: Node, conn: Any) -> dict[str, Any]:
    transport = getattr(conn, "transport", None)
    local = transport.get_extra_info("sockname") if transport is not None else None
    local = local if isinstance(local, tuple) else ("", 0)
    user = getattr(conn, "user", None)
    vhost = getattr(conn, "vhost", None)
    state = {0: "starting", 1: "starting", 2: "tuning", 3: "opening", 4: "running", 5: "closing",
             6: "closed"}.get(getattr(conn, "state", 4), "running")
    props = json_safe(getattr(conn, "client_properties", {}) or {})
    return {
        "name": conn.name,
        "node": node.name,
        "vhost": vhost.name if vhost is not None else None,
        "user": user.name if user is not None else "",
        "user_who_performed_action": user.name if user is not None else "",
        "state": state,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "auth_mechanism": getattr(conn, "auth_mechanism", "PLAIN"),
        "ssl": False,
        "peer_host": conn.peer[0],
        "peer_port": conn.peer[1],
        "host": str(local[0]),
        "port": int(local[1]) if len(local) > 1 else 0,
        "channels": len(getattr(conn, "channels", {})),
        "channel_max": getattr(conn, "channel_max", 0),
        "frame_max": getattr(conn, "frame_max", 0),
        "timeout": getattr(conn, "heartbeat", 0),
        "connected_at": _ms(getattr(conn, "connected_at", 0.0)),
        "client_properties": props,
        "recv_oct": getattr(conn, "recv_oct", 0),
        "send_oct": getattr(conn, "send_oct", 0),
        "blocked": bool(getattr(conn, "blocked", False)),
    }


def channel_name(conn: Any, ch: Any) -> str:
    return f"{conn.name} ({ch.id})"


def channel_info(node: Node, conn: Any, ch: Any) -> dict[str, Any]:
    user = getattr(conn, "user", None)
    tx = getattr(ch, "tx", None)
    return {
        "name": channel_name(conn, ch),
        "number": ch.id,
        "node": node.name,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": user.name if user is not None else "",
        "user_who_performed_action": user.name if user is not None else "",
        "state": "closing" if getattr(ch, "closing", False) else "running",
        "connection_details": {"name": conn.name, "peer_host": conn.peer[0], "peer_port": conn.peer[1]},
        "consumer_count": len(getattr(ch, "consumers", {})),
        "messages_unacknowledged": len(getattr(ch, "unacked", {})),
        "messages_unconfirmed": len(getattr(ch, "_confirm_acks", ()) or ()),
        "messages_uncommitted": len(tx) if tx else 0,
        "acks_uncommitted": 0,
        "prefetch_count": getattr(ch, "prefetch_count", 0),
        "global_prefetch_count": getattr(ch, "global_prefetch", 0),
        "confirm": bool(getattr(ch, "confirm", False)),
        "transactional": tx is not None,
        "pending_raft_commands": 0,
    }


def consumer_info(node: Node, conn: Any, ch: Any, consumer: Any) -> dict[str, Any]:
    q = consumer.queue
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": q.name, "vhost": q.vhost.name},
        "channel_details": {"name": channel_name(conn, ch), "number": ch.id, "node": node.name,
                            "connection_name": conn.name, "peer_host": conn.peer[0], "peer_port": conn.peer[1],
                            "user": conn.user.name},
        "ack_required": not consumer.no_ack,
        "exclusive": bool(getattr(consumer, "exclusive", False)),
        "prefetch_count": getattr(consumer, "prefetch", 0),
        "arguments": json_safe(getattr(consumer, "arguments", {}) or {}),
        "active": True,
        "activity_status": "up",
        "consumer_timeout": node.settings.consumer_timeout,
        "priority": getattr(consumer, "priority", 0),
    }


def iter_channels(node: Node):
    for conn in list(node.connections):
        for ch in list(getattr(conn, "channels", {}).values()):
            yield conn, ch


def iter_consumers(node: Node):
    for conn, ch in iter_channels(node):
        for consumer in list(getattr(ch, "consumers", {}).values()):
            yield conn, ch, consumer


# -- vhosts, users, permissions, policies ---------------------------------------------------------------------

def vhost_info(node: Node, vh: VHost) -> dict[str, Any]:
    ready = unacked = 0
    for q in vh.queues:
        r, u = queue_figures(q)[:2]
        ready += r
        unacked += u
    description = getattr(vh, "description", "")
    tags = list(getattr(vh, "tags", []))
    dqt = getattr(vh, "default_queue_type", "classic")
    return {
        "name": vh.name,
        "description": description,
        "tags": tags,
        "default_queue_type": dqt,
        "metadata": {"description": description, "tags": tags, "default_queue_type": dqt},
        "tracing": False,
        "cluster_state": {node.name: "running"},
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
    }


def user_info(user: Any) -> dict[str, Any]:
    return {"name": user.name, "password_hash": user.password_hash, "hashing_algorithm": user.hashing_algorithm,
            "tags": list(user.tags), "limits": dict(user.limits)}


def permission_info(user: Any, vhost: str) -> dict[str, Any]:
    p = user.permissions[vhost]
    return {"user": user.name, "vhost": vhost, **p.as_dict()}
