"""Topic permissions enforced as RabbitMQ enforces them for AMQP 0-9-1 (access-control guide, "Topic
Authorisation"; rabbit_channel.erl): a publish to a topic exchange checks its routing key (and CC / BCC keys)
against the user's ``write`` regex, queue.bind / unbind and exchange.bind / unbind from a topic exchange check
the binding key against ``read``; other exchange types and exchanges without a topic permission are not
checked; ``{username}`` and ``{vhost}`` are expanded, ``{client_id}`` is not (MQTT only). A refusal is a
403 channel error with RabbitMQ's (3.13) text.

Leveret-only setup: topic permissions are set through the HTTP API; the AMQP behaviour is RabbitMQ's."""

from __future__ import annotations

import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from broker.errors import AMQPError
from broker.security import topic_permissions
from broker.security.auth import User
from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = pytest.mark.leveret_only

PW = "pw"


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[object, Http]]:
    tmp = Path(tempfile.mkdtemp(prefix="leveret-topicperm-"))
    b, mport, _ = start_mgmt_broker(tmp)
    try:
        yield b, Http(mport)
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def user(node, uid) -> str:
    """A user of its own with full permissions in '/' (names are unique per test)."""
    _b, api = node
    name = f"u{uid[-9:]}"
    assert api("PUT", f"/api/users/{name}", {"password": PW, "tags": "management"})[0] == 201
    assert api("PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    return name


def topic_perm(api: Http, user: str, exchange: str, write: str, read: str, vhost: str = "/") -> None:
    assert api("PUT", f"/api/topic-permissions/{q(vhost)}/{user}",
               {"exchange": exchange, "write": write, "read": read})[0] == 201


def connect(b, user: str, vhost: str = "/", **kw) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=b.host, port=b.port, virtual_host=vhost, credentials=pika.PlainCredentials(user, PW), **kw))


def refused(fn, *args, **kw) -> pika.exceptions.ChannelClosedByBroker:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        fn(*args, **kw)
    assert info.value.reply_code == 403
    return info.value


def text(key: str, user: str, exchange: str = "amq.topic", vhost: str = "/") -> str:
    return f"ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' in vhost '{vhost}' refused for user '{user}'"


def bound_queue(ch, uid: str, exchange: str = "amq.topic", key: str = "#") -> str:
    queue = ch.queue_declare(f"{uid}-q", auto_delete=True).method.queue
    ch.queue_bind(queue, exchange, key)
    return queue


# -- publishing ---------------------------------------------------------------------------------------------------

def test_publish_with_forbidden_routing_key_is_refused_and_not_routed(node, user, uid):
    b, api = node
    topic_perm(api, user, "amq.topic", write="^orders\\.", read=".*")
    conn = connect(b, user)
    ch = conn.channel()
    queue = bound_queue(ch, uid)
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "orders.created", b"ok")
    err = refused(ch.basic_publish, "amq.topic", "payments.created", b"no")
    assert err.reply_text == text("payments.created", user)
    ch2 = conn.channel()
    assert ch2.queue_declare(queue, passive=True).method.message_count == 1
    assert ch2.basic_get(queue, auto_ack=True)[2] == b"ok"
    conn.close()


def test_refusal_without_confirms_closes_the_channel_only(node, user, uid):
    b, api = node
    topic_perm(api, user, "amq.topic", write="^a\\.", read=".*")
    conn = connect(b, user)
    ch = conn.channel()
    queue = bound_queue(ch, uid)
    ch.basic_publish("amq.topic", "b.x", b"no")
    err = refused(ch.queue_declare, queue, passive=True)
    assert err.reply_text == text("b.x", user)
    assert conn.is_open
    assert conn.channel().queue_declare(queue, passive=True).method.message_count == 0
    conn.close()


def test_username_and_vhost_are_expanded(node, user, uid):
    b, api = node
    vhost = f"vh-{uid[-9:]}"
    assert api("PUT", f"/api/vhosts/{vhost}", {})[0] == 201
    api("PUT", f"/api/permissions/{vhost}/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
    topic_perm(api, user, "amq.topic", write="^{username}\\.{vhost}\\.", read=".*", vhost=vhost)
    conn = connect(b, user, vhost)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", f"{user}.{vhost}.event", b"ok")
    err = refused(ch.basic_publish, "amq.topic", f"someone.{vhost}.event", b"no")
    assert err.reply_text == text(f"someone.{vhost}.event", user, vhost=vhost)
    ch = conn.channel()
    ch.confirm_delivery()
    refused(ch.basic_publish, "amq.topic", f"{user}.other.event", b"no")
    conn.close()


def test_client_id_is_not_expanded_for_amqp_0_9_1(node, user):
    """RabbitMQ: "client_id only applies to MQTT"; an AMQP 0-9-1 connection has no client id, even when
    its client properties carry one, so the placeholder stays as written."""
    b, api = node
    topic_perm(api, user, "amq.topic", write="^{client_id}\\.", read=".*")
    conn = connect(b, user, client_properties={"client_id": "dev1", "connection_name": "dev1"})
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "{client_id}.x", b"literal")
    err = refused(ch.basic_publish, "amq.topic", "dev1.x", b"no")
    assert err.reply_text == text("dev1.x", user)
    conn.close()


def test_cc_and_bcc_keys_are_checked(node, user, uid):
    """Version-specific: RabbitMQ checks CC / BCC keys from 4.0.3 / 4.1.0 on (``check_write_permitted_on_topics``);
    3.10.8 (Debian's, checked), 3.13.x and 4.0.0-4.0.2 check the routing key only and accept these publishes."""
    b, api = node
    topic_perm(api, user, "amq.topic", write="^mine\\.", read=".*")
    conn = connect(b, user)
    ch = conn.channel()
    queue = bound_queue(ch, uid, key="theirs.#")
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "mine.x", b"ok", pika.BasicProperties(headers={"CC": ["mine.y"]}))
    err = refused(ch.basic_publish, "amq.topic", "mine.x", b"no",
                  pika.BasicProperties(headers={"CC": ["theirs.x"]}))
    assert err.reply_text == text("theirs.x", user)
    ch = conn.channel()
    ch.confirm_delivery()
    err = refused(ch.basic_publish, "amq.topic", "mine.x", b"no",
                  pika.BasicProperties(headers={"BCC": ["theirs.z"]}))
    assert err.reply_text == text("theirs.z", user)
    assert conn.channel().queue_declare(queue, passive=True).method.message_count == 0
    conn.close()


def test_only_topic_exchanges_with_a_topic_permission_are_checked(node, user, uid):
    b, api = node
    admin = pika.BlockingConnection(b.pika_params())
    ach = admin.channel()
    ach.exchange_declare(f"{uid}-direct", "direct", auto_delete=False)
    ach.exchange_declare(f"{uid}-topic", "topic", auto_delete=False)
    topic_perm(api, user, f"{uid}-direct", write="^nothing$", read="^nothing$")
    topic_perm(api, user, "amq.topic", write="^nothing$", read="^nothing$")
    conn = connect(b, user)
    ch = conn.channel()
    ch.confirm_delivery()
    queue = ch.queue_declare(f"{uid}-q", auto_delete=True).method.queue
    ch.queue_bind(queue, f"{uid}-direct", "anything")  # a direct exchange: its topic permission is ignored
    ch.basic_publish(f"{uid}-direct", "anything", b"1")
    ch.queue_bind(queue, f"{uid}-topic", "any.#")  # a topic exchange without a topic permission
    ch.basic_publish(f"{uid}-topic", "any.thing", b"2")
    ch.basic_publish("", queue, b"3")  # the default exchange is direct
    assert ch.queue_declare(queue, passive=True).method.message_count == 3
    refused(ch.basic_publish, "amq.topic", "any.thing", b"no")
    conn.close()
    ach.exchange_delete(f"{uid}-direct")
    ach.exchange_delete(f"{uid}-topic")
    admin.close()


def test_a_change_reaches_an_open_channel(node, user, uid):
    b, api = node
    conn = connect(b, user)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "x.y", b"before")  # no topic permission yet: allowed (and cached)
    # RabbitMQ keeps allowed topic checks in a per-channel cache (rabbit_channel ``topic_permission_cache``)
    # that the internal backend clears only when the channel hibernates (idle about 1 s): a change reaches an
    # open channel at once in Leveret, after that idle time (or for keys not cached) in RabbitMQ.
    topic_perm(api, user, "amq.topic", write="^a\\.", read=".*")
    err = refused(ch.basic_publish, "amq.topic", "x.y", b"after")
    assert err.reply_text == text("x.y", user)
    assert api("DELETE", f"/api/topic-permissions/%2F/{user}")[0] == 204
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "x.y", b"again")
    conn.close()


def test_transactional_publish_is_refused_at_publish(node, user, uid):
    b, api = node
    topic_perm(api, user, "amq.topic", write="^a\\.", read=".*")
    conn = connect(b, user)
    ch = conn.channel()
    queue = bound_queue(ch, uid)
    ch.tx_select()
    ch.basic_publish("amq.topic", "b.x", b"no")
    err = refused(ch.tx_commit)
    assert err.reply_text == text("b.x", user)
    assert conn.channel().queue_declare(queue, passive=True).method.message_count == 0
    conn.close()


# -- bindings -----------------------------------------------------------------------------------------------------

def test_bindings_check_the_binding_key_against_read(node, user, uid):
    b, api = node
    topic_perm(api, user, "amq.topic", write=".*", read="^{username}\\.")
    conn = connect(b, user)
    ch = conn.channel()
    queue = ch.queue_declare(f"{uid}-q", auto_delete=True).method.queue
    ch.queue_bind(queue, "amq.topic", f"{user}.#")
    err = refused(ch.queue_bind, queue, "amq.topic", "#")
    assert err.reply_text == text("#", user)
    ch = conn.channel()
    err = refused(ch.queue_unbind, queue, "amq.topic", "other.#")
    assert err.reply_text == text("other.#", user)
    ch = conn.channel()
    ch.exchange_declare(f"{uid}-dst", "fanout", auto_delete=True)
    ch.exchange_bind(f"{uid}-dst", "amq.topic", f"{user}.x")
    err = refused(ch.exchange_bind, f"{uid}-dst", "amq.topic", "other.x")
    assert err.reply_text == text("other.x", user)
    ch = conn.channel()
    ch.queue_unbind(queue, "amq.topic", f"{user}.#")
    ch.basic_consume(queue, lambda *a: None)  # consuming is not subject to topic permissions
    conn.close()


def test_http_api_binding_and_publish_are_checked(node, user):
    _b, api = node
    topic_perm(api, user, "amq.topic", write="^w\\.", read="^r\\.")
    auth = (user, PW)
    queue = f"{user}-q"
    assert api("PUT", f"/api/queues/%2F/{queue}", {"auto_delete": False}, auth=auth)[0] == 201
    path = f"/api/bindings/%2F/e/amq.topic/q/{queue}"
    assert api("POST", path, {"routing_key": "r.x"}, auth=auth)[0] == 201
    status, body, _ = api("POST", path, {"routing_key": "x.#"}, auth=auth)
    assert (status, body["reason"]) == (401, text("x.#", user).removeprefix("ACCESS_REFUSED - "))
    publish = {"routing_key": "w.1", "payload": "x", "payload_encoding": "string", "properties": {}}
    assert api("POST", "/api/exchanges/%2F/amq.topic/publish", publish, auth=auth)[0] == 200
    status, body, _ = api("POST", "/api/exchanges/%2F/amq.topic/publish", {**publish, "routing_key": "r.x"},
                          auth=auth)
    assert (status, body["reason"]) == (401, text("r.x", user).removeprefix("ACCESS_REFUSED - "))
    api("DELETE", f"/api/queues/%2F/{queue}")


# -- unit: the rules ----------------------------------------------------------------------------------------------

class _X:
    def __init__(self, name: str, type_name: str) -> None:
        self.name, self.type_name = name, type_name


class _VH:
    def __init__(self, name: str, *exchanges: _X) -> None:
        self.name = name
        self.exchanges = {x.name: x for x in exchanges}


def test_rules_unit():
    u = User("bob", "")
    vh = _VH("/", _X("amq.topic", "topic"), _X("d", "direct"))
    assert topic_permissions.publish_check(u, "/", "amq.topic") is None  # no topic permission: no check
    u.topic_permissions["/"] = {"amq.topic": ("", "^{username}$"), "d": ("^x$", "^x$")}
    check = topic_permissions.publish_check(u, "/", "amq.topic")
    assert check is not None
    with pytest.raises(AMQPError) as info:  # an empty pattern means ^$: only the empty key
        check.check(vh.exchanges["amq.topic"], "a")
    assert (info.value.reply_code, info.value.class_id, info.value.method_id) == (403, 60, 40)
    check.check(vh.exchanges["amq.topic"], "")
    topic_permissions.check_bind(u, vh, "amq.topic", "bob")
    with pytest.raises(AMQPError):
        topic_permissions.check_bind(u, vh, "amq.topic", "bob.x")  # anchored by the pattern itself
    topic_permissions.check_bind(u, vh, "d", "anything")  # not a topic exchange
    assert topic_permissions.expand("^{username}.{vhost}.{client_id}", "bob", "v") == "^bob.v.{client_id}"
    u.topic_permissions["/"]["amq.topic"] = ("^{username}", ".*")
    broken = User("a(b", "")
    broken.topic_permissions = u.topic_permissions
    bad = topic_permissions.publish_check(broken, "/", "amq.topic")
    with pytest.raises(AMQPError):  # a pattern that no longer compiles after expansion matches nothing
        bad.check(vh.exchanges["amq.topic"], "a(b.x")
