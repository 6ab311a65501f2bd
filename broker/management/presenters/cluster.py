"""What a cluster member's listings add to its own queues: the shared queues' count from PostgreSQL and the
other members' node-local queues as those members answered (:func:`cluster_view`), and such a queue's HTTP
API object. None of it on a single node."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.json_values import json_safe
from broker.persistence import untable
from storage.backing_queue import Figures

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot
    from broker.node import Node


class ClusterView(NamedTuple):
    """What a cluster member's listings add to its own queues' figures (cluster_view)."""

    shared: Snapshot | None  # the shared queues as PostgreSQL counts them
    others: list[OtherMemberQueue]  # the other members' node-local queues, as they answered


async def cluster_view(node: Node, vhost: str | None = None) -> ClusterView | None:
    """None on a single node; on a cluster member, the count of the shared queues (at most a second old) and
    the other members' node-local queues (of ``vhost``, or of every vhost) that are not this member's."""
    cluster = node.cluster
    if cluster is None:
        return None
    shared = await cluster.shared_figures()
    others = []
    for vhost_name, name, member, answer in await cluster.other_members_queues(vhost):
        vh = node.vhosts.get(vhost_name)
        if vh is not None and vh.queues.get(name) is None:
            others.append(OtherMemberQueue(vhost_name, name, member, answer))
    return ClusterView(shared, others)


class OtherMemberQueue:
    """A node-local queue of another cluster member, as that member answered for it (broker/clustering/cluster_forwarding.py
    ``queue_answer``; ``{"state": "down"}`` when it did not answer): what a listing sorts and shows."""

    def __init__(self, vhost: str, name: str, member: str, answer: dict[str, Any]) -> None:
        self.name = name
        self.vhost = _Named(vhost)
        self.member = member
        self.answer = answer
        self.durable = bool(answer.get("durable", True))
        self.consumers = _Count(int(answer.get("consumers", 0)))

    def rates(self) -> dict[str, float]:
        """The rates its member's sampler has of it (:data:`QUEUE_SAMPLED`; none from a member that did not
        answer, or one without the HTTP API)."""
        rates = self.answer.get("rates")
        return rates if isinstance(rates, dict) else {}

    def figures(self) -> Figures:
        a = self.answer
        return Figures(int(a.get("ready", 0)), int(a.get("unacked", 0)), int(a.get("ready_bytes", 0)),
                       int(a.get("unacked_bytes", 0)), int(a.get("paged_out", 0)))


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


class _Count:
    def __init__(self, count: int) -> None:
        self.count = count


def other_member_queue_info(q: OtherMemberQueue) -> dict[str, Any]:
    """The HTTP API object of another member's node-local queue: ``node`` is that member; the figures, the
    message counters and their rates are its answer (rates are sampled where the queue lives), so every
    member shows what the owner shows."""
    a, f = q.answer, q.figures()
    try:
        arguments = json_safe(untable(base64.b64decode(a["args"]))) if "args" in a else {}
    except (ValueError, TypeError):
        arguments = {}
    info: dict[str, Any] = {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": bool(a.get("auto_delete", False)),
        "exclusive": bool(a.get("exclusive", False)),
        "arguments": arguments,
        "node": q.member,
        "type": a.get("type", "classic"),
        "state": a.get("state", "running"),
        "consumers": q.consumers.count,
        "publishers": int(a.get("publishers", 0)),
        "policy": a.get("policy"),
        "message_bytes": f.bytes,
        "message_bytes_ready": f.ready_bytes,
        "message_bytes_unacknowledged": f.unacked_bytes,
        "messages_paged_out": f.paged_out,
        "message_stats": {},
    }
    rates = q.rates()
    stats = a.get("stats")
    if isinstance(stats, dict):
        for name, value in stats.items():
            info["message_stats"][name] = value
            info["message_stats"][name + "_details"] = {"rate": float(rates.get(name, 0.0))}
    for name, value in (("messages", f.messages), ("messages_ready", f.ready),
                        ("messages_unacknowledged", f.unacked)):
        info[name] = value
        info[name + "_details"] = {"rate": float(rates.get(name, 0.0))}
    return info
