"""Routing to other cluster members' queues (broker/clustering/remote_queue.py), in memory: a vhost whose topology holds
RemoteQueues and the shadow bindings of its exchanges routes to them beside its own queues, through direct,
topic, fanout and headers exchanges, exchange-to-exchange hops, CC, the default exchange and its miss look-up,
and falls back to the alternate exchange only when neither matched; a confirm is CONFIRM_LATER (the forward's
commit sends it). A vhost without one (LocalTopology) routes as it always did. Direct reply-to keys name their member."""

from __future__ import annotations

from typing import Any

from broker.clustering.cluster_forwarding import node_tag, tag_node
from broker.clustering.remote_queue import RemoteQueue, RemoteRoutes, routing_type
from broker.message import Message
from broker.publish import REPLY_TO_PREFIX, ROUTED
from broker.queues.queue_shell import ACCEPTED, CONFIRM_LATER
from broker.vhost import VHost
from protocol.properties import with_properties

HEADER = bytes.fromhex("003c00000000000000000000") + b"\x00\x00"  # class 60, weight 0, body size 0, no properties


def msg(exchange: str, key: str, header: bytes = HEADER) -> Message:
    ex, rk = exchange.encode(), key.encode()
    return Message(exchange, key, bytes([len(ex)]) + ex + bytes([len(rk)]) + rk, header, b"body")


class Forwarder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes, Any]] = []

    def forward(self, q: RemoteQueue, m: Message, persistent: bool, confirm: Any) -> None:
        self.sent.append((q.node, q.name, m.body, confirm))


def remote_vhost(*bindings: tuple[str, str, str, dict[str, Any], str]) -> tuple[VHost, RemoteRoutes, Forwarder]:
    vh = VHost("/")
    fw = Forwarder()
    routes = RemoteRoutes("/")
    queues = {name: RemoteQueue("/", name, "a@x", True, False, fw.forward, lambda: False, lambda r: None)
              for name in ("ra", "rb", "rc")}
    routes.replace(queues, bindings)
    vh.use_topology(routes)  # (the routing part of a cluster member's Topology: all these tests use)
    return vh, routes, fw


def names(qs: list[Any]) -> set[str]:
    return {q.name for q in qs}


def test_shared_exchanges_route_to_remote_queues_beside_local_ones() -> None:
    vh, routes, _fw = remote_vhost(("t", "topic", "order.*", {}, "ra"), ("f", "fanout", "", {}, "rb"),
                                    ("h", "headers", "", {"x-match": "any", "k": "v"}, "rc"),
                                    ("t", "topic", "nobody.*", {}, "unknown-queue"))
    vh.use_topology(None)  # this member's own topology first (its directory hooks are the link's)
    for name, kind in (("t", "topic"), ("f", "fanout"), ("h", "headers")):
        vh.declare_exchange(name, kind, False, True, False, False, {})
    vh.queues.declare("local", False, False, False, False, {}, None)
    vh.bind("t", "local", "queue", "order.#", {})
    vh.use_topology(routes)
    assert names(vh.route(vh.exchanges["t"], msg("t", "order.eu"))) == {"ra", "local"}
    assert names(vh.route(vh.exchanges["t"], msg("t", "order.eu.x"))) == {"local"}
    assert names(vh.route(vh.exchanges["f"], msg("f", ""))) == {"rb"}
    headers = with_properties(HEADER, headers={"k": "v"})
    assert names(vh.route(vh.exchanges["h"], msg("h", "", headers))) == {"rc"}
    assert names(vh.route(vh.exchanges["h"], msg("h", ""))) == set()
    assert names(vh.route(vh.exchanges["t"], msg("t", "nobody.x"))) == set()  # a binding to no known queue


def test_exchange_hops_cc_and_the_alternate_exchange() -> None:
    vh, routes, _fw = remote_vhost(("inner", "direct", "k", {}, "ra"), ("ae", "fanout", "", {}, "rb"))
    vh.use_topology(None)
    vh.declare_exchange("inner", "direct", False, True, False, False, {})
    vh.declare_exchange("ae", "fanout", False, True, False, False, {})
    vh.declare_exchange("outer", "direct", False, True, False, False, {"alternate-exchange": "ae"})
    vh.bind("outer", "inner", "exchange", "k", {})
    vh.use_topology(routes)
    assert names(vh.route(vh.exchanges["outer"], msg("outer", "k"))) == {"ra"}  # outer → inner → a's queue
    assert names(vh.route(vh.exchanges["outer"], msg("outer", "other"))) == {"rb"}  # nothing: the AE
    m = msg("", "ra")
    m.extra_keys = ["rc", "missing"]
    assert names(vh.route(vh.default_exchange, m)) == {"ra", "rc"}


def test_publish_forwards_and_confirms_later_and_a_miss_is_looked_up_once() -> None:
    vh, routes, fw = remote_vhost()
    asked: list[str] = []

    def lookup(name: str) -> RemoteQueue | None:
        asked.append(name)
        return None

    routes.lookup = lookup
    assert vh.publish(vh.default_exchange, msg("", "ra"), True) & ROUTED
    assert fw.sent == [("a@x", "ra", b"body", None)]
    assert vh.publish(vh.default_exchange, msg("", "nowhere"), False) == 0
    assert asked == ["nowhere"]
    q = routes.queues["ra"]
    assert q.deliver_or_enqueue(msg("", "ra"), True, ("channel", 7)) == CONFIRM_LATER
    assert q.deliver_or_enqueue(msg("", "ra"), True, None) == ACCEPTED
    assert q.message_count() == 0 and q.consumers.count == 0
    assert q.refuse("consume").reply_code == 405 and "a@x" in q.refuse("consume").text


def test_a_vhost_without_remote_routes_as_before() -> None:
    vh = VHost("/")
    assert not vh.clustered and vh.remote.queue("none") is None  # LocalTopology
    assert vh.route(vh.default_exchange, msg("", "none")) == []
    assert vh.publish(vh.default_exchange, msg("", "none"), False) == 0


def test_routing_type_and_reply_key_tags() -> None:
    vh = VHost("/")
    vh.declare_exchange("d", "x-delayed-message", False, True, False, False, {"x-delayed-type": "topic"})
    assert routing_type(vh.exchanges["d"]) == "topic"
    assert routing_type(vh.exchanges["amq.headers"]) == "headers"
    for name in ("a@test", "leveret@host-1.example", "ü@x"):
        tag = node_tag(name)
        assert "." not in tag and "=" not in tag and tag_node(tag) == name
    assert tag_node("!!not base64") is None
    assert REPLY_TO_PREFIX == "amq.rabbitmq.reply-to."
