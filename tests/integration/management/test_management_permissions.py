"""Permissions: the configure / write / read mapping of broker/security/permissions.py (unit), the HTTP API
enforcing it for a restricted user, and AMQP operations refused with 403 as RabbitMQ refuses them."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pika
import pika.exceptions
import pytest

from broker.errors import AMQPError
from broker.security import permissions
from broker.security.auth import Permission, User
from tests.integration.management.test_management_api import Http, start_mgmt_broker

# -- unit: the mapping table --------------------------------------------------------------------------------------


def _user(configure: str, write: str, read: str, vhost: str = "/") -> User:
    u = User("u", "")
    u.permissions[vhost] = Permission(configure, write, read)
    return u


def _refused(fn, *args) -> str:
    with pytest.raises(AMQPError) as info:
        fn(*args)
    assert info.value.reply_code == 403
    return info.value.text


def test_error_text_is_rabbitmqs():
    u = _user("", "", "")
    assert _refused(permissions.check, u, "/", "queue", "q", "configure") == \
        "access to queue 'q' in vhost '/' refused for user 'u'"
    assert _refused(permissions.basic_publish, u, "/", "") == \
        "access to exchange 'amq.default' in vhost '/' refused for user 'u'"


def test_regexes_are_unanchored_and_empty_means_nothing():
    u = _user("app", "", ".*")
    assert permissions.allowed(u, "/", "queue", "myapp.q", "configure")
    assert not permissions.allowed(u, "/", "queue", "other", "configure")
    assert not permissions.allowed(u, "/", "exchange", "x", "write")
    assert permissions.allowed(u, "/", "queue", "anything", "read")
    assert not permissions.allowed(u, "/other", "queue", "anything", "read")


def test_default_exchange_is_amq_default():
    u = _user("", "^amq\\.default$", "")
    permissions.basic_publish(u, "/", "")
    _refused(permissions.basic_publish, u, "/", "amq.direct")


def test_operation_mapping():
    cfg_only = _user(".*", "", "")
    write_only = _user("", ".*", "")
    read_only = _user("", "", ".*")
    # declare / delete need configure
    permissions.queue_declare(cfg_only, "/", "q", {}, passive=False)
    permissions.exchange_declare(cfg_only, "/", "x", {}, passive=False)
    permissions.queue_delete(cfg_only, "/", "q")
    permissions.exchange_delete(cfg_only, "/", "x")
    _refused(permissions.queue_declare, read_only, "/", "q", {}, False)
    # passive declares need nothing
    permissions.queue_declare(_user("", "", ""), "/", "q", {}, passive=True)
    permissions.exchange_declare(_user("", "", ""), "/", "x", {}, passive=True)
    # queue.bind: write on the queue, read on the exchange
    _refused(permissions.queue_bind, write_only, "/", "q", "x")
    _refused(permissions.queue_bind, read_only, "/", "q", "x")
    permissions.queue_bind(_user("", "^q$", "^x$"), "/", "q", "x")
    assert "exchange 'x'" in _refused(permissions.queue_bind, _user("", "^q$", "^q$"), "/", "q", "x")
    # exchange.bind: write on the destination, read on the source
    permissions.exchange_bind(_user("", "^dst$", "^src$"), "/", "dst", "src")
    _refused(permissions.exchange_bind, _user("", "^src$", "^dst$"), "/", "dst", "src")
    # publish: write on the exchange; get / consume / purge: read on the queue
    permissions.basic_publish(write_only, "/", "x")
    _refused(permissions.basic_publish, read_only, "/", "x")
    for fn in (permissions.basic_get, permissions.basic_consume, permissions.queue_purge):
        fn(read_only, "/", "q")
        _refused(fn, write_only, "/", "q")


def test_declare_with_dlx_or_alternate_exchange_needs_more():
    u = _user(".*", "", ".*")
    text = _refused(permissions.queue_declare, u, "/", "q", {"x-dead-letter-exchange": "dlx"}, False)
    assert text == "access to exchange 'dlx' in vhost '/' refused for user 'u'"
    permissions.queue_declare(_user(".*", "^dlx$", "^q$"), "/", "q", {"x-dead-letter-exchange": "dlx"}, False)
    text = _refused(permissions.exchange_declare, u, "/", "x", {"alternate-exchange": "ae"}, False)
    assert text == "access to exchange 'ae' in vhost '/' refused for user 'u'"
    permissions.exchange_declare(_user(".*", "^ae$", "^x$"), "/", "x", {"alternate-exchange": "ae"}, False)


def test_vhost_access():
    u = _user("", "", "")  # an entry, even with empty regexes, opens the vhost
    permissions.check_vhost_access(u, "/")
    with pytest.raises(AMQPError) as info:
        permissions.check_vhost_access(u, "/other")
    assert info.value.reply_code == 530
    assert info.value.text == "access to vhost '/other' refused for user 'u'"


# -- against a broker ---------------------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def restricted():
    """A broker with user 'app' (password 'pw', tag management) allowed configure/write/read on names
    starting with 'app.' in '/' only."""
    tmp = Path(tempfile.mkdtemp(prefix="leveret-perm-"))
    b, mport, _ = start_mgmt_broker(tmp)
    api = Http(mport)
    api("PUT", "/api/users/app", {"password": "pw", "tags": "management"})
    api("PUT", "/api/permissions/%2F/app", {"configure": "^app\\.", "write": "^app\\.", "read": "^app\\."})
    for name in ("app.x", "other.x"):
        api("PUT", f"/api/exchanges/%2F/{name}", {"type": "direct"})
    for name in ("app.q", "other.q"):
        api("PUT", f"/api/queues/%2F/{name}", {"durable": False})
    try:
        yield b, api
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.leveret_only
def test_http_api_applies_permissions(restricted):
    _b, api = restricted
    auth = ("app", "pw")
    assert api("PUT", "/api/queues/%2F/app.new", {}, auth=auth)[0] == 201
    status, body, _ = api("PUT", "/api/queues/%2F/other.new", {}, auth=auth)
    assert status == 401
    assert body["reason"] == "access to queue 'other.new' in vhost '/' refused for user 'app'"
    publish = {"routing_key": "k", "payload": "x", "payload_encoding": "string", "properties": {}}
    assert api("POST", "/api/exchanges/%2F/app.x/publish", publish, auth=auth)[0] == 200
    assert api("POST", "/api/exchanges/%2F/other.x/publish", publish, auth=auth)[0] == 401
    assert api("POST", "/api/queues/%2F/other.q/get", {"count": 1, "ackmode": "ack_requeue_true"},
               auth=auth)[0] == 401
    assert api("DELETE", "/api/queues/%2F/other.q/contents", auth=auth)[0] == 401
    assert api("POST", "/api/bindings/%2F/e/other.x/q/app.q", {"routing_key": "r"}, auth=auth)[0] == 401
    assert api("POST", "/api/bindings/%2F/e/app.x/q/app.q", {"routing_key": "r"}, auth=auth)[0] == 201
    # A management user sees only the vhosts it has permissions in, and no users.
    api("PUT", "/api/vhosts/hidden", {})
    assert [v["name"] for v in api("GET", "/api/vhosts", auth=auth)[1]] == ["/"]
    assert api("GET", "/api/queues/hidden", auth=auth)[0] == 401
    assert api("GET", "/api/users", auth=auth)[0] == 401


def _app_channel(b):
    params = b.pika_params()
    params.credentials = pika.PlainCredentials("app", "pw")
    conn = pika.BlockingConnection(params)
    return conn, conn.channel()


# (operation, its allowed form, its refused form, the resource named in the 403)
AMQP_CASES = {
    "queue.declare": (lambda ch: ch.queue_declare("app.q2"), lambda ch: ch.queue_declare("other.q2"),
                      "queue 'other.q2'"),
    "queue.delete": (lambda ch: ch.queue_delete("app.q2"), lambda ch: ch.queue_delete("other.q"), "queue 'other.q'"),
    "exchange.declare": (lambda ch: ch.exchange_declare("app.x2", "fanout"),
                         lambda ch: ch.exchange_declare("other.x2", "fanout"), "exchange 'other.x2'"),
    "queue.bind": (lambda ch: ch.queue_bind("app.q", "app.x", "k"), lambda ch: ch.queue_bind("app.q", "other.x", "k"),
                   "exchange 'other.x'"),
    "basic.publish": (lambda ch: ch.basic_publish("app.x", "k", b"m"),
                      lambda ch: (ch.basic_publish("other.x", "k", b"m"), ch.queue_declare("app.q", passive=True)),
                      "exchange 'other.x'"),
    "basic.get": (lambda ch: ch.basic_get("app.q"), lambda ch: ch.basic_get("other.q"), "queue 'other.q'"),
    "basic.consume": (lambda ch: ch.basic_consume("app.q", lambda *a: None),
                      lambda ch: ch.basic_consume("other.q", lambda *a: None), "queue 'other.q'"),
    "queue.purge": (lambda ch: ch.queue_purge("app.q"), lambda ch: ch.queue_purge("other.q"), "queue 'other.q'"),
}


@pytest.mark.leveret_only
@pytest.mark.parametrize("op", list(AMQP_CASES))
def test_amqp_operation_allowed(restricted, op):
    conn, ch = _app_channel(restricted[0])
    try:
        AMQP_CASES[op][0](ch)
        assert ch.is_open
    finally:
        conn.close()


@pytest.mark.leveret_only
@pytest.mark.parametrize("op", list(AMQP_CASES))
def test_amqp_operation_refused_with_403(restricted, op):
    conn, ch = _app_channel(restricted[0])
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            AMQP_CASES[op][1](ch)
        assert info.value.reply_code == 403
        assert info.value.reply_text == \
            f"ACCESS_REFUSED - access to {AMQP_CASES[op][2]} in vhost '/' refused for user 'app'"
    finally:
        if conn.is_open:
            conn.close()


