"""Vhost limits (``max-connections``, ``max-queues``) and user limits (``max-connections``, ``max-channels``)
enforced with RabbitMQ's codes and texts (rabbit_reader.erl, rabbit_queue_type.erl), validated as RabbitMQ
validates them, kept across a restart and carried by definitions; shovel and federation parameters with bad
values refused (400 with the plugins' reasons), and the federation plugin's internal ``federation`` component
(400, RabbitMQ's "component ... not found" plus the missing feature) instead of stored and ignored.

Leveret-only setup (limits are set through the HTTP API); the AMQP answers are RabbitMQ's."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from tests.conftest import ROOT
from tests.integration.management.test_management_api import Http, mgmt_node

pytestmark = pytest.mark.leveret_only

PW = "pw"


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[object, Http]]:
    with mgmt_node("leveret-limits-") as n:
        yield n


@pytest.fixture
def vhost(node, uid) -> Iterator[str]:
    """A vhost of the test's own, guest allowed in it."""
    _b, api = node
    name = f"vh-{uid[-9:]}"
    assert api("PUT", f"/api/vhosts/{name}", {})[0] == 201
    assert api("PUT", f"/api/permissions/{name}/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    yield name
    api("DELETE", f"/api/vhosts/{name}")


@pytest.fixture
def user(node, uid) -> str:
    _b, api = node
    name = f"u{uid[-9:]}"
    assert api("PUT", f"/api/users/{name}", {"password": PW, "tags": ""})[0] == 201
    assert api("PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    return name


def connect(b, vhost: str = "/", user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=b.host, port=b.port, virtual_host=vhost, credentials=pika.PlainCredentials(user, password)))


def refused_connection(b, vhost: str = "/", user: str = "guest", password: str = "guest") -> str:
    """The reply text of a connection.close 530 answering connection.open (pika reports a close during
    the handshake as ProbableAccessDeniedError, carrying the broker's code and text in its message)."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(b, vhost, user, password)
    match = re.fullmatch(r'ConnectionClosedByBroker: \((\d+)\) "(.*)"', str(info.value.args[0]), re.DOTALL)
    assert match is not None, info.value
    assert match.group(1) == "530"
    return match.group(2)


# -- vhost max-connections ----------------------------------------------------------------------------------------

def test_vhost_max_connections(node, vhost):
    b, api = node
    assert api("PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 2})[0] == 204
    assert api("GET", f"/api/vhost-limits/{vhost}")[1] == [{"vhost": vhost, "value": {"max-connections": 2}}]
    assert {"vhost": vhost, "value": {"max-connections": 2}} in api("GET", "/api/vhost-limits")[1]
    first, second = connect(b, vhost), connect(b, vhost)
    assert refused_connection(b, vhost) == \
        f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (2) is reached"
    other = connect(b)  # other vhosts are not affected
    first.close()
    third = connect(b, vhost)
    assert api("PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": -1})[0] == 204  # negative: none
    fourth = connect(b, vhost)
    assert api("DELETE", f"/api/vhost-limits/{vhost}/max-connections")[0] == 204
    assert api("GET", f"/api/vhost-limits/{vhost}")[1] == []
    for c in (second, third, fourth, other):
        c.close()


def test_vhost_max_connections_zero_refuses_every_connection(node, vhost):
    b, api = node
    assert api("PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 0})[0] == 204
    assert refused_connection(b, vhost).endswith("connection limit (0) is reached")


def test_connection_limit_is_checked_before_vhost_permissions(node, vhost, user):
    """RabbitMQ's connection.open order: vhost limit, user limit, then the user's access to the vhost."""
    b, api = node
    api("PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 0})
    assert refused_connection(b, vhost, user, PW) == \
        f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}': connection limit (0) is reached"
    api("DELETE", f"/api/vhost-limits/{vhost}/max-connections")
    assert refused_connection(b, vhost, user, PW) == f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}'"


# -- vhost max-queues ---------------------------------------------------------------------------------------------

def test_vhost_max_queues(node, vhost):
    b, api = node
    assert api("PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": 2})[0] == 204
    conn = connect(b, vhost)
    ch = conn.channel()
    ch.queue_declare("q1")
    ch.queue_declare("", exclusive=True)  # server-named and exclusive queues count too
    ch.queue_declare("q1")  # redeclaring an existing queue is not refused
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("q3")
    assert info.value.reply_code == 406
    assert info.value.reply_text == \
        f"PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost '{vhost}' (2) is reached"
    status, body, _ = api("PUT", f"/api/queues/{vhost}/q4", {"durable": True})
    assert (status, body["reason"]) == (400, f"cannot declare queue 'q4': queue limit in vhost '{vhost}' (2) is reached")
    ch = conn.channel()
    ch.queue_delete("q1")
    ch.queue_declare("q3")
    conn.close()


# -- user limits --------------------------------------------------------------------------------------------------

def test_user_max_connections(node, user):
    b, api = node
    assert api("PUT", f"/api/user-limits/{user}/max-connections", {"value": 1})[0] == 204
    assert api("GET", f"/api/user-limits/{user}")[1] == [{"user": user, "value": {"max-connections": 1}}]
    assert api("GET", f"/api/users/{user}")[1]["limits"] == {"max-connections": 1}
    first = connect(b, user=user, password=PW)
    assert refused_connection(b, user=user, password=PW) == \
        f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) is reached"
    guest = connect(b)  # other users are not affected
    first.close()
    connect(b, user=user, password=PW).close()
    guest.close()


def test_user_max_channels_counts_every_connection_of_the_user(node, user):
    b, api = node
    assert api("PUT", f"/api/user-limits/{user}/max-channels", {"value": 2})[0] == 204
    one, two = connect(b, user=user, password=PW), connect(b, user=user, password=PW)
    one.channel()
    two.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        two.channel()
    assert info.value.reply_code == 530
    # Version-specific text: RabbitMQ 4.2.8+ / 4.3.2+ (this one); 3.10.8 (Debian's, checked) up to 4.2.7 and
    # 4.3.1 end with "user limit of (2)", and 3.13.x-4.1.x print the node name instead of the user's.
    assert info.value.reply_text == \
        f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the maximum allowed user limit of 2"
    assert one.is_open
    one.close()
    three = connect(b, user=user, password=PW)
    three.channel()  # the channels of closed connections no longer count
    three.channel()
    assert api("DELETE", f"/api/user-limits/{user}/all")[0] == 204
    assert api("GET", f"/api/user-limits/{user}")[1] == []
    three.channel()
    three.close()


# -- validation ---------------------------------------------------------------------------------------------------

def test_limits_are_validated_as_rabbitmq_validates_them(node, vhost, user):
    _b, api = node
    status, body, _ = api("PUT", f"/api/vhost-limits/{vhost}/max-foo", {"value": 1})
    assert (status, body["reason"]) == (400, 'Validation failed\n\nUnrecognised terms [{<<"max-foo">>,1}] in limits\n')
    status, body, _ = api("PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": "ten"})
    assert (status, body["reason"]) == \
        (400, 'Validation failed\n\nmax-queues should be a number, actually was <<"ten">>\n')
    status, body, _ = api("PUT", f"/api/user-limits/{user}/max-queues", {"value": 1})
    assert (status, body["reason"]) == (400, 'Unrecognised terms [{<<"max-queues">>,1}] in user-limits')
    assert api("PUT", f"/api/user-limits/{user}/max-channels", {})[0] == 400
    assert api("PUT", "/api/vhost-limits/no-such-vhost/max-queues", {"value": 1})[0] == 404
    assert api("PUT", "/api/user-limits/no-such-user/max-channels", {"value": 1})[0] == 404
    assert api("GET", f"/api/vhost-limits/{vhost}")[1] == [] and api("GET", f"/api/user-limits/{user}")[1] == []


def test_setting_limits_needs_the_administrator_tag(node, vhost, user):
    _b, api = node
    api("PUT", f"/api/users/{user}", {"password": PW, "tags": "management"})
    assert api("PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": 1}, auth=(user, PW))[0] == 401
    assert api("PUT", f"/api/user-limits/{user}/max-channels", {"value": 1}, auth=(user, PW))[0] == 401


# -- the vhost-limits parameter, shovel and federation parameters ------------------------------------------------

def test_vhost_limits_are_the_vhost_limits_parameter(node, vhost):
    b, api = node
    path = f"/api/parameters/vhost-limits/{vhost}/limits"
    assert api("PUT", path, {"value": {"max-connections": 0}})[0] == 201
    assert api("GET", f"/api/vhost-limits/{vhost}")[1] == [{"vhost": vhost, "value": {"max-connections": 0}}]
    assert refused_connection(b, vhost).endswith("connection limit (0) is reached")
    status, body, _ = api("PUT", path, {"value": {"max-connections": "x"}})
    assert status == 400 and "max-connections should be a number" in body["reason"]
    assert api("DELETE", path)[0] == 204
    connect(b, vhost).close()


@pytest.mark.parametrize("component, value, reason", [
    # the federation plugin's own per-link component: not one Leveret has
    ("federation", {"uri": "amqp://elsewhere"}, ("component federation not found\n"
                                                "federation (RabbitMQ's rabbitmq_federation plugin) is not "
                                                "implemented by Leveret")),
    # upstreams exist (broker/federation/): a bad value gets the plugin's validation answer
    ("federation-upstream", {"uri": 5}, "uri should be binary, actually was 5"),
    ("federation-upstream-set", {"upstream": "u"}, ("{uid} should be a list, actually was "
                                                   '[{<<"upstream">>,<<"u">>}]')),
])
def test_federation_parameters_refused_are_not_stored(node, uid, component, value, reason):
    _b, api = node
    path = f"/api/parameters/{component}/%2F/{q(uid)}"
    status, body, _ = api("PUT", path, {"value": value})
    assert status == 400
    assert body == {"error": "bad_request", "reason": f"Validation failed\n\n{reason.replace('{uid}', uid)}\n"}
    assert api("GET", path)[0] == 404
    assert not any(p["component"] == component for p in api("GET", "/api/parameters")[1])
    assert not any(p["component"] == component for p in api("GET", "/api/definitions")[1]["parameters"])


def test_a_shovel_parameter_with_an_unknown_key_is_refused_not_stored(node, uid):
    """Shovels exist (broker/shovel/): a bad value gets the shovel plugin's validation answer and is not kept."""
    _b, api = node
    path = f"/api/parameters/shovel/%2F/{q(uid)}"
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
             "uri": "amqp://elsewhere"}
    status, body, _ = api("PUT", path, {"value": value})
    assert status == 400
    assert body["reason"].startswith("Validation failed\n\nUnrecognised terms") and "uri" in body["reason"]
    assert api("GET", path)[0] == 404
    assert not any(p["name"] == uid for p in api("GET", "/api/definitions")[1]["parameters"])


@pytest.mark.parametrize("component, value", [
    ("federation-upstream", {"uri": "amqp://elsewhere", "bogus": 1}),
    ("shovel", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://b", "src-delete-after": "sometimes"}),
])
def test_definitions_with_a_refused_parameter_are_refused_before_anything_is_applied(node, uid, component, value):
    _b, api = node
    doc = {"users": [{"name": f"{uid}-user", "password_hash": "", "tags": []}],
           "vhosts": [{"name": f"{uid}-vh"}],
           "parameters": [{"vhost": "/", "component": component, "name": f"{uid}-p", "value": value}]}
    status, body, _ = api("POST", "/api/definitions", doc)
    assert status == 400
    assert body["reason"].startswith(f"parameter '{uid}-p' of component '{component}' in vhost '/': "), body
    assert api("GET", f"/api/users/{uid}-user")[0] == 404
    assert api("GET", f"/api/vhosts/{uid}-vh")[0] == 404


# -- persistence and definitions ----------------------------------------------------------------------------------

def wait_for_api(api: Http, timeout: float = 10.0) -> None:
    """After a restart the HTTP listener opens just after the AMQP one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            api("GET", "/api/overview")
            return
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_limits_survive_a_restart_and_travel_with_definitions(uid):
    with mgmt_node("leveret-limits-restart-") as (b, api):
        api("PUT", "/api/vhosts/lim", {})
        api("PUT", "/api/permissions/lim/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        api("PUT", "/api/users/app", {"password": PW, "tags": ""})
        api("PUT", "/api/permissions/%2F/app", {"configure": ".*", "write": ".*", "read": ".*"})
        assert api("PUT", "/api/vhost-limits/lim/max-queues", {"value": 1})[0] == 204
        assert api("PUT", "/api/vhost-limits/lim/max-connections", {"value": 5})[0] == 204
        assert api("PUT", "/api/user-limits/app/max-channels", {"value": 1})[0] == 204
        b.restart()
        wait_for_api(api)
        assert api("GET", "/api/vhost-limits/lim")[1] == [{"vhost": "lim",
                                                            "value": {"max-queues": 1, "max-connections": 5}}]
        assert api("GET", "/api/user-limits/app")[1] == [{"user": "app", "value": {"max-channels": 1}}]
        conn = connect(b, "lim")
        ch = conn.channel()
        ch.queue_declare("only")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("second")
        assert info.value.reply_code == 406
        conn.close()
        app = connect(b, user="app", password=PW)
        app.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
            app.channel()
        exported = api("GET", "/api/definitions")[1]
    # RabbitMQ 3.13's shape: limits on the user and the vhost objects, vhost limits also as a parameter.
    assert next(u for u in exported["users"] if u["name"] == "app")["limits"] == {"max-channels": 1}
    assert next(v for v in exported["vhosts"] if v["name"] == "lim")["limits"] == \
        {"max-queues": 1, "max-connections": 5}
    assert {"vhost": "lim", "component": "vhost-limits", "name": "limits",
            "value": {"max-queues": 1, "max-connections": 5}} in exported["parameters"]
    with mgmt_node("leveret-limits-import-") as (b2, api2):
        assert api2("POST", "/api/definitions", exported)[0] == 204
        assert api2("GET", "/api/user-limits/app")[1] == [{"user": "app", "value": {"max-channels": 1}}]
        assert api2("GET", "/api/vhost-limits/lim")[1] == [{"vhost": "lim",
                                                             "value": {"max-queues": 1, "max-connections": 5}}]
        app = connect(b2, user="app", password=PW)
        app.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
            app.channel()


def test_user_limits_from_a_rabbitmq_definitions_file(node, uid):
    """Shaped as RabbitMQ 3.13 exports a user with limits and a vhost with limits."""
    _b, api = node
    name, vh = f"{uid}-imported", f"{uid}-vh"
    doc = {"rabbit_version": "3.13.7", "rabbitmq_version": "3.13.7",
           "users": [{"name": name, "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
                      "tags": [], "limits": {"max-connections": 3, "max-channels": 7}}],
           "vhosts": [{"name": vh, "limits": {"max-connections": 4},
                       "metadata": {"description": "", "tags": []}}],
           "parameters": [{"vhost": vh, "component": "vhost-limits", "name": "limits",
                           "value": {"max-connections": 4}}]}
    assert api("POST", "/api/definitions", doc)[0] == 204
    assert api("GET", f"/api/users/{name}")[1]["limits"] == {"max-connections": 3, "max-channels": 7}
    assert api("GET", f"/api/vhost-limits/{vh}")[1] == [{"vhost": vh, "value": {"max-connections": 4}}]
    bad = {"users": [{"name": name, "password_hash": "", "limits": {"max-queues": 1}}]}
    status, body, _ = api("POST", "/api/definitions", bad)
    assert status == 400 and body["reason"] == \
        f"user '{name}': Unrecognised terms [{{<<\"max-queues\">>,1}}] in user-limits"
    api("DELETE", f"/api/vhosts/{vh}")


# -- leveret ctl --------------------------------------------------------------------------------------------------

def test_ctl_limit_verbs(node, vhost, user):
    b, api = node
    port = api.base.rsplit(":", 1)[1]

    def ctl(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{port}", *args],
                             capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert ctl("set_vhost_limits", "-p", vhost, '{"max-connections": 0, "max-queues": 9}') == \
        f"Setting vhost limits to \"{{\"max-connections\": 0, \"max-queues\": 9}}\" for vhost \"{vhost}\" ..."
    assert refused_connection(b, vhost).endswith("connection limit (0) is reached")
    assert ctl("clear_vhost_limits", "-p", vhost) == f"Clearing vhost \"{vhost}\" limits ..."
    assert api("GET", f"/api/vhost-limits/{vhost}")[1] == []
    assert ctl("set_user_limits", user, '{"max-channels": 1}') == \
        f"Setting user limits to \"{{\"max-channels\": 1}}\" for user \"{user}\" ..."
    assert api("GET", f"/api/user-limits/{user}")[1] == [{"user": user, "value": {"max-channels": 1}}]
    assert ctl("clear_user_limits", user, "max-channels") == f"Clearing \"max-channels\" limit for user \"{user}\" ..."
    assert api("GET", f"/api/user-limits/{user}")[1] == []
    assert ctl("set_topic_permissions", user, "amq.topic", "^a\\.", "^b\\.") == \
        f"Setting topic permissions on \"amq.topic\" for user \"{user}\" in vhost \"/\" ..."
    assert api("GET", f"/api/topic-permissions/%2F/{user}")[1] == \
        [{"user": user, "vhost": "/", "exchange": "amq.topic", "write": "^a\\.", "read": "^b\\."}]
    assert ctl("clear_topic_permissions", user) == f"Clearing topic permissions for user \"{user}\" in vhost \"/\" ..."
    assert api("GET", f"/api/topic-permissions/%2F/{user}")[0] == 404


async def test_metadata_with_a_shovel_stored_by_an_earlier_leveret_still_loads(tmp_path):
    """Earlier versions stored shovel and federation parameters unchecked: the node starts, and one its component
    would refuse now (this shovel has no source queue or destination) is dropped."""
    from broker import definitions
    from broker.config import Settings
    from broker.node import Node

    node = Node(Settings(data_dir=tmp_path / "n"))
    doc = definitions.export(node, schema=False)
    doc["parameters"] += [{"vhost": "/", "component": "shovel", "name": "old", "value": {"src-uri": "amqp://"}},
                          {"vhost": "/", "component": "vhost-limits", "name": "limits",
                           "value": {"max-queues": 3}}]
    definitions.apply_metadata(node, doc)
    assert node.vhosts["/"].parameters == {("vhost-limits", "limits"): {"max-queues": 3}}
