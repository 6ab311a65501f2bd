"""HTTP API statistics an operator's tools read (issue 16, "HTTP API statistics"), each checked against a real
Leveret process and pika traffic of known size: connection byte counters and their rates, the client's
connection name (``user_provided_name``), a queue's ``memory``, ``idle_since`` and ``consumer_details``, the
``effective_policy_definition`` of a policy merged with an operator policy, ``/api/consumers`` without a
null ``consumer_timeout`` (rabbitmqadmin's table output cannot print one), and ``/api/vhost-limits``."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import time

import pika
import pytest

from tests.integration.management.test_management_api import Http, _find_rabbitmqadmin, q, wait_for

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(90)]

# RabbitMQ's idle_since: ISO 8601 in UTC with milliseconds, e.g. 2024-01-01T12:00:00.000+00:00.
IDLE_SINCE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


@pytest.fixture
def api(broker) -> Http:
    return Http(broker.management_port)




def named_connection(api: Http, name: str) -> dict:
    found = wait_for(lambda: [c for c in api("GET", "/api/connections")[1] if c.get("user_provided_name") == name])
    assert len(found) == 1, found
    return found[0]


def rabbitmqadmin(api: Http, *args: str) -> subprocess.CompletedProcess:
    tool = _find_rabbitmqadmin()
    if tool is None:
        pytest.skip("rabbitmqadmin is not installed (apt-get install rabbitmq-server ships it)")
    port = api.base.rsplit(":", 1)[1]
    return subprocess.run([sys.executable, tool, "-H", "127.0.0.1", "-P", port, "-u", "guest", "-p", "guest",
                           *args], capture_output=True, text=True, timeout=30, check=False)


# -- connections ----------------------------------------------------------------------------------------------

def test_connection_byte_counters_follow_the_traffic(broker, api, uid):
    conn = pika.BlockingConnection(broker.pika_params(client_properties={"connection_name": uid}))
    try:
        ch = conn.channel()
        ch.queue_declare(uid, auto_delete=True)
        ch.confirm_delivery()
        before = named_connection(api, uid)
        for name in ("recv_oct", "send_oct", "recv_cnt", "send_cnt"):
            assert isinstance(before[name], int), name
        assert before["recv_oct"] > 0 and before["send_oct"] > 0  # the handshake at least
        body = b"x" * 4000
        for _ in range(50):
            ch.basic_publish("", uid, body)
        after = named_connection(api, uid)
        received = after["recv_oct"] - before["recv_oct"]
        # 200,000 bytes of bodies, plus per message a method frame, a header frame and framing (< 200 bytes).
        assert 50 * 4000 <= received <= 50 * 4200, received
        assert after["recv_cnt"] > before["recv_cnt"]
        for _ in range(50):
            _method, _props, got = ch.basic_get(uid, auto_ack=True)
            assert got == body
        later = named_connection(api, uid)
        sent = later["send_oct"] - after["send_oct"]
        assert 50 * 4000 <= sent <= 50 * 4300, sent
        assert later["send_cnt"] > after["send_cnt"]

        # Rates come from the API's sampler (every 5 s): traffic across two samples gives both a rate.
        def rates() -> dict | None:
            ch.basic_publish("", uid, body)
            ch.basic_get(uid, auto_ack=True)
            c = named_connection(api, uid)
            return c if c["recv_oct_details"]["rate"] > 0 and c["send_oct_details"]["rate"] > 0 else None

        c = wait_for(rates, timeout=25)
        assert c, named_connection(api, uid)
        assert c["recv_oct_details"]["rate"] > 0 and c["send_oct_details"]["rate"] > 0
        assert isinstance(c["send_pend"], int)
    finally:
        conn.close()


def test_user_provided_name_is_the_clients_connection_name(broker, api, uid):
    named = pika.BlockingConnection(broker.pika_params(client_properties={"connection_name": f"{uid}-orders"}))
    plain = pika.BlockingConnection(broker.pika_params())
    try:
        named.channel()
        c = named_connection(api, f"{uid}-orders")
        assert c["client_properties"]["connection_name"] == f"{uid}-orders"
        one = api("GET", f"/api/connections/{q(c['name'])}")[1]
        assert one["user_provided_name"] == f"{uid}-orders"
        listed = api("GET", "/api/connections?columns=name,user_provided_name")[1]
        assert {"name": c["name"], "user_provided_name": f"{uid}-orders"} in listed
        # A connection the client did not name has no user_provided_name (as in RabbitMQ).
        others = [x for x in api("GET", "/api/connections")[1] if x["name"] != c["name"]
                  and "connection_name" not in x["client_properties"]]
        assert others and all("user_provided_name" not in x for x in others)
        # The connection's channels point back at it by its name.
        chans = api("GET", f"/api/connections/{q(c['name'])}/channels")[1]
        assert chans[0]["connection_details"]["name"] == c["name"]
    finally:
        named.close()
        plain.close()


# -- queues ---------------------------------------------------------------------------------------------------

def test_queue_memory_grows_with_its_messages(broker, api, uid):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(uid, auto_delete=False)
        empty = api("GET", f"/api/queues/%2F/{q(uid)}")[1]["memory"]
        assert isinstance(empty, int) and empty > 0
        for _ in range(20):
            ch.basic_publish("", uid, b"m" * 10_000)
        full = wait_for(lambda: (x := api("GET", f"/api/queues/%2F/{q(uid)}")[1])["messages"] == 20 and x)
        assert full["memory"] >= empty + 20 * 10_000
        assert any(x["name"] == uid and x["memory"] == full["memory"] for x in api("GET", "/api/queues/%2F")[1])
        # Unacknowledged messages are still held: the estimate stays while they are out.
        tag = 0
        for _ in range(20):
            method, _props, _body = ch.basic_get(uid, auto_ack=False)
            tag = method.delivery_tag
        held = api("GET", f"/api/queues/%2F/{q(uid)}")[1]
        assert held["messages_unacknowledged"] == 20 and held["memory"] >= empty + 20 * 10_000
        ch.basic_ack(tag, multiple=True)
        gone = wait_for(lambda: (x := api("GET", f"/api/queues/%2F/{q(uid)}")[1])["messages"] == 0 and x)
        assert gone["memory"] < empty + 10_000
    finally:
        conn.close()
        api("DELETE", f"/api/queues/%2F/{q(uid)}")


def _idle_since(api: Http, name: str) -> str | None:
    return api("GET", f"/api/queues/%2F/{q(name)}")[1].get("idle_since")


def test_queue_idle_since_is_present_only_while_idle(broker, api, uid):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(uid, auto_delete=False)
        started = time.time()
        ch.basic_publish("", uid, b"hello")
        wait_for(lambda: api("GET", f"/api/queues/%2F/{q(uid)}")[1]["messages"] == 1)
        # Unchanged since the API last looked at it: idle, since no earlier than the publish.
        since = wait_for(lambda: _idle_since(api, uid))
        assert since is not None and IDLE_SINCE.match(since), since
        at = datetime.datetime.fromisoformat(since).timestamp()
        assert started - 1 <= at <= time.time() + 1, (started, since)
        assert _idle_since(api, uid) == since  # still idle, still since then
        listed = [x for x in api("GET", "/api/queues/%2F")[1] if x["name"] == uid]
        assert listed[0]["idle_since"] == since
        # Work makes it busy: no idle_since at the next look (or, if the sampler looked in between, a later one).
        time.sleep(0.01)
        again = time.time()
        ch.basic_get(uid, auto_ack=True)
        now = _idle_since(api, uid)
        assert now is None or datetime.datetime.fromisoformat(now).timestamp() >= again - 1, now
        later = wait_for(lambda: _idle_since(api, uid))
        assert later is not None and later > since
    finally:
        conn.close()
        api("DELETE", f"/api/queues/%2F/{q(uid)}")


def test_queue_consumer_details(broker, api, uid):
    conn = pika.BlockingConnection(broker.pika_params(client_properties={"connection_name": uid}))
    try:
        ch1, ch2 = conn.channel(), conn.channel()
        ch1.queue_declare(uid, auto_delete=True)
        ch1.basic_qos(prefetch_count=5)
        ch1.basic_consume(uid, lambda *a: None, consumer_tag=f"{uid}-a", arguments={"x-priority": 3})
        ch2.basic_consume(uid, lambda *a: None, consumer_tag=f"{uid}-b", auto_ack=True)
        sac = f"{uid}-sac"
        ch1.queue_declare(sac, auto_delete=True, arguments={"x-single-active-consumer": True})
        ch1.basic_consume(sac, lambda *a: None, consumer_tag=f"{uid}-first")
        ch2.basic_consume(sac, lambda *a: None, consumer_tag=f"{uid}-second")
        c = named_connection(api, uid)

        info = wait_for(lambda: (x := api("GET", f"/api/queues/%2F/{q(uid)}")[1])["consumers"] == 2 and x)
        details = {d["consumer_tag"]: d for d in info["consumer_details"]}
        assert set(details) == {f"{uid}-a", f"{uid}-b"}
        a, b = details[f"{uid}-a"], details[f"{uid}-b"]
        assert a["ack_required"] is True and b["ack_required"] is False
        assert a["prefetch_count"] == 5 and b["prefetch_count"] == 0
        assert a["exclusive"] is False and a["arguments"] == {"x-priority": 3} and b["arguments"] == {}
        assert a["active"] is True and a["activity_status"] == "up"
        assert a["queue"] == {"name": uid, "vhost": "/"}
        assert a["channel_details"]["connection_name"] == c["name"]
        assert a["channel_details"]["number"] != b["channel_details"]["number"]
        assert a["channel_details"]["name"] == f"{c['name']} ({a['channel_details']['number']})"
        for field in ("node", "peer_host", "peer_port", "user"):
            assert field in a["channel_details"]
        # The same consumers as /api/consumers shows them.
        listed = {x["consumer_tag"]: x for x in api("GET", "/api/consumers/%2F")[1]}
        assert listed[f"{uid}-a"] == a and listed[f"{uid}-b"] == b

        # A single-active-consumer queue: the first consumer is active, the other waits.
        sac_info = api("GET", f"/api/queues/%2F/{q(sac)}")[1]
        status = {d["consumer_tag"]: (d["active"], d["activity_status"]) for d in sac_info["consumer_details"]}
        assert status == {f"{uid}-first": (True, "single_active"), f"{uid}-second": (False, "waiting")}
        # Lists of queues do not carry consumer_details (RabbitMQ's neither).
        assert all("consumer_details" not in x for x in api("GET", "/api/queues/%2F")[1])
        ch1.basic_cancel(f"{uid}-a")
        left = wait_for(lambda: [d["consumer_tag"] for d in
                                 api("GET", f"/api/queues/%2F/{q(uid)}")[1]["consumer_details"]] == [f"{uid}-b"])
        assert left
    finally:
        conn.close()


# -- policies -------------------------------------------------------------------------------------------------

def test_effective_policy_definition_merges_the_operator_policy(broker, api, uid):
    conn = pika.BlockingConnection(broker.pika_params())
    name = f"{uid}-q"
    try:
        ch = conn.channel()
        ch.queue_declare(name, auto_delete=False)  # declared before the policies: they apply to it at once
        assert api("GET", f"/api/queues/%2F/{q(name)}")[1]["effective_policy_definition"] == {}
        pattern = f"^{re.escape(uid)}"
        assert api("PUT", f"/api/policies/%2F/{q(uid)}-p",
                   {"pattern": pattern, "apply-to": "queues",
                    "definition": {"max-length": 10, "message-ttl": 60000}})[0] in (201, 204)
        assert api("PUT", f"/api/operator-policies/%2F/{q(uid)}-op",
                   {"pattern": pattern, "apply-to": "queues",
                    "definition": {"max-length": 3, "message-ttl": 120000, "expires": 600000}})[0] in (201, 204)
        info = wait_for(lambda: (x := api("GET", f"/api/queues/%2F/{q(name)}")[1])["operator_policy"] and x)
        assert info["policy"] == f"{uid}-p" and info["operator_policy"] == f"{uid}-op"
        # Where both set a number the lower wins (max-length 3, message-ttl 60000); the rest is merged in.
        assert info["effective_policy_definition"] == {"max-length": 3, "message-ttl": 60000, "expires": 600000}
        for i in range(5):  # and it is what the queue enforces
            ch.basic_publish("", name, str(i).encode())
        assert wait_for(lambda: api("GET", f"/api/queues/%2F/{q(name)}")[1]["messages"] == 3)
        assert api("DELETE", f"/api/operator-policies/%2F/{q(uid)}-op")[0] == 204
        assert wait_for(lambda: api("GET", f"/api/queues/%2F/{q(name)}")[1]["effective_policy_definition"]
                        == {"max-length": 10, "message-ttl": 60000})
        assert api("DELETE", f"/api/policies/%2F/{q(uid)}-p")[0] == 204
        assert wait_for(lambda: api("GET", f"/api/queues/%2F/{q(name)}")[1]["effective_policy_definition"] == {})
    finally:
        api("DELETE", f"/api/operator-policies/%2F/{q(uid)}-op")
        api("DELETE", f"/api/policies/%2F/{q(uid)}-p")
        conn.close()
        api("DELETE", f"/api/queues/%2F/{q(name)}")


# -- consumers ------------------------------------------------------------------------------------------------

def test_consumers_have_no_null_consumer_timeout_and_rabbitmqadmin_lists_them(broker, api, uid):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(f"{uid}-plain", auto_delete=True)
        ch.queue_declare(f"{uid}-timed", auto_delete=True, arguments={"x-consumer-timeout": 60000})
        ch.basic_consume(f"{uid}-plain", lambda *a: None, consumer_tag=f"{uid}-plain-tag")
        ch.basic_consume(f"{uid}-timed", lambda *a: None, consumer_tag=f"{uid}-timed-tag")

        def consumers() -> dict | None:
            found = {x["consumer_tag"]: x for x in api("GET", "/api/consumers")[1]
                     if x["consumer_tag"].startswith(uid)}
            return found if len(found) == 2 else None

        mine = wait_for(consumers)
        assert mine
        for c in api("GET", "/api/consumers")[1]:
            assert None not in c.values(), c  # no null at the top level, which rabbitmqadmin cannot print
        # No timeout applies (the test broker sets no consumer_timeout): no key; the queue's: its value.
        assert "consumer_timeout" not in mine[f"{uid}-plain-tag"]
        assert mine[f"{uid}-timed-tag"]["consumer_timeout"] == 60000

        out = rabbitmqadmin(api, "list", "consumers")  # the default table format, which crashed on null
        assert out.returncode == 0, out.stderr + out.stdout
        assert f"{uid}-plain-tag" in out.stdout and f"{uid}-timed-tag" in out.stdout
        out = rabbitmqadmin(api, "-f", "raw_json", "list", "consumers")
        assert out.returncode == 0, out.stderr
        assert {x["consumer_tag"] for x in json.loads(out.stdout)} >= {f"{uid}-plain-tag", f"{uid}-timed-tag"}
    finally:
        conn.close()


# -- vhost limits ---------------------------------------------------------------------------------------------

def test_vhost_limits_endpoints(broker, api, uid):
    vh = f"{uid}-vh"
    assert api("PUT", f"/api/vhosts/{q(vh)}")[0] in (201, 204)
    try:
        status, listed, _ = api("GET", "/api/vhost-limits")
        assert status == 200 and isinstance(listed, list) and all(x["vhost"] != vh for x in listed)
        assert api("GET", f"/api/vhost-limits/{q(vh)}")[1] == []
        assert api("PUT", f"/api/vhost-limits/{q(vh)}/max-connections", {"value": 5})[0] == 204
        assert api("PUT", f"/api/vhost-limits/{q(vh)}/max-queues", {"value": 7})[0] == 204
        expected = {"vhost": vh, "value": {"max-connections": 5, "max-queues": 7}}
        assert api("GET", f"/api/vhost-limits/{q(vh)}")[1] == [expected]
        assert expected in api("GET", "/api/vhost-limits")[1]
        out = rabbitmqadmin(api, "-f", "raw_json", "list", "vhost_limits")
        assert out.returncode == 0, out.stderr
        assert expected in json.loads(out.stdout)
        assert api("DELETE", f"/api/vhost-limits/{q(vh)}/max-queues")[0] == 204
        assert api("GET", f"/api/vhost-limits/{q(vh)}")[1] == [{"vhost": vh, "value": {"max-connections": 5}}]
        assert api("GET", "/api/vhost-limits/no-such-vhost")[0] == 404
    finally:
        api("DELETE", f"/api/vhosts/{q(vh)}")
