"""The HTTP API against a real Leveret process: every endpoint group, with RabbitMQ's paths, JSON field
names, status codes and error bodies, and AMQP clients (pika) on the other side where the API acts on
broker objects. ``rabbitmqadmin`` (RabbitMQ's own client of this API) runs against it too."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.conftest import BrokerProcess, free_port

pytestmark = pytest.mark.leveret_only


class Http:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def __call__(self, method: str, path: str, body=None, auth=("guest", "guest"), headers=None,
                 raw: bytes | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json", **(headers or {})}
        if auth is not None:
            h["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, text, hdrs = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as exc:
            status, text, hdrs = exc.code, exc.read(), exc.headers
        payload = json.loads(text) if text.strip() and "json" in (hdrs.get("Content-Type") or "") else text
        return status, payload, hdrs


def start_mgmt_broker(tmp: Path, *extra: str) -> tuple[BrokerProcess, int, int]:
    mport, pport = free_port(), free_port()
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log",
                      extra_args=["--management-port", str(mport), "--prometheus-port", str(pport), *extra])
    b.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the HTTP listeners start just after the AMQP one
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{pport}/metrics", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    return b, mport, pport


@contextlib.contextmanager
def mgmt_node(prefix: str, *extra: str) -> Iterator[tuple[BrokerProcess, Http]]:
    """A Leveret process of its own with the HTTP API on, in a temporary directory named ``prefix...``:
    yields (broker, Http client of its API); stopped and its directory removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    b, mport, _pport = start_mgmt_broker(tmp, *extra)
    try:
        yield b, Http(mport)
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def mgmt():
    with mgmt_node("leveret-mgmt-") as node:
        yield node


@pytest.fixture
def api(mgmt):
    return mgmt[1]


@pytest.fixture
def amqp(mgmt):
    conn = pika.BlockingConnection(mgmt[0].pika_params())
    yield conn
    if conn.is_open:
        conn.close()


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def wait_for(predicate, timeout: float = 10.0):
    """``predicate()``'s first truthy result within ``timeout`` seconds (polled), else its last result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    return predicate()


# -- authentication ---------------------------------------------------------------------------------------------

def test_requests_without_or_with_bad_credentials_are_401(api):
    status, body, headers = api("GET", "/api/overview", auth=None)
    assert status == 401 and body["error"] == "not_authorised"
    assert "Basic" in headers["WWW-Authenticate"]
    assert api("GET", "/api/overview", auth=("guest", "wrong"))[0] == 401
    assert api("GET", "/api/overview", auth=("nobody", "x"))[0] == 401


def test_user_without_a_management_tag_is_refused(api, uid):
    assert api("PUT", f"/api/users/{uid}", {"password": "pw", "tags": ""})[0] == 201
    status, body, _ = api("GET", "/api/overview", auth=(uid, "pw"))
    assert status == 401 and body["reason"] == "Not management user"


def test_management_user_cannot_manage_users(api, uid):
    api("PUT", f"/api/users/{uid}", {"password": "pw", "tags": "management"})
    assert api("GET", "/api/overview", auth=(uid, "pw"))[0] == 200
    status, body, _ = api("GET", "/api/users", auth=(uid, "pw"))
    assert status == 401 and body["reason"] == "Not administrator user"


# -- overview, nodes, whoami --------------------------------------------------------------------------------------

def test_overview_fields(api, mgmt):
    status, o, _ = api("GET", "/api/overview")
    assert status == 200
    for key in ("rabbitmq_version", "product_version", "product_name", "node", "object_totals", "message_stats",
                "queue_totals", "listeners", "exchange_types", "cluster_name", "management_version"):
        assert key in o, key
    assert o["product_name"] == "Leveret"
    assert set(o["object_totals"]) >= {"connections", "channels", "consumers", "exchanges", "queues"}
    assert set(o["queue_totals"]) >= {"messages", "messages_ready", "messages_unacknowledged"}
    assert {"publish", "deliver_get", "ack"} <= set(o["message_stats"])
    assert any(lst["protocol"] == "amqp" and lst["port"] == mgmt[0].port for lst in o["listeners"])


def test_overview_counts_connections_channels_and_consumers(api, mgmt):
    """object_totals counts what is open: two more connections, three more channels, one more consumer."""
    def totals() -> tuple[int, int, int]:
        o = api("GET", "/api/overview")[1]["object_totals"]
        return o["connections"], o["channels"], o["consumers"]

    before = totals()
    first = pika.BlockingConnection(mgmt[0].pika_params())
    second = pika.BlockingConnection(mgmt[0].pika_params())
    try:
        ch = first.channel()
        first.channel()
        second.channel()
        ch.queue_declare("overview-counted", exclusive=True)
        ch.basic_consume("overview-counted", lambda *_a: None)
        deadline = time.monotonic() + 5
        while totals() != (before[0] + 2, before[1] + 3, before[2] + 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert totals() == (before[0] + 2, before[1] + 3, before[2] + 1)
    finally:
        first.close()
        second.close()


def test_nodes_and_whoami(api):
    status, nodes, _ = api("GET", "/api/nodes")
    assert status == 200 and len(nodes) == 1
    node = nodes[0]
    for key in ("name", "running", "mem_used", "mem_limit", "mem_alarm", "disk_free", "disk_free_limit",
                "disk_free_alarm", "fd_used", "uptime"):
        assert key in node, key
    assert node["running"] is True
    assert api("GET", f"/api/nodes/{q(node['name'])}")[1]["name"] == node["name"]
    assert api("GET", "/api/nodes/nope@nowhere")[0] == 404
    assert api("GET", "/api/whoami")[1] == {"name": "guest", "tags": ["administrator"], "is_internal_user": True}


def test_unknown_path_is_a_json_404(api):
    status, body, _ = api("GET", "/api/no-such-thing")
    assert status == 404 and body == {"error": "Object Not Found", "reason": "Not Found"}


# -- queues -------------------------------------------------------------------------------------------------------

def test_queue_declare_get_list_delete(api, uid):
    path = f"/api/queues/%2F/{q(uid)}"
    assert api("PUT", path, {"durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}})[0] == 201
    assert api("PUT", path, {"durable": True, "arguments": {"x-max-length": 10}})[0] == 204
    status, info, _ = api("GET", path)
    assert status == 200
    assert info["name"] == uid and info["vhost"] == "/" and info["durable"] is True
    assert info["arguments"] == {"x-max-length": 10}
    for key in ("messages", "messages_ready", "messages_unacknowledged", "consumers", "state", "node", "type",
                "exclusive", "auto_delete", "message_stats"):
        assert key in info, key
    assert uid in [x["name"] for x in api("GET", "/api/queues")[1]]
    assert uid in [x["name"] for x in api("GET", "/api/queues/%2F")[1]]
    # Redeclaring with other properties is refused with RabbitMQ's reason.
    status, body, _ = api("PUT", path, {"durable": False, "arguments": {"x-max-length": 10}})
    assert status == 400 and "inequivalent arg 'durable'" in body["reason"]
    assert api("DELETE", path)[0] == 204
    assert api("GET", path)[0] == 404
    assert api("DELETE", path)[0] == 404


def test_queue_list_columns_and_name_filter(api, uid):
    api("PUT", f"/api/queues/%2F/{q(uid)}", {})
    status, rows, _ = api("GET", f"/api/queues?columns=name,messages&name={q(uid)}")
    assert status == 200 and rows == [{"name": uid, "messages": 0}]


def test_queue_visible_to_amqp_and_counts(api, amqp, uid):
    api("PUT", f"/api/queues/%2F/{q(uid)}", {"durable": False})
    ch = amqp.channel()
    ch.queue_declare(uid, passive=True)
    for i in range(3):
        ch.basic_publish("", uid, f"m{i}".encode())
    ch.basic_get(uid, auto_ack=False)
    time.sleep(0.1)
    info = api("GET", f"/api/queues/%2F/{q(uid)}")[1]
    assert (info["messages_ready"], info["messages_unacknowledged"], info["messages"]) == (2, 1, 3)
    assert info["message_stats"]["publish"] == 3


def test_queue_purge_and_get_messages(api, amqp, uid):
    path = f"/api/queues/%2F/{q(uid)}"
    api("PUT", path, {"durable": False})
    ch = amqp.channel()
    ch.basic_publish("", uid, b"one", pika.BasicProperties(content_type="text/plain", headers={"h": "v"},
                                                             delivery_mode=2, message_id="id-1"))
    ch.basic_publish("", uid, b"\xff\x00bin")
    time.sleep(0.05)
    status, msgs, _ = api("POST", path + "/get", {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200 and len(msgs) == 2
    first = msgs[0]
    assert first["payload"] == "one" and first["payload_encoding"] == "string"
    assert first["routing_key"] == uid and first["exchange"] == "" and first["redelivered"] is False
    assert first["properties"]["content_type"] == "text/plain"
    assert first["properties"]["headers"] == {"h": "v"}
    assert first["properties"]["delivery_mode"] == 2 and first["properties"]["message_id"] == "id-1"
    assert msgs[1]["payload_encoding"] == "base64"
    assert base64.b64decode(msgs[1]["payload"]) == b"\xff\x00bin"
    # Requeued: still there, now redelivered.
    again = api("POST", path + "/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"})[1]
    assert again[0]["redelivered"] is True and base64.b64decode(again[0]["payload"]) == b"one"
    assert api("GET", path)[1]["messages"] == 1
    assert api("POST", path + "/get", {"count": 1, "ackmode": "bogus"})[0] == 400
    assert api("DELETE", path + "/contents")[0] == 204
    assert api("GET", path)[1]["messages"] == 0
    assert ch.queue_declare(uid, passive=True).method.message_count == 0


def test_delete_queue_if_empty(api, uid):
    path = f"/api/queues/%2F/{q(uid)}"
    api("PUT", path, {"durable": False})
    api("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": uid, "payload": "x",
                                                          "payload_encoding": "string", "properties": {}})
    status, body, _ = api("DELETE", path + "?if-empty=true")
    assert status == 400 and "not empty" in body["reason"]
    assert api("DELETE", path)[0] == 204


def test_queue_with_reserved_name_is_refused(api):
    status, body, _ = api("PUT", "/api/queues/%2F/amq.mine", {})
    assert status == 401 and "reserved prefix" in body["reason"]


# -- exchanges and publishing -----------------------------------------------------------------------------------

def test_exchange_declare_get_delete(api, uid):
    path = f"/api/exchanges/%2F/{q(uid)}"
    assert api("PUT", path, {"type": "topic", "durable": True, "auto_delete": False, "internal": False,
                             "arguments": {}})[0] == 201
    assert api("PUT", path, {"type": "topic", "durable": True})[0] == 204
    info = api("GET", path)[1]
    assert {k: info[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")} == \
        {"name": uid, "vhost": "/", "type": "topic", "durable": True, "auto_delete": False, "internal": False,
         "arguments": {}}
    status, body, _ = api("PUT", path, {"type": "direct"})
    assert status == 400 and "inequivalent arg 'type'" in body["reason"]
    assert api("PUT", f"/api/exchanges/%2F/{q(uid)}-bad", {"type": "nonsense"})[0] == 400
    assert api("PUT", f"/api/exchanges/%2F/{q(uid)}-none", {})[0] == 400
    assert uid in [x["name"] for x in api("GET", "/api/exchanges/%2F")[1]]
    assert api("DELETE", path)[0] == 204
    assert api("GET", path)[0] == 404


def test_default_exchange_is_listed_and_addressable(api):
    names = [x["name"] for x in api("GET", "/api/exchanges/%2F")[1]]
    assert "" in names and "amq.topic" in names
    info = api("GET", "/api/exchanges/%2F/amq.default")[1]
    assert info["name"] == "" and info["type"] == "direct"
    assert api("DELETE", "/api/exchanges/%2F/amq.direct")[0] == 401


def test_publish_routes_through_bindings(api, amqp, uid):
    ex, qn = f"{uid}-x", f"{uid}-q"
    api("PUT", f"/api/exchanges/%2F/{q(ex)}", {"type": "direct"})
    api("PUT", f"/api/queues/%2F/{q(qn)}", {"durable": False})
    api("POST", f"/api/bindings/%2F/e/{q(ex)}/q/{q(qn)}", {"routing_key": "k"})
    body = {"routing_key": "k", "payload": base64.b64encode(b"\x01\x02").decode(), "payload_encoding": "base64",
            "properties": {"delivery_mode": 2, "headers": {"n": 1}, "correlation_id": "c1", "type": "t"}}
    assert api("POST", f"/api/exchanges/%2F/{q(ex)}/publish", body)[1] == {"routed": True}
    assert api("POST", f"/api/exchanges/%2F/{q(ex)}/publish", {**body, "routing_key": "other"})[1] == \
        {"routed": False}
    method, props, payload = amqp.channel().basic_get(qn, auto_ack=True)
    assert payload == b"\x01\x02" and props.headers == {"n": 1} and props.correlation_id == "c1"
    assert props.type == "t" and props.delivery_mode == 2 and method.exchange == ex
    assert api("POST", "/api/exchanges/%2F/nope/publish", body)[0] == 404
    assert api("POST", f"/api/exchanges/%2F/{q(ex)}/publish", {**body, "payload_encoding": "rot13"})[0] == 400


def test_exchange_bindings_source_and_destination(api, uid):
    src, dst, qn = f"{uid}-s", f"{uid}-d", f"{uid}-q"
    for name in (src, dst):
        api("PUT", f"/api/exchanges/%2F/{q(name)}", {"type": "fanout"})
    api("PUT", f"/api/queues/%2F/{q(qn)}", {})
    assert api("POST", f"/api/bindings/%2F/e/{q(src)}/e/{q(dst)}", {"routing_key": ""})[0] == 201
    api("POST", f"/api/bindings/%2F/e/{q(src)}/q/{q(qn)}", {"routing_key": "r"})
    source = api("GET", f"/api/exchanges/%2F/{q(src)}/bindings/source")[1]
    assert sorted((b["destination"], b["destination_type"]) for b in source) == [(dst, "exchange"), (qn, "queue")]
    dest = api("GET", f"/api/exchanges/%2F/{q(dst)}/bindings/destination")[1]
    assert [(b["source"], b["destination"]) for b in dest] == [(src, dst)]
    qb = api("GET", f"/api/queues/%2F/{q(qn)}/bindings")[1]
    assert [(b["source"], b["routing_key"]) for b in qb] == [("", qn), (src, "r")]


# -- bindings -------------------------------------------------------------------------------------------------------

def test_binding_create_get_delete(api, amqp, uid):
    ex, qn = f"{uid}-x", f"{uid}-q"
    api("PUT", f"/api/exchanges/%2F/{q(ex)}", {"type": "headers"})
    api("PUT", f"/api/queues/%2F/{q(qn)}", {})
    between = f"/api/bindings/%2F/e/{q(ex)}/q/{q(qn)}"
    status, _, headers = api("POST", between, {"routing_key": "rk", "arguments": {"x-match": "any", "a": "1"}})
    assert status == 201
    props = headers["Location"]
    rows = api("GET", between)[1]
    assert len(rows) == 1 and rows[0]["properties_key"] == props
    assert rows[0]["arguments"] == {"x-match": "any", "a": "1"} and rows[0]["routing_key"] == "rk"
    assert api("GET", f"{between}/{q(props)}")[1]["destination"] == qn
    assert any(b["source"] == ex for b in api("GET", "/api/bindings/%2F")[1])
    ch = amqp.channel()
    ch.basic_publish(ex, "", b"x", pika.BasicProperties(headers={"a": "1"}))
    time.sleep(0.05)
    assert ch.queue_declare(qn, passive=True).method.message_count == 1
    assert api("DELETE", f"{between}/{q(props)}")[0] == 204
    assert api("GET", between)[1] == []
    assert api("DELETE", f"{between}/{q(props)}")[0] == 404
    assert api("POST", f"/api/bindings/%2F/e/{q(ex)}/q/no-such-queue", {})[0] == 404


def test_binding_to_default_exchange_is_refused(api, uid):
    api("PUT", f"/api/queues/%2F/{q(uid)}", {})
    assert api("POST", f"/api/bindings/%2F/e/amq.default/q/{q(uid)}", {"routing_key": "x"})[0] == 401


# -- connections, channels, consumers ---------------------------------------------------------------------------

def _wait_for(predicate, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    return predicate()


def test_connections_channels_consumers_and_close(api, mgmt, uid):
    params = mgmt[0].pika_params(client_properties={"connection_name": uid})
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare(uid, auto_delete=True)
        ch.basic_qos(prefetch_count=7)
        ch.basic_consume(uid, lambda *a: None, consumer_tag=f"{uid}-tag")
        mine = _wait_for(lambda: [c for c in api("GET", "/api/connections")[1]
                                  if c["client_properties"].get("connection_name") == uid])
        assert len(mine) == 1
        c = mine[0]
        assert c["user"] == "guest" and c["vhost"] == "/" and c["state"] == "running" and c["channels"] == 1
        assert c["protocol"] == "AMQP 0-9-1" and c["peer_host"] == "127.0.0.1"
        assert api("GET", f"/api/connections/{q(c['name'])}")[1]["name"] == c["name"]
        assert len(api("GET", "/api/vhosts/%2F/connections")[1]) >= 1
        chans = api("GET", f"/api/connections/{q(c['name'])}/channels")[1]
        assert len(chans) == 1 and chans[0]["consumer_count"] == 1 and chans[0]["prefetch_count"] == 7
        assert chans[0]["connection_details"]["name"] == c["name"]
        assert any(x["name"] == chans[0]["name"] for x in api("GET", "/api/channels")[1])
        assert api("GET", f"/api/channels/{q(chans[0]['name'])}")[1]["number"] == chans[0]["number"]
        consumers = [x for x in api("GET", "/api/consumers/%2F")[1] if x["consumer_tag"] == f"{uid}-tag"]
        assert len(consumers) == 1
        assert consumers[0]["queue"] == {"name": uid, "vhost": "/"} and consumers[0]["ack_required"] is True
        assert consumers[0]["prefetch_count"] == 7
        # Closing through the API: the client sees 320 CONNECTION_FORCED with the given reason.
        status, _, _ = api("DELETE", f"/api/connections/{q(c['name'])}", headers={"X-Reason": "bye now"})
        assert status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            conn.process_data_events(time_limit=2)
            conn.process_data_events(time_limit=2)
        assert info.value.reply_code == 320 and "bye now" in info.value.reply_text
        assert _wait_for(lambda: api("GET", f"/api/connections/{q(c['name'])}")[0] == 404)
    finally:
        if conn.is_open:
            conn.close()
    assert api("DELETE", "/api/connections/no-such-connection")[0] == 404


# -- vhosts, users, permissions --------------------------------------------------------------------------------

def test_vhost_lifecycle(api, mgmt, uid):
    vh = f"/{uid}"
    assert api("PUT", f"/api/vhosts/{q(vh)}", {"description": "d", "tags": "a,b"})[0] == 201
    assert api("PUT", f"/api/vhosts/{q(vh)}", {"description": "d2"})[0] == 204
    info = api("GET", f"/api/vhosts/{q(vh)}")[1]
    assert info["name"] == vh and info["description"] == "d2" and info["tags"] == ["a", "b"]
    assert vh in [v["name"] for v in api("GET", "/api/vhosts")[1]]
    assert api("PUT", f"/api/permissions/{q(vh)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] \
        == 201
    params = mgmt[0].pika_params()
    params.virtual_host = vh
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare(f"{uid}-q")
    assert api("GET", f"/api/queues/{q(vh)}/{q(uid)}-q")[0] == 200
    assert api("DELETE", f"/api/vhosts/{q(vh)}")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.process_data_events(time_limit=2)
        conn.process_data_events(time_limit=2)
    assert closed.value.reply_code == 320
    assert api("GET", f"/api/vhosts/{q(vh)}")[0] == 404
    assert api("GET", f"/api/permissions/{q(vh)}/guest")[0] == 404


def test_connection_open_refused_without_permissions_in_vhost(api, mgmt, uid):
    vh = f"/{uid}"
    api("PUT", f"/api/vhosts/{q(vh)}", {})
    params = mgmt[0].pika_params()
    params.virtual_host = vh
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(params).close()
    text = str(info.value)
    assert "(530)" in text and f"NOT_ALLOWED - access to vhost '{vh}' refused for user 'guest'" in text


def test_user_lifecycle_with_password_and_hash(api, mgmt, uid):
    assert api("PUT", f"/api/users/{uid}", {"password": "s3cret", "tags": ["management"]})[0] == 201
    info = api("GET", f"/api/users/{uid}")[1]
    assert info["tags"] == ["management"] and info["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert len(base64.b64decode(info["password_hash"])) == 36
    assert api("GET", "/api/whoami", auth=(uid, "s3cret"))[1]["name"] == uid
    # A second user created from the first one's hash logs in with the same password.
    assert api("PUT", f"/api/users/{uid}-2", {"password_hash": info["password_hash"], "tags": "monitoring"})[0] \
        == 201
    assert api("GET", "/api/whoami", auth=(f"{uid}-2", "s3cret"))[1]["tags"] == ["monitoring"]
    assert api("PUT", f"/api/users/{uid}-3", {"tags": ""})[0] == 400
    assert api("PUT", f"/api/users/{uid}-3", {"password_hash": "not base64!"})[0] == 400
    assert uid in [u["name"] for u in api("GET", "/api/users")[1]]
    assert uid in [u["name"] for u in api("GET", "/api/users/without-permissions")[1]]
    # Tag change keeps the password.
    assert api("PUT", f"/api/users/{uid}", {"tags": "administrator"})[0] == 204
    assert api("GET", "/api/users", auth=(uid, "s3cret"))[0] == 200
    assert api("DELETE", f"/api/users/{uid}")[0] == 204
    assert api("GET", "/api/whoami", auth=(uid, "s3cret"))[0] == 401
    assert api("POST", "/api/users/bulk-delete", {"users": [f"{uid}-2"]})[0] == 204
    assert api("GET", f"/api/users/{uid}-2")[0] == 404


def test_permissions_endpoints(api, uid):
    api("PUT", f"/api/users/{uid}", {"password": "pw", "tags": ""})
    path = f"/api/permissions/%2F/{uid}"
    assert api("GET", path)[0] == 404
    assert api("PUT", path, {"configure": "^c", "write": "^w", "read": "^r"})[0] == 201
    assert api("GET", path)[1] == {"user": uid, "vhost": "/", "configure": "^c", "write": "^w", "read": "^r"}
    assert {"user": uid, "vhost": "/", "configure": "^c", "write": "^w", "read": "^r"} in \
        api("GET", "/api/permissions")[1]
    assert [p["vhost"] for p in api("GET", f"/api/users/{uid}/permissions")[1]] == ["/"]
    assert uid in [p["user"] for p in api("GET", "/api/vhosts/%2F/permissions")[1]]
    assert api("PUT", path, {"configure": "(", "write": "", "read": ""})[0] == 400
    assert api("PUT", "/api/permissions/no-such-vhost/" + uid, {"configure": "", "write": "", "read": ""})[0] \
        == 404
    assert api("DELETE", path)[0] == 204
    assert api("GET", path)[0] == 404
    tp = f"/api/topic-permissions/%2F/{uid}"
    assert api("PUT", tp, {"exchange": "amq.topic", "write": "^a", "read": ".*"})[0] == 201
    assert api("GET", tp)[1] == [{"user": uid, "vhost": "/", "exchange": "amq.topic", "write": "^a", "read": ".*"}]
    assert api("DELETE", tp)[0] == 204


# -- policies, parameters -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["policies", "operator-policies"])
def test_policies_stored_and_listed(api, kind, uid):
    path = f"/api/{kind}/%2F/{q(uid)}"
    body = {"pattern": "^orders\\.", "definition": {"max-length": 100}, "priority": 5, "apply-to": "queues"}
    assert api("PUT", path, body)[0] == 201
    assert api("PUT", path, body)[0] == 204
    got = api("GET", path)[1]
    assert got == {"vhost": "/", "name": uid, "pattern": "^orders\\.", "apply-to": "queues",
                   "definition": {"max-length": 100}, "priority": 5}
    assert got in api("GET", f"/api/{kind}")[1] and got in api("GET", f"/api/{kind}/%2F")[1]
    assert api("PUT", path, {**body, "pattern": "("})[0] == 400
    assert api("PUT", path, {**body, "definition": {}})[0] == 400
    assert api("PUT", path, {**body, "apply-to": "everything"})[0] == 400
    assert api("DELETE", path)[0] == 204
    assert api("GET", path)[0] == 404


def test_policymaker_may_set_policies_but_management_may_not(api, uid):
    for tag in ("policymaker", "management"):
        api("PUT", f"/api/users/{uid}-{tag}", {"password": "pw", "tags": tag})
        api("PUT", f"/api/permissions/%2F/{uid}-{tag}", {"configure": ".*", "write": ".*", "read": ".*"})
    body = {"pattern": "^x", "definition": {"message-ttl": 1000}}
    assert api("PUT", f"/api/policies/%2F/{uid}", body, auth=(f"{uid}-policymaker", "pw"))[0] == 201
    assert api("PUT", f"/api/policies/%2F/{uid}", body, auth=(f"{uid}-management", "pw"))[0] == 401
    api("DELETE", f"/api/policies/%2F/{uid}")


def test_parameters_and_global_parameters(api, uid):
    vh = f"{uid}-vh"
    api("PUT", f"/api/vhosts/{q(vh)}", {})
    path = f"/api/parameters/vhost-limits/{q(vh)}/limits"  # the one component Leveret acts on
    assert api("PUT", path, {"value": {"max-queues": 10}})[0] == 201
    assert api("GET", path)[1]["value"] == {"max-queues": 10}
    assert any(p["vhost"] == vh for p in api("GET", "/api/parameters/vhost-limits")[1])
    assert api("DELETE", path)[0] == 204
    api("DELETE", f"/api/vhosts/{q(vh)}")
    # A federation upstream's bad value is refused (tests/integration/federation/ has the rest).
    assert api("PUT", f"/api/parameters/federation-upstream/%2F/{q(uid)}", {"value": {"uri": 5}})[0] == 400
    gp = f"/api/global-parameters/{q(uid)}"
    assert api("PUT", gp, {"value": "v"})[0] == 201
    assert {"name": uid, "value": "v"} in api("GET", "/api/global-parameters")[1]
    assert api("DELETE", gp)[0] == 204


# -- definitions ----------------------------------------------------------------------------------------------------

def test_definitions_export_contains_objects_and_import_creates_them(api, uid):
    api("PUT", f"/api/queues/%2F/{q(uid)}", {"durable": True, "arguments": {"x-message-ttl": 5000}})
    api("PUT", f"/api/exchanges/%2F/{q(uid)}-x", {"type": "fanout"})
    api("POST", f"/api/bindings/%2F/e/{q(uid)}-x/q/{q(uid)}", {"routing_key": "k"})
    d = api("GET", "/api/definitions")[1]
    for key in ("rabbit_version", "rabbitmq_version", "product_name", "product_version", "users", "vhosts",
                "permissions", "topic_permissions", "parameters", "global_parameters", "policies", "queues",
                "exchanges", "bindings"):
        assert key in d, key
    assert {"name": uid, "vhost": "/", "durable": True, "auto_delete": False,
            "arguments": {"x-message-ttl": 5000}} in d["queues"]
    assert not any(x["name"].startswith("amq.") for x in d["exchanges"])
    assert {"source": f"{uid}-x", "vhost": "/", "destination": uid, "destination_type": "queue",
            "routing_key": "k", "arguments": {}} in d["bindings"]
    vd = api("GET", "/api/definitions/%2F")[1]
    assert "users" not in vd and {"name": uid, "durable": True, "auto_delete": False,
                                  "arguments": {"x-message-ttl": 5000}} in vd["queues"]
    new = {"vhosts": [{"name": f"{uid}-vh"}],
           "users": [{"name": f"{uid}-u", "password_hash": d["users"][0]["password_hash"],
                      "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "management"}],
           "permissions": [{"user": f"{uid}-u", "vhost": f"{uid}-vh", "configure": ".*", "write": ".*",
                            "read": ".*"}],
           "queues": [{"name": "imported", "vhost": f"{uid}-vh", "durable": True, "auto_delete": False,
                       "arguments": {}}]}
    assert api("POST", "/api/definitions", new)[0] == 204
    assert api("GET", f"/api/queues/{q(uid)}-vh/imported")[0] == 200
    assert api("GET", f"/api/permissions/{q(uid)}-vh/{q(uid)}-u")[0] == 200
    assert api("POST", "/api/definitions", raw=b"{nope")[0] == 400
    assert api("POST", "/api/definitions", {"queues": [{"name": "q", "vhost": "missing-vhost"}]})[0] == 400
    assert api("POST", "/api/definitions/%2F", {"queues": [{"name": f"{uid}-pv", "durable": False}]})[0] == 204
    assert api("GET", f"/api/queues/%2F/{q(uid)}-pv")[0] == 200


# -- health checks ----------------------------------------------------------------------------------------------

def test_health_checks(api, mgmt):
    assert api("GET", "/api/health/checks/alarms")[1] == {"status": "ok"}
    assert api("GET", "/api/health/checks/local-alarms")[0] == 200
    assert api("GET", "/api/health/checks/virtual-hosts")[1] == {"status": "ok"}
    assert api("GET", f"/api/health/checks/port-listener/{mgmt[0].port}")[1] == {"status": "ok"}
    status, body, _ = api("GET", "/api/health/checks/port-listener/1")
    assert status == 503 and body["status"] == "failed" and mgmt[0].port in body["ports"]
    assert api("GET", "/api/health/checks/protocol-listener/amqp")[0] == 200
    assert api("GET", "/api/health/checks/protocol-listener/stomp")[0] == 503
    assert api("GET", "/api/health/checks/is-in-service")[0] == 200
    assert api("GET", "/api/aliveness-test/%2F")[1] == {"status": "ok"}
    assert api("GET", "/api/aliveness-test/no-such-vhost")[0] == 404


# -- rabbitmqadmin: RabbitMQ's own command-line client of this API --------------------------------------------

def _find_rabbitmqadmin() -> str | None:
    found = shutil.which("rabbitmqadmin")
    if found:
        return found
    for path in sorted(Path("/usr/lib/rabbitmq/lib").glob("*/plugins/rabbitmq_management-*/priv/www/cli/"
                                                          "rabbitmqadmin")):
        return str(path)
    return None


def _rabbitmqadmin(mgmt) -> Callable[..., str]:
    """``run(*args)``: rabbitmqadmin against the module's Leveret as guest, its raw JSON output (the command
    must succeed)."""
    tool = _find_rabbitmqadmin()
    if tool is None:
        pytest.skip("rabbitmqadmin is not installed (apt-get install rabbitmq-server ships it)")
    port = int(mgmt[1].base.rsplit(":", 1)[1])

    def run(*args: str) -> str:
        out = subprocess.run([sys.executable, tool, "-H", "127.0.0.1", "-P", str(port), "-u", "guest",
                              "-p", "guest", "-f", "raw_json", *args], capture_output=True, text=True, timeout=30,
                             check=False)
        assert out.returncode == 0, out.stderr + out.stdout
        return out.stdout

    return run


def test_rabbitmqadmin_against_leveret(mgmt, uid):
    run = _rabbitmqadmin(mgmt)

    run("declare", "exchange", f"name={uid}-x", "type=topic")
    run("declare", "queue", f"name={uid}-q", "durable=false")
    run("declare", "binding", f"source={uid}-x", f"destination={uid}-q", "routing_key=a.#")
    run("publish", f"exchange={uid}-x", "routing_key=a.b", "payload=hello")
    queues = json.loads(run("list", "queues", "name", "messages"))
    assert {"name": f"{uid}-q", "messages": 1} in queues
    got = json.loads(run("get", f"queue={uid}-q", "ackmode=ack_requeue_false"))
    assert got[0]["payload"] == "hello" and got[0]["routing_key"] == "a.b"
    assert any(b["source"] == f"{uid}-x" for b in json.loads(run("list", "bindings")))
    assert json.loads(run("show", "overview"))[0]["rabbitmq_version"]
    run("declare", "user", f"name={uid}-u", "password=pw", "tags=monitoring")
    run("declare", "permission", "vhost=/", f"user={uid}-u", "configure=.*", "write=.*", "read=.*")
    assert any(u["name"] == f"{uid}-u" for u in json.loads(run("list", "users")))
    run("declare", "policy", f"name={uid}-p", "pattern=^zzz", 'definition={"max-length": 1}')
    assert any(p["name"] == f"{uid}-p" for p in json.loads(run("list", "policies")))
    run("delete", "policy", f"name={uid}-p")
    run("delete", "queue", f"name={uid}-q")
    run("delete", "exchange", f"name={uid}-x")
    run("delete", "user", f"name={uid}-u")
    assert not any(q_["name"] == f"{uid}-q" for q_ in json.loads(run("list", "queues")))


def test_rabbitmqadmin_declares_a_shovel_and_a_federation_upstream(mgmt, uid):
    """rabbitmqadmin's parameter commands, as a RabbitMQ operator declares shovels and upstreams (issue 37)."""
    run = _rabbitmqadmin(mgmt)

    run("declare", "queue", f"name={uid}-sq", "durable=true")
    for i in range(5):
        run("publish", "exchange=amq.default", f"routing_key={uid}-sq", f"payload=m{i}")
    shovel = {"src-uri": "amqp://", "src-queue": f"{uid}-sq", "dest-uri": "amqp://", "dest-queue": f"{uid}-dq"}
    run("declare", "parameter", "component=shovel", f"name={uid}-sh", f"value={json.dumps(shovel)}")
    run("declare", "parameter", "component=federation-upstream", f"name={uid}-up",
        'value={"uri": "amqp://", "max-hops": 2}')
    params = json.loads(run("list", "parameters"))
    assert {(p["component"], p["name"]) for p in params} >= {("shovel", f"{uid}-sh"),
                                                             ("federation-upstream", f"{uid}-up")}
    deadline = time.monotonic() + 20
    while not any(q_["name"] == f"{uid}-dq" and q_.get("messages") == 5 for q_ in json.loads(run("list", "queues"))):
        assert time.monotonic() < deadline, "the shovel declared with rabbitmqadmin moved nothing"
        time.sleep(0.3)
    run("delete", "parameter", "component=shovel", f"name={uid}-sh")
    run("delete", "parameter", "component=federation-upstream", f"name={uid}-up")
    assert not {(p["component"], p["name"]) for p in json.loads(run("list", "parameters"))} & {
        ("shovel", f"{uid}-sh"), ("federation-upstream", f"{uid}-up")}
    run("delete", "queue", f"name={uid}-sq")
    run("delete", "queue", f"name={uid}-dq")
