"""Every way a message enters the broker takes the one publish path (``VHost.publish``, broker/publish.py):
AMQP basic.publish, the HTTP API's ``POST /api/exchanges/{vhost}/{name}/publish``, the aliveness test and
dead-lettering. What the HTTP publish used to get wrong by routing on its own: it left the message's publish
time at 0, so a queue's ``x-message-ttl`` expired it at once; it ignored the ``expiration`` property, the
CC / BCC headers and the answer of a queue that refuses the message.

RabbitMQ's management plugin publishes over an internal AMQP channel in confirm mode with mandatory=true
(rabbit_mgmt_wm_exchange_publish): a refusal by the channel is 400 with ``"<code> <reply text>"`` as the
reason (``rabbit_mgmt_util:bad_request_exception``), a nack is 400 ``"rejected Unable to publish message.
Check queue limits."``, a return is ``{"routed": false}``.
"""

from __future__ import annotations

import time
import urllib.parse

import pika
import pytest

from tests.integration.management.test_management_api import mgmt_node

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def node():
    with mgmt_node("leveret-publish-paths-") as n:
        yield n


@pytest.fixture
def api(node):
    return node[1]


@pytest.fixture
def ch(node):
    conn = pika.BlockingConnection(node[0].pika_params())
    yield conn.channel()
    if conn.is_open:
        conn.close()


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def http_publish(api, exchange: str, routing_key: str, payload: str = "m", **properties):
    body = {"routing_key": routing_key, "payload": payload, "payload_encoding": "string",
            "properties": properties}
    return api("POST", f"/api/exchanges/%2F/{q(exchange or 'amq.default')}/publish", body)


def ready(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def wait_ready(ch, queue: str, expected: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    n = ready(ch, queue)
    while n != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        n = ready(ch, queue)
    return n


# -- TTL counts from the publish ---------------------------------------------------------------------------

def test_http_publish_into_queue_with_message_ttl_waits_for_the_ttl(api, ch, uid):
    ch.queue_declare(uid, arguments={"x-message-ttl": 5000})
    assert http_publish(api, "", uid)[1] == {"routed": True}
    published = time.monotonic()
    time.sleep(1.0)
    assert ready(ch, uid) == 1  # still there a second later: its TTL counts from the publish
    assert wait_ready(ch, uid, 0, timeout=8.0) == 0
    assert time.monotonic() - published >= 4.0  # gone once the 5 s have passed, not before


def test_http_publish_honours_the_expiration_property(api, ch, uid):
    ch.queue_declare(uid)
    assert http_publish(api, "", uid, "short", expiration="300")[1] == {"routed": True}
    assert http_publish(api, "", uid, "long", expiration="60000")[1] == {"routed": True}
    assert ready(ch, uid) == 2
    assert wait_ready(ch, uid, 1, timeout=5.0) == 1  # the first expires at the head; the second waits
    _m, props, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"long" and props.expiration == "60000"


def test_http_publish_with_an_invalid_expiration_is_refused_as_rabbitmq_does(api, ch, uid):
    ch.queue_declare(uid)
    status, body, _ = http_publish(api, "", uid, expiration="soon")
    assert status == 400
    assert body == {"error": "bad_request", "reason": "406 PRECONDITION_FAILED - invalid expiration 'soon': no_integer"}
    assert ready(ch, uid) == 0


# -- sender-selected distribution ------------------------------------------------------------------------

def test_http_publish_routes_to_cc_and_bcc_keys_and_drops_bcc(api, ch, uid):
    queues = {key: f"{uid}-{key}" for key in ("main", "cc", "bcc", "other")}
    for key, name in queues.items():
        ch.queue_declare(name)
        ch.queue_bind(name, "amq.direct", routing_key=f"{uid}.{key}")
    status, body, _ = http_publish(api, "amq.direct", f"{uid}.main", "hi",
                                   headers={"CC": [f"{uid}.cc"], "BCC": [f"{uid}.bcc"], "h": "v"})
    assert (status, body) == (200, {"routed": True})
    for key in ("main", "cc", "bcc"):
        method, props, payload = ch.basic_get(queues[key], auto_ack=True)
        assert payload == b"hi", key
        assert method.routing_key == f"{uid}.main"
        assert props.headers == {"CC": [f"{uid}.cc"], "h": "v"}, key  # BCC is never delivered
    assert ready(ch, queues["other"]) == 0


def test_http_publish_cc_must_be_an_array(api, ch, uid):
    ch.queue_declare(uid)
    status, body, _ = http_publish(api, "", uid, headers={"CC": "not-an-array"})
    assert status == 400
    assert body["reason"] == \
        '406 PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"CC",longstr}'
    assert ready(ch, uid) == 0


# -- the publisher's identity and the queues' answer -----------------------------------------------------

def test_http_publish_with_someone_elses_user_id_is_refused(api, ch, uid):
    ch.queue_declare(uid)
    status, body, _ = http_publish(api, "", uid, user_id="somebody-else")
    assert status == 400
    assert body == {"error": "bad_request", "reason": "406 PRECONDITION_FAILED - user_id property set to "
                    "'somebody-else' but authenticated user was 'guest'"}
    assert http_publish(api, "", uid, user_id="guest")[1] == {"routed": True}
    assert ready(ch, uid) == 1
    _m, props, _b = ch.basic_get(uid, auto_ack=True)
    assert props.user_id == "guest"


def test_http_publish_refused_by_a_full_queue_is_rejected(api, ch, uid):
    ch.queue_declare(uid, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    assert http_publish(api, "", uid, "first")[1] == {"routed": True}
    status, body, _ = http_publish(api, "", uid, "second")
    assert status == 400
    assert body == {"error": "bad_request",
                    "reason": "rejected Unable to publish message. Check queue limits."}
    assert http_publish(api, "", f"{uid}-nowhere")[1] == {"routed": False}
    assert ready(ch, uid) == 1


# -- dead-lettering and the aliveness test go the same way --------------------------------------------------

def test_http_published_message_is_dead_lettered_after_its_ttl_with_its_death(api, ch, uid):
    dlq = f"{uid}-dlq"
    ch.queue_declare(dlq)
    ch.queue_declare(uid, arguments={"x-message-ttl": 1500, "x-dead-letter-exchange": "",
                                     "x-dead-letter-routing-key": dlq})
    assert http_publish(api, "", uid, "late", expiration="60000", headers={"BCC": [f"{uid}-x"]})[1] == \
        {"routed": True}
    time.sleep(0.5)
    assert ready(ch, dlq) == 0  # not dead-lettered at once
    assert wait_ready(ch, dlq, 1, timeout=5.0) == 1
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"late" and method.routing_key == dlq and props.expiration is None
    death = props.headers["x-death"][0]
    assert (death["queue"], death["reason"], death["count"]) == (uid, "expired", 1)
    assert death["routing-keys"] == [uid] and death["original-expiration"] == "60000"
    assert props.headers["x-first-death-queue"] == uid and "BCC" not in props.headers


def test_dead_letter_cycle_is_still_dropped(api, ch, uid):
    """A message expiring in a queue whose DLX routes back to it dies once, not forever."""
    ch.queue_declare(uid, arguments={"x-message-ttl": 200, "x-dead-letter-exchange": "",
                                     "x-dead-letter-routing-key": uid})
    assert http_publish(api, "", uid, "loop")[1] == {"routed": True}
    time.sleep(1.0)
    assert ready(ch, uid) == 0


def test_aliveness_test_publishes_and_gets_its_message_back(api, ch):
    assert api("GET", "/api/aliveness-test/%2F")[1] == {"status": "ok"}
    assert api("GET", "/api/aliveness-test/%2F")[1] == {"status": "ok"}
    assert ready(ch, "aliveness-test") == 0  # it takes back what it put in


def test_http_publish_to_a_direct_reply_to_consumer(api, node):
    conn = pika.BlockingConnection(node[0].pika_params())
    try:
        ch = conn.channel()
        got = []
        ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: got.append((m, b)), auto_ack=True)
        # Learn the key the broker gave this channel: publish a request with reply_to to a queue of our own.
        ch.queue_declare("", exclusive=True)
        own = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", own, b"req", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        deadline = time.monotonic() + 5
        request = None
        while request is None and time.monotonic() < deadline:
            request = ch.basic_get(own, auto_ack=True)[1]
        assert request is not None and request.reply_to.startswith("amq.rabbitmq.reply-to.")
        assert http_publish(api, "", request.reply_to, "answer")[1] == {"routed": True}
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert [b for _m, b in got] == [b"answer"]
        assert http_publish(api, "", "amq.rabbitmq.reply-to.nobody", "lost")[1] == {"routed": False}
    finally:
        conn.close()


@pytest.mark.leveret_only
def test_http_publish_of_a_persistent_message_is_answered_once_it_is_on_disk(tmp_path, monkeypatch):
    """RabbitMQ's plugin publishes on a confirm-mode channel and answers after basic.ack: a persistent
    message in a durable queue is on disk when the HTTP answer comes. The disk is made slow (the test hook
    delays each fsync round by 1 s), so the answer cannot come sooner than that once it waits for the
    fsync; answered at once (before this change) it came within milliseconds. Then the broker is killed
    and restarted: the messages are there."""
    from tests.integration.management.test_management_api import Http, start_mgmt_broker

    monkeypatch.setenv("LEVERET_TEST_FSYNC_DELAY_MS", "1000")
    b, mport, _ = start_mgmt_broker(tmp_path)
    try:
        http = Http(mport)
        assert http("PUT", "/api/queues/%2F/durable-http", {"durable": True})[0] in (201, 204)
        for i in range(2):
            t0 = time.monotonic()
            status, body, _ = http("POST", "/api/exchanges/%2F/amq.default/publish",
                                   {"routing_key": "durable-http", "payload": f"m{i}", "payload_encoding": "string",
                                    "properties": {"delivery_mode": 2}})
            waited = time.monotonic() - t0
            assert (status, body) == (200, {"routed": True})
            assert waited >= 0.9, f"answered after {waited:.3f} s, before the (1 s) fsync"
        b.kill9()
        monkeypatch.delenv("LEVERET_TEST_FSYNC_DELAY_MS")
        b.start()
        conn = pika.BlockingConnection(b.pika_params())
        try:
            got = []
            chan = conn.channel()
            while (m := chan.basic_get("durable-http", auto_ack=True))[0] is not None:
                got.append(m[2])
            assert got == [b"m0", b"m1"]
        finally:
            conn.close()
    finally:
        b.stop()
