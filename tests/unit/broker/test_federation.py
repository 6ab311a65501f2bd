"""broker/federation/'s pure parts: which links a vhost's policies and upstream parameters ask for (plan.py),
the upstream's defaults and a set's overrides (definition.py), and how a link turns this node's confirms into
upstream acks (link.py's FederationLink.confirmed: one ``multiple`` ack only when no older delivery waits)."""

from __future__ import annotations

from broker.federation.definition import Upstream
from broker.federation.link import FederationLink
from broker.federation.plan import plan, plan_queues
from broker.policies.policy import Policy
from broker.shovel.worker import LocalLogin

UP = {"uri": "amqp://h1"}


def test_a_policy_names_one_upstream_a_set_or_all():
    params = {("federation-upstream", "u1"): UP, ("federation-upstream", "u2"): {"uri": "amqp://h2", "max-hops": 2},
              ("federation-upstream-set", "s"): [{"upstream": "u2", "max-hops": 5}, {"upstream": "missing"}]}
    one = Policy("p", "^fed", {"federation-upstream": "u1"}, apply_to="exchanges")
    assert set(plan(["fed.a", "other", "amq.topic"], [one], params)) == {("fed.a", "u1")}
    every = Policy("p", ".*", {"federation-upstream-set": "all"}, apply_to="all")
    assert set(plan(["x", "amq.direct"], [every], params)) == {("x", "u1"), ("x", "u2")}
    named = Policy("p", ".*", {"federation-upstream-set": "s"}, apply_to="exchanges")
    links = plan(["x"], [named], params)
    assert list(links) == [("x", "u2")] and links[("x", "u2")].max_hops == 5  # the set's entry overrides
    queues_only = Policy("p", ".*", {"federation-upstream": "u1"}, apply_to="queues")
    assert plan(["x"], [queues_only], params) == {}


def test_the_highest_priority_policy_decides():
    params = {("federation-upstream", "u1"): UP}
    low = Policy("a", ".*", {"federation-upstream": "u1"}, priority=0, apply_to="exchanges")
    high = Policy("b", ".*", {"max-length": 1}, priority=1, apply_to="exchanges")
    assert plan(["x"], [low, high], params) == {}


def test_defaults():
    u = Upstream.parse("u", {"uri": ["amqp://a", "amqp://b"]})
    assert (u.uris, u.exchange, u.max_hops, u.prefetch_count, u.reconnect_delay, u.ack_mode, u.trust_user_id) == \
        (("amqp://a", "amqp://b"), None, 1, 1000, 5.0, "on-confirm", False)


class FakeUpstream:
    def __init__(self) -> None:
        self.acks: list[tuple[int, bool]] = []

    def ack(self, tag: int, multiple: bool) -> None:
        self.acks.append((tag, multiple))


def link_with(pending: dict[int, int]) -> tuple[FederationLink, FakeUpstream]:
    link = FederationLink("/", "x", "topic", Upstream.parse("u", UP), "n", lambda: "n",
                          lambda vh: LocalLogin("h", 1, "u", "p"), dict)
    up = FakeUpstream()
    link._up = up
    link._pending = dict(pending)
    return link, up


def test_confirms_become_upstream_acks():
    # seqs 1..3 were deliveries 1, 3, 4 (delivery 2 was dropped by the hop rule and acked at once)
    link, up = link_with({1: 1, 2: 3, 3: 4})
    link.confirmed(2, True, False)
    assert up.acks == [(3, True)] and link._pending == {3: 4}
    # out of order: seq 3 confirmed alone while seq 1.. is still waiting → acked alone
    link, up = link_with({1: 1, 2: 3, 3: 4})
    link.confirmed(3, False, False)
    link.confirmed(2, True, False)
    assert up.acks == [(4, False), (3, True)]  # 1 and 3 are all that is unacked up to 3


def test_queue_policies_federate_queues_but_not_streams():
    params = {("federation-upstream", "u1"): {"uri": "amqp://h1", "queue": "elsewhere"}}
    p = Policy("p", "^q", {"federation-upstream": "u1"}, apply_to="queues")
    links = plan_queues([("q1", "classic"), ("q2", "quorum"), ("q3", "stream"), ("x", "classic")], [p], params)
    assert set(links) == {("q1", "u1"), ("q2", "u1")} and links[("q1", "u1")].queue == "elsewhere"
    assert plan_queues([("q1", "classic")], [Policy("e", "^q", {"federation-upstream": "u1"},
                                                    apply_to="exchanges")], params) == {}
