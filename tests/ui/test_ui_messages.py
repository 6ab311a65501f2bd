"""Messages from the web UI: peek leaves the queue exactly as it was (same order afterwards, redelivered
false), get with requeue marks messages redelivered, purge and delete ask first (delete wants the name
typed), and a message published from the exchange page arrives with its properties and headers."""

from __future__ import annotations

import base64

import pika
import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def _fill(ch, queue: str, n: int) -> None:
    for i in range(n):
        ch.basic_publish("", queue, f"msg-{i}".encode(),
                         pika.BasicProperties(headers={"n": i}, delivery_mode=2, content_type="text/plain"))


def _ready(http, queue: str) -> int:
    return wait_for(lambda: http("GET", f"/api/queues/%2F/{q(queue)}")[1])["messages_ready"]


def _open_queue(page, base, queue: str) -> None:
    login(page, base)
    page.goto(base + f"/#/queues/%2F/{q(queue)}")
    page.wait_for_selector("#queue-facts")


def test_peek_leaves_the_queue_unchanged(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid, durable=True)
    _fill(ch, uid, 50)
    assert wait_for(lambda: _ready(http, uid) == 50)
    _open_queue(page, base, uid)
    page.fill("#peek-count", "10")
    page.click("#peek")
    page.wait_for_selector("#peek-results .message >> nth=9")
    payloads = page.locator("#peek-results pre.payload").all_inner_texts()
    assert payloads == [f"msg-{i}" for i in range(10)]
    assert page.locator("#peek-results dd[data-field=redelivered]").all_inner_texts() == ["false"] * 10
    assert "header n" in page.inner_text("#peek-results .message >> nth=3")
    shot(page, "queue-peek")
    page.click("#peek")  # again: the same first message, nothing was taken
    page.wait_for_selector("#peek-results .message >> nth=9")
    assert page.locator("#peek-results pre.payload").first.inner_text() == "msg-0"
    info = http("GET", f"/api/queues/%2F/{q(uid)}")[1]
    assert info["messages_ready"] == 50 and info["messages_unacknowledged"] == 0
    got = []
    for _ in range(50):
        method, _props, body = ch.basic_get(uid, auto_ack=True)
        assert method is not None and not method.redelivered
        got.append(body.decode())
    assert got == [f"msg-{i}" for i in range(50)]
    ch.queue_delete(uid)


def test_peek_api_bounds_and_stream_refusal(http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid, arguments={"x-max-priority": 5})
    for prio, body in ((1, b"low"), (5, b"high"), (3, b"mid")):
        ch.basic_publish("", uid, body, pika.BasicProperties(priority=prio))
    assert wait_for(lambda: _ready(http, uid) == 3)
    status, msgs, _ = http("POST", f"/api/queues/%2F/{q(uid)}/peek", {"count": 3})
    assert status == 200 and [m["payload"] for m in msgs] == ["high", "mid", "low"]
    assert http("POST", f"/api/queues/%2F/{q(uid)}/peek", {"count": 0})[0] == 400
    assert http("POST", f"/api/queues/%2F/{q(uid)}/peek", {"count": 101})[0] == 400
    status, msgs, _ = http("POST", f"/api/queues/%2F/{q(uid)}/peek", {"count": 1, "encoding": "base64"})
    assert base64.b64decode(msgs[0]["payload"]) == b"high" and msgs[0]["payload_encoding"] == "base64"
    ch.queue_declare(uid + "-s", durable=True, arguments={"x-queue-type": "stream"})
    assert http("POST", f"/api/queues/%2F/{q(uid + '-s')}/peek", {"count": 1})[0] == 405
    ch.queue_delete(uid)
    ch.queue_delete(uid + "-s")


def test_get_with_requeue_marks_messages_redelivered(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid)
    _fill(ch, uid, 3)
    assert wait_for(lambda: _ready(http, uid) == 3)
    _open_queue(page, base, uid)
    page.select_option("#get-ackmode", "ack_requeue_true")
    page.click("#get-messages")
    page.wait_for_selector("#get-results .message")
    assert page.inner_text("#get-results pre.payload") == "msg-0"
    assert _ready(http, uid) == 3
    page.click("#peek")
    page.wait_for_selector("#peek-results .message >> nth=2")
    assert page.locator("#peek-results dd[data-field=redelivered]").all_inner_texts() == ["true", "false", "false"]
    page.select_option("#get-ackmode", "ack_requeue_false")
    page.click("#get-messages")
    assert wait_for(lambda: _ready(http, uid) == 2)
    ch.queue_delete(uid)


def test_purge_asks_first_and_keeps_unacked_messages(page, base, http, amqp, uid, ui_broker) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid)
    _fill(ch, uid, 20)
    holder = pika.BlockingConnection(ui_broker[0].pika_params())
    hch = holder.channel()
    hch.basic_qos(prefetch_count=5)
    hch.basic_consume(uid, lambda *a: None)
    holder.process_data_events(time_limit=0.3)
    assert wait_for(lambda: http("GET", f"/api/queues/%2F/{q(uid)}")[1]["messages_unacknowledged"] == 5)
    _open_queue(page, base, uid)
    page.click("#purge")
    page.wait_for_selector("#confirm[open]")
    shot(page, "queue-purge-confirm")
    page.click("#confirm-cancel")
    page.wait_for_selector("#danger-result:has-text('cancelled')")
    assert _ready(http, uid) == 15
    page.click("#purge")
    page.click("#confirm-ok")
    page.wait_for_selector("#danger-result:has-text('Queue purged')")
    info = http("GET", f"/api/queues/%2F/{q(uid)}")[1]
    assert info["messages_ready"] == 0 and info["messages_unacknowledged"] == 5
    holder.close()
    ch.queue_delete(uid)


def test_delete_needs_the_name_typed(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid)
    _open_queue(page, base, uid)
    page.click("#delete-queue")
    page.fill("#confirm-typed", "not-the-name")
    page.click("#confirm-ok")
    page.wait_for_selector("#danger-result:has-text('cancelled')")
    assert http("GET", f"/api/queues/%2F/{q(uid)}")[0] == 200
    page.click("#delete-queue")
    page.fill("#confirm-typed", uid)
    page.click("#confirm-ok")
    page.wait_for_url("**/#/queues")
    page.wait_for_selector("#queues")
    assert http("GET", f"/api/queues/%2F/{q(uid)}")[0] == 404


def test_publish_from_the_exchange_page_with_properties_and_headers(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.exchange_declare(uid, "topic")
    ch.queue_declare(uid)
    ch.queue_bind(uid, uid, "a.*")
    login(page, base)
    page.goto(base + f"/#/exchanges/%2F/{q(uid)}")
    page.wait_for_selector(f"#bindings-source a:has-text('{uid}')")
    page.fill("#publish-routing-key", "a.b")
    page.select_option("#publish-delivery-mode", "2")
    page.fill("#publish-prop-content_type", "application/json")
    page.fill("#publish-prop-correlation_id", "corr-7")
    page.fill("#publish-headers", "tenant = acme\nattempt = 3\nurgent = true")
    page.fill("#publish-payload", '{"hello": "world"}')
    page.click("#publish")
    page.wait_for_selector("#publish-result:has-text('published and routed')")
    shot(page, "exchange-publish")
    method, props, body = ch.basic_get(uid, auto_ack=True)
    assert method is not None and body == b'{"hello": "world"}'
    assert props.content_type == "application/json" and props.correlation_id == "corr-7"
    assert props.delivery_mode == 2
    assert props.headers == {"tenant": "acme", "attempt": 3, "urgent": True}
    page.fill("#publish-routing-key", "nowhere")
    page.select_option("#publish-encoding", "base64")
    page.fill("#publish-payload", base64.b64encode(b"\x00\x01bin").decode())
    page.click("#publish")
    page.wait_for_selector("#publish-result:has-text('not routed')")
    page.fill("#publish-routing-key", "a.c")
    page.click("#publish")
    page.wait_for_selector("#publish-result:has-text('published and routed')")
    method, props, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"\x00\x01bin"
    ch.queue_delete(uid)
    ch.exchange_delete(uid)


def test_move_messages_to_another_queue_keeps_order_and_properties(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid + "-dlq", durable=True)
    ch.queue_declare(uid + "-work", durable=True)
    ch.queue_declare(uid + "-capped", arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    _fill(ch, uid + "-dlq", 250)
    assert wait_for(lambda: _ready(http, uid + "-dlq") == 250)
    _open_queue(page, base, uid + "-dlq")
    page.fill("#move-destination", uid + "-work")
    page.fill("#move-count", "200")
    page.click("#move")
    page.wait_for_selector("#move-result:has-text('Moved 200 message(s)')")
    assert _ready(http, uid + "-dlq") == 50 and _ready(http, uid + "-work") == 200
    got = [ch.basic_get(uid + "-work", auto_ack=True) for _ in range(200)]
    assert [body.decode() for _m, _p, body in got] == [f"msg-{i}" for i in range(200)]
    assert all(p.headers == {"n": i} and p.content_type == "text/plain" and p.delivery_mode == 2
               for i, (_m, p, _b) in enumerate(got))
    # A destination that refuses (full, reject-publish): what it took moved, the rest stays, in order.
    page.fill("#move-destination", uid + "-capped")
    page.fill("#move-count", "10")
    page.click("#move")
    page.wait_for_selector("#move-result:has-text('Moved 3 message(s)')")
    assert "Stopped" in page.inner_text("#move-result")
    assert _ready(http, uid + "-capped") == 3 and _ready(http, uid + "-dlq") == 47
    _method, _props, body = ch.basic_get(uid + "-dlq", auto_ack=True)
    assert body == b"msg-203"
    page.expected_console_errors.append("404")
    page.fill("#move-destination", uid + "-nowhere")
    page.click("#move")
    page.wait_for_selector("#move-result:has-text('Move failed')")
    for name in ("-dlq", "-work", "-capped"):
        ch.queue_delete(uid + name)
