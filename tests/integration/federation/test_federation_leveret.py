"""Exchange federation between Leveret nodes (issue 37): a Leveret downstream federating an exchange of a second
Leveret process; bound keys cross and unbound ones do not, a binding made downstream later starts matching, two
nodes federating each other pass a message once (max-hops and the loop rule), the link survives the upstream's
restart without losing on-confirm messages, the status API and ``leveret ctl federation_status`` show it, and bad
parameter values get RabbitMQ's 400 reasons."""

from __future__ import annotations

import threading
import time
import urllib.request

import pika
import pytest

from tests.integration.federation.conftest import (
    api,
    federate,
    federation_status,
    leveret_node,
    link_of,
    received,
    wait_for,
)
from tests.integration.shovel.conftest import leveret  # noqa: F401  (the shared Leveret of the 400 tests)

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(240)]


def declare(p: pika.ConnectionParameters, exchange: str, kind: str = "topic",
            bindings: dict[str, list[str]] | None = None) -> None:
    with pika.BlockingConnection(p) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, kind, durable=True)
        for queue, keys in (bindings or {}).items():
            ch.queue_declare(queue, durable=True)
            for key in keys:
                ch.queue_bind(queue, exchange, key)


def publish(p: pika.ConnectionParameters, exchange: str, keys: list[str], start: int = 0) -> None:
    """Persistent messages, confirmed: message_id = their number, routing keys in turn."""
    with pika.BlockingConnection(p) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i, key in enumerate(keys, start):
            ch.basic_publish(exchange, key, f"m{i}".encode(),
                             pika.BasicProperties(delivery_mode=2, message_id=str(i)))


def test_bound_keys_cross_unbound_do_not_and_new_bindings_start_matching(start_broker, uid):
    up = leveret_node(start_broker, f"up-{uid}@localhost")
    down = leveret_node(start_broker, f"down-{uid}@localhost")
    ex, q = f"fed.{uid}", f"{uid}-q"
    up_p, down_p = up.pika_params(heartbeat=0), down.pika_params(heartbeat=0)
    declare(up_p, ex)
    declare(down_p, ex, bindings={q: ["a.*"]})
    federate(down, "up", up.url, "^fed\\.", **{"reconnect-delay": 1})
    link = link_of(down, ex)
    assert link["upstream"] == "up" and link["type"] == "exchange" and link["upstream_exchange"] == ex
    assert link["uri"] == f"amqp://127.0.0.1:{up.port}/%2F"  # no credentials
    assert link["node"] == f"down-{uid}@localhost"
    # what the link made upstream: the exchange and queue named after the downstream node
    internal = f"federation: {ex} -> down-{uid}@localhost"
    status, qinfo = api(up, "GET", f"/api/queues/%2F/{internal.replace(' ', '%20').replace('>', '%3E')}")
    assert status == 200, qinfo
    wait_for(lambda: any(b["source"] == ex and b["routing_key"] == "a.*"
                         for b in api(up, "GET", "/api/bindings/%2F")[1]), 10, "upstream binding a.*")

    publish(up_p, ex, ["a.1", "b.1", "a.2"])
    got = received(down_p, q, at_least=2)
    assert sorted(b for _p, b in got) == [b"m0", b"m2"]  # b.1 is bound nowhere downstream: it did not cross
    hops = got[0][0].headers["x-received-from"]
    assert len(hops) == 1
    assert hops[0]["uri"] == f"amqp://127.0.0.1:{up.port}/%2F"
    assert hops[0]["exchange"] == ex and hops[0]["cluster-name"] == f"up-{uid}@localhost"
    assert hops[0]["vhost"] == "/" and hops[0]["redelivered"] is False

    # a binding made downstream later: bound upstream within the link's next pass
    with pika.BlockingConnection(down_p) as conn:
        conn.channel().queue_bind(q, ex, "b.*")
    wait_for(lambda: any(b["source"] == ex and b["routing_key"] == "b.*"
                         for b in api(up, "GET", "/api/bindings/%2F")[1]), 10, "upstream binding b.*")
    publish(up_p, ex, ["b.2"], start=10)
    assert [b for _p, b in received(down_p, q, at_least=1)] == [b"m10"]
    # and an unbinding downstream is undone upstream
    with pika.BlockingConnection(down_p) as conn:
        conn.channel().queue_unbind(q, ex, "a.*")
    wait_for(lambda: not any(b["source"] == ex and b["routing_key"] == "a.*"
                             for b in api(up, "GET", "/api/bindings/%2F")[1]), 10, "upstream a.* unbound")

    # the status through ctl, with rabbitmqctl's columns
    rows = federation_status(down)
    assert [r["exchange"] for r in rows] == [ex]
    assert rows[0]["status"] == "running" and rows[0]["upstream"] == "up"
    assert list(rows[0]) == sorted(rows[0])
    # the policy goes: the link goes, and its queue and exchange upstream with it (as RabbitMQ's do)
    assert api(down, "DELETE", "/api/policies/%2F/fed-up")[0] == 204
    wait_for(lambda: api(down, "GET", "/api/federation-links")[1] == [], 10, "link stopped")
    quoted = internal.replace(' ', '%20').replace('>', '%3E')
    wait_for(lambda: api(up, "GET", f"/api/queues/%2F/{quoted}")[0] == 404, 10, "upstream queue deleted")
    assert api(up, "GET", f"/api/exchanges/%2F/{quoted}")[0] == 404


def test_two_nodes_federating_each_other_pass_a_message_once(start_broker, uid):
    a = leveret_node(start_broker, f"a-{uid}@localhost")
    b = leveret_node(start_broker, f"b-{uid}@localhost")
    ex = f"fed.{uid}"
    qa, qb = f"{uid}-qa", f"{uid}-qb"
    a_p, b_p = a.pika_params(heartbeat=0), b.pika_params(heartbeat=0)
    declare(a_p, ex, bindings={qa: ["#"]})
    declare(b_p, ex, bindings={qb: ["#"]})
    # max-hops 2 on both: the loop rule (a message names the node it came from), not only the hop count, stops it
    federate(a, "b", b.url, "^fed\\.", **{"max-hops": 2})
    federate(b, "a", a.url, "^fed\\.", **{"max-hops": 2})
    link_of(a, ex)
    link_of(b, ex)
    publish(a_p, ex, ["k.a"])
    publish(b_p, ex, ["k.b"], start=1)
    time.sleep(3)  # time for a copy to go round, were it to
    got_a = received(a_p, qa, at_least=2)
    got_b = received(b_p, qb, at_least=2)
    assert sorted(body for _p, body in got_a) == [b"m0", b"m1"]
    assert sorted(body for _p, body in got_b) == [b"m0", b"m1"]
    from_b = next(p for p, body in got_a if body == b"m1")
    assert [h["cluster-name"] for h in from_b.headers["x-received-from"]] == [f"b-{uid}@localhost"]
    # each node dropped the copy of its own message that came back
    assert wait_for(lambda: (link := link_of(a, ex)) and link["messages_dropped"] == 1 and link, 10, "a dropped 1")
    assert wait_for(lambda: (link := link_of(b, ex)) and link["messages_dropped"] == 1 and link, 10, "b dropped 1")


def test_default_max_hops_stops_a_message_after_one_crossing(start_broker, uid):
    a = leveret_node(start_broker, f"a-{uid}@localhost")
    b = leveret_node(start_broker, f"b-{uid}@localhost")
    c = leveret_node(start_broker, f"c-{uid}@localhost")
    ex, qc = f"fed.{uid}", f"{uid}-qc"
    for node in (a, b):
        declare(node.pika_params(heartbeat=0), ex, bindings={f"{uid}-keep": ["#"]})
    declare(c.pika_params(heartbeat=0), ex, bindings={qc: ["#"]})
    federate(b, "a", a.url, "^fed\\.")  # a → b
    federate(c, "b", b.url, "^fed\\.")  # b → c: a's messages have crossed once (max-hops 1): they stop at b
    link_of(b, ex)
    link_of(c, ex)
    publish(a.pika_params(heartbeat=0), ex, ["x"])
    publish(b.pika_params(heartbeat=0), ex, ["y"], start=1)
    got = received(c.pika_params(heartbeat=0), qc, at_least=1, quiet=2)
    assert [body for _p, body in got] == [b"m1"]


def test_link_survives_an_upstream_restart_without_losing_on_confirm_messages(start_broker, uid):
    up = leveret_node(start_broker, f"up-{uid}@localhost")
    down = leveret_node(start_broker, f"down-{uid}@localhost")
    ex, q = f"fed.{uid}", f"{uid}-q"
    up_p, down_p = up.pika_params(heartbeat=0), down.pika_params(heartbeat=0)
    declare(up_p, ex)
    declare(down_p, ex, bindings={q: ["#"]})
    federate(down, "up", up.url, "^fed\\.", **{"reconnect-delay": 1, "prefetch-count": 50})
    link_of(down, ex)
    n = 2000
    publisher = threading.Thread(target=publish, args=(up_p, ex, ["k"] * n))
    publisher.start()
    publisher.join(120)
    with pika.BlockingConnection(down_p) as conn:
        conn.channel().queue_bind(q, ex, "extra.key")
    wait_for(lambda: any(b["routing_key"] == "extra.key" for b in api(up, "GET", "/api/bindings/%2F")[1]), 10,
             "upstream binding extra.key")
    up.stop()  # graceful: messages still in the link's upstream queue stay there (durable, persistent)
    link_of(down, ex, status="error", timeout=30)
    with pika.BlockingConnection(down_p) as conn:  # unbound here while the upstream is away
        conn.channel().queue_unbind(q, ex, "extra.key")
    up.start()
    link_of(down, ex, timeout=60)  # back, after reconnect-delay
    # the link remembered what it had bound upstream: the binding made stale meanwhile is undone
    wait_for(lambda: {b["routing_key"] for b in api(up, "GET", "/api/bindings/%2F")[1]
                      if b["source"] == ex} == {"#"}, 10, "stale upstream binding removed")
    publish(up_p, ex, ["k"] * 100, start=n)
    got = received(down_p, q, at_least=n + 100, timeout=90, quiet=2)
    ids = {int(p.message_id) for p, _b in got}
    assert ids == set(range(n + 100))  # every one (a redelivery may come twice: at least once)


def upstream_keys(up, exchange: str) -> set[str]:
    """The keys the upstream's ``exchange`` is bound with (to the links' internal exchanges)."""
    return {b["routing_key"] for b in api(up, "GET", "/api/bindings/%2F")[1] if b["source"] == exchange}


def test_keys_unbound_while_the_upstream_was_away_are_unbound_after_a_restart_here(start_broker, uid):
    """Unbound here while the upstream is away, then this node restarted before the link came back: the new
    process never knew what the old one had bound upstream. The link's session binds X's keys on a fresh
    internal exchange and deletes the old one, stale keys and all (RabbitMQ's A/B exchanges): before, the stale
    key stayed bound upstream for good and its messages kept crossing to be dropped here."""
    up = leveret_node(start_broker, f"up-{uid}@localhost")
    down = leveret_node(start_broker, f"down-{uid}@localhost")
    ex, q = f"fed.{uid}", f"{uid}-q"
    up_p = up.pika_params(heartbeat=0)
    declare(up_p, ex, "direct")
    declare(down.pika_params(heartbeat=0), ex, "direct", bindings={q: ["k1", "k2"]})
    federate(down, "up", up.url, "^fed\\.", **{"reconnect-delay": 1})
    link_of(down, ex)
    wait_for(lambda: upstream_keys(up, ex) == {"k1", "k2"}, 10, "both keys bound upstream")
    up.stop()
    link_of(down, ex, status="error", timeout=30)
    with pika.BlockingConnection(down.pika_params(heartbeat=0)) as conn:
        conn.channel().queue_unbind(q, ex, "k1")
    down.stop()
    down.start()
    up.start()
    link_of(down, ex, timeout=60)
    wait_for(lambda: upstream_keys(up, ex) == {"k2"}, 10, "the stale key k1 unbound upstream")
    internal = {b["destination"] for b in api(up, "GET", "/api/bindings/%2F")[1] if b["source"] == ex}
    assert len(internal) == 1, internal  # one internal exchange of the pair left
    publish(up_p, ex, ["k1", "k2"])
    got = received(down.pika_params(heartbeat=0), q, at_least=1, timeout=30, quiet=1.5)
    assert [p.message_id for p, _b in got] == ["1"]  # k2's crossed; k1's stayed upstream


def test_an_upstream_that_cannot_be_reached_shows_error(start_broker, uid):
    down = leveret_node(start_broker, f"down-{uid}@localhost")
    ex = f"fed.{uid}"
    declare(down.pika_params(heartbeat=0), ex, bindings={f"{uid}-q": ["#"]})
    federate(down, "nowhere", "amqp://guest:secret@127.0.0.1:1/%2F", "^fed\\.", **{"reconnect-delay": 30})
    link = link_of(down, ex, status="error")
    assert "could not connect" in link["error"] and "secret" not in link["error"]
    assert link["uri"] == "amqp://127.0.0.1:1/%2F"
    with urllib.request.urlopen(
            f"http://127.0.0.1:{down.prometheus_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'leveret_federation_links{status="error"} 1.0' in text
    assert f'leveret_federation_link_status{{exchange="{ex}",status="error",upstream="nowhere",vhost="/"}} 1.0' \
        in text


def test_upstreams_survive_a_restart_and_travel_in_definitions(start_broker, uid):
    b = start_broker()
    value = {"uri": ["amqp://u:p@h1", "amqp://h2:5673/v"], "exchange": "other", "max-hops": 2,
             "ack-mode": "on-publish", "trust-user-id": True, "expires": 60000, "message-ttl": 1000,
             "prefetch-count": 10, "reconnect-delay": 2}
    assert api(b, "PUT", f"/api/parameters/federation-upstream/%2F/{uid}", {"value": value})[0] == 201
    sets = [{"upstream": uid}, {"upstream": "other", "max-hops": 3}]
    assert api(b, "PUT", f"/api/parameters/federation-upstream-set/%2F/{uid}-set", {"value": sets})[0] == 201
    b.restart()
    assert api(b, "GET", f"/api/parameters/federation-upstream/%2F/{uid}")[1]["value"] == value
    _, defs = api(b, "GET", "/api/definitions")
    rows = {(p["component"], p["name"]): p["value"] for p in defs["parameters"]}
    assert rows[("federation-upstream", uid)] == value
    assert rows[("federation-upstream-set", f"{uid}-set")] == sets
    other = start_broker()
    assert api(other, "POST", "/api/definitions", defs)[0] in (201, 204)
    assert api(other, "GET", f"/api/parameters/federation-upstream-set/%2F/{uid}-set")[1]["value"] == sets
    assert api(b, "DELETE", f"/api/parameters/federation-upstream/%2F/{uid}")[0] == 204
    assert api(b, "GET", f"/api/parameters/federation-upstream/%2F/{uid}")[0] == 404


# RabbitMQ 3.10's reasons (rabbit_federation_parameters through rabbit_parameter_validation).
INVALID = [
    ("federation-upstream", {"exchange": "x"}, 'Key "uri" not found in u1'),
    ("federation-upstream", {"uri": "foo://x"}, '"foo://x" not a valid URI: {{unexpected_uri_scheme,"foo"},"foo://x"}'),
    ("federation-upstream", {"uri": "amqp://h", "max-hops": "x"}, 'max-hops should be a number, actually was <<"x">>'),
    ("federation-upstream", {"uri": "amqp://h", "ack-mode": "bogus"},
     'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], actually was <<"bogus">>'),
    ("federation-upstream", {"uri": "amqp://h", "trust-user-id": "yes"},
     'trust-user-id should be boolean, actually was <<"yes">>'),
    ("federation-upstream", {"uri": "amqp://h", "exchange": 5}, "exchange should be binary, actually was 5"),
    ("federation-upstream", {"uri": "amqp://h", "prefetch-count": "x", "reconnect-delay": "y"},
     ('prefetch-count should be a number, actually was <<"x">>\nreconnect-delay should be a number, actually was '
      '<<"y">>')),
    ("federation-upstream", {"uri": "amqp://h", "bogus": 1}, 'Unrecognised terms [{<<"bogus">>,1}] in u1'),
    ("federation-upstream", {"uri": ["amqp://h", 3]}, "uri should be binary, actually was 3"),
    ("federation-upstream-set", [{"max-hops": 2}], 'Key "upstream" not found in u1'),
    ("federation-upstream-set", [{"upstream": 3}], "upstream should be binary, actually was 3"),
]


@pytest.mark.parametrize("component,value,reason", INVALID)
def test_bad_values_get_400_with_a_reason(leveret, component, value, reason):  # noqa: F811
    status, body = api(leveret, "PUT", f"/api/parameters/{component}/%2F/u1", {"value": value})
    assert status == 400
    assert body["reason"] == f"Validation failed\n\n{reason}\n"
    assert api(leveret, "GET", f"/api/parameters/{component}/%2F/u1")[0] == 404


# RabbitMQ 3.10.8's answers to policies with the federation plugin's keys (measured through its HTTP API with
# rabbitmq_federation enabled; the Erlang terms come HTML-escaped in its 400 reasons).
TOGETHER = "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together"
INVALID_POLICIES = [
    ({"federation-upstream": "a", "federation-upstream-set": "all"}, TOGETHER),
    ({"federation-upstream": "a", "federation-upstream-set": 5}, TOGETHER),
    ({"federation-upstream": 5}, "5 is not a valid federation upstream name"),
    ({"federation-upstream": {"a": 1}}, '#{&lt;&lt;"a"&gt;&gt; =&gt; 1} is not a valid federation upstream name'),
    ({"federation-upstream-set": ["x"]}, '[&lt;&lt;"x"&gt;&gt;] is not a valid federation upstream set name'),
    ({"federation-upstream-set": True}, "true is not a valid federation upstream set name"),
]


@pytest.mark.parametrize("definition,reason", INVALID_POLICIES)
def test_bad_federation_policy_keys_get_400_with_a_reason(leveret, uid, definition, reason):  # noqa: F811
    policy = {"pattern": "^fed\\.", "apply-to": "exchanges", "definition": definition}
    status, body = api(leveret, "PUT", f"/api/policies/%2F/{uid}", policy)
    assert (status, body["reason"]) == (400, f"Validation failed\n\n{reason}\n")
    assert api(leveret, "GET", f"/api/policies/%2F/{uid}")[0] == 404
    status, body = api(leveret, "POST", "/api/definitions", {"policies": [{"vhost": "/", "name": uid, **policy}]})
    assert status == 400 and reason in body["reason"], body
    assert api(leveret, "GET", f"/api/policies/%2F/{uid}")[0] == 404
    # the same policy with one well-typed key is taken
    good = {**policy, "definition": {"federation-upstream-set": "all"}}
    assert api(leveret, "PUT", f"/api/policies/%2F/{uid}", good)[0] == 201
    assert api(leveret, "DELETE", f"/api/policies/%2F/{uid}")[0] == 204


def test_an_internal_exchange_is_not_federated(start_broker, uid):
    # RabbitMQ's rabbit_federation_exchange:federate/1 answers false for an internal exchange ("other internal
    # exchanges should probably not be federated"): measured on 3.10.8 with a policy naming an upstream, an
    # internal downstream exchange gets no link (GET /api/federation-links is []) and receives nothing.
    up = leveret_node(start_broker, f"up-{uid}@localhost")
    down = leveret_node(start_broker, f"down-{uid}@localhost")
    ex, internal_ex, q = f"fed.{uid}", f"fed.{uid}.internal", f"{uid}-q"
    up_p, down_p = up.pika_params(heartbeat=0), down.pika_params(heartbeat=0)
    declare(up_p, ex, "fanout")
    declare(up_p, internal_ex, "fanout")
    declare(down_p, ex, "fanout", bindings={q: [""]})
    with pika.BlockingConnection(down_p) as conn:
        ch = conn.channel()
        ch.exchange_declare(internal_ex, "fanout", durable=True, internal=True)
        ch.queue_bind(q, internal_ex, "")
    federate(down, "up", up.url, "^fed\\.", **{"reconnect-delay": 1})
    link_of(down, ex)  # the policy federates the exchange beside it, in the same pass
    assert [li["exchange"] for li in api(down, "GET", "/api/federation-links")[1]] == [ex]
    assert not [qu["name"] for qu in api(up, "GET", "/api/queues/%2F")[1] if internal_ex in qu["name"]]
    publish(up_p, internal_ex, ["k"])
    publish(up_p, ex, ["k"], start=1)
    assert [b for _p, b in received(down_p, q, at_least=1)] == [b"m1"]  # only what crossed by the other link
