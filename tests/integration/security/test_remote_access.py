"""Clients on another host, as users have them: a network namespace of the test's own reaches the broker
(bound to all addresses) through a veth pair, from a non-loopback address.

``loopback_users`` (guest by default) holds on every door: over AMQP and over the HTTP API, guest is
refused from elsewhere (RabbitMQ: 401 "User can only log in via localhost") and accepted from loopback,
while other users work from anywhere.
"""

from __future__ import annotations

import json

import pytest
from netns import network_namespace

from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = pytest.mark.leveret_only

HTTP_CLIENT = """
import base64, json, urllib.request, urllib.error
req = urllib.request.Request("http://{host}:{port}{path}", method="{method}", data={data!r},
      headers={{"Authorization": "Basic " + base64.b64encode(b"{user}:{password}").decode(),
               "Content-Type": "application/json"}})
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(json.dumps([r.status, r.read().decode()]))
except urllib.error.HTTPError as e:
    print(json.dumps([e.code, e.read().decode()]))
"""

AMQP_CLIENT = """
import pika
try:
    c = pika.BlockingConnection(pika.ConnectionParameters("{host}", {port}, credentials=pika.PlainCredentials(
        "{user}", "{password}"), connection_attempts=1, socket_timeout=10))
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"from another host")
    m, _, body = ch.basic_get(q, auto_ack=True)
    print("ok", body.decode())
    c.close()
except pika.exceptions.ProbableAuthenticationError as e:
    print("refused", e)
"""


@pytest.fixture
def remote(tmp_path):
    with network_namespace() as host:
        b, mport, _ = start_mgmt_broker(tmp_path, "--bind", "0.0.0.0")
        try:
            yield host, b, mport
        finally:
            b.stop()


def remote_http(host, mport, path, user, password, method="GET", body=None):
    data = json.dumps(body).encode() if body is not None else None
    out = host.run(HTTP_CLIENT.format(host=host.host_address, port=mport, path=path, user=user,
                                      password=password, method=method, data=data))
    assert out.returncode == 0, out.stderr
    status, text = json.loads(out.stdout)
    return status, text


def test_guest_cannot_use_the_http_api_from_another_host(remote):
    host, _b, mport = remote
    status, text = remote_http(host, mport, "/api/overview", "guest", "guest")
    assert status == 401
    assert json.loads(text)["reason"] == "User can only log in via localhost"
    # Nor create an administrator, which is what it could do before.
    status, _ = remote_http(host, mport, "/api/users/intruder", "guest", "guest", "PUT",
                            {"password": "x", "tags": "administrator"})
    assert status == 401
    local = Http(mport)
    assert local("GET", "/api/users/intruder")[0] == 404
    assert local("GET", "/api/overview")[0] == 200  # from loopback guest still works


def test_other_users_work_from_another_host_over_http_and_amqp(remote):
    host, b, mport = remote
    local = Http(mport)
    assert local("PUT", "/api/users/ops", {"password": "s3cret", "tags": "administrator"})[0] in (201, 204)
    assert local("PUT", "/api/permissions/%2F/ops", {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    status, text = remote_http(host, mport, "/api/whoami", "ops", "s3cret")
    assert status == 200 and json.loads(text)["name"] == "ops"
    out = host.run(AMQP_CLIENT.format(host=host.host_address, port=b.port, user="ops", password="s3cret"))
    assert out.stdout.strip() == "ok from another host", out.stderr
    out = host.run(AMQP_CLIENT.format(host=host.host_address, port=b.port, user="guest", password="guest"))
    assert out.stdout.startswith("refused"), (out.stdout, out.stderr)
