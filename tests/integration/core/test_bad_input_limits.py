"""Input that is well-formed on the wire but that the broker must refuse, or must still be able to handle
later (issue 9): headers nested past the limit, queue and exchange arguments that are not UTF-8, and a
handshake left unfinished.

* **Nested headers.** Leveret decodes headers where it needs them (headers exchange, dead-lettering, the HTTP
  API) with a limit of 100 levels of tables/arrays inside the headers table (``MAX_TABLE_DEPTH`` in
  protocol/properties.py), the same limit as for method arguments. A deeper message used to be confirmed and
  then broke all three (headers exchange: 501 to the publisher; dead-lettering: dropped; HTTP get: 500), so it
  is refused at publish with ``406 PRECONDITION_FAILED``, a channel error, as RabbitMQ refuses other messages
  it will not take (too large, bad expiration, wrong user-id). RabbitMQ itself has no nesting limit, so the
  refusal is Leveret-only; the 100-level message is accepted by both.
* **Properties that publish does not read.** Publish decodes only what it acts on, so a message whose headers
  pamqp could not decode (a 'U' value, a key or timestamp it refuses, a malformed table) or whose property list
  is cut is accepted. Dead-lettering it used to close the *rejecting consumer's* connection with 501, and an
  HTTP get answered 500 and left it taken for good; both now cope (what cannot be read is dropped or left out).
* **Arguments that are not UTF-8.** pamqp hands a long string that is not UTF-8 over as ``bytes``; an argument
  the broker uses as a name or a mode (``x-dead-letter-exchange``, ``x-dead-letter-routing-key``,
  ``x-queue-type``, ``x-overflow``, ``x-queue-mode``, ``alternate-exchange``, ``x-match``) used to fail with
  541 INTERNAL_ERROR (a connection error). It is ``406 PRECONDITION_FAILED`` on the channel, like any other
  invalid argument, and the connection goes on.
* **Handshake timeout.** ``handshake_timeout`` (RabbitMQ's key and default, 10 s; 1 s here) runs from the
  first byte until connection.open-ok, whatever heartbeat the client asked for in tune-ok.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import urllib.error
import urllib.request

import pika
import pytest
from amqp_helpers import wait_ready
from rawamqp import FRAME_BODY, FRAME_HEADER, RawAMQPClient, commands, method_frame, raw_frame

from tests.conftest import EXTERNAL_URL, BrokerProcess, free_port

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange
pytestmark = pytest.mark.timeout(60)

LIMIT = 100  # protocol.properties.MAX_TABLE_DEPTH
HANDSHAKE_TIMEOUT = 1.0  # seconds, set on the broker of this module


# -- helpers ----------------------------------------------------------------------------------------------


def nested(levels: int, kind: str = "table") -> object:
    """A header value that is ``levels`` tables (or arrays, or both in turn) deep around a string."""
    value: object = "leaf"
    for i in range(levels):
        if kind == "table" or (kind == "mixed" and i % 2 == 0):
            value = {"n": value}
        else:
            value = [value]
    return value


def depth(value: object) -> int:
    """How many tables/arrays deep ``value`` is, as decoded by a client or by JSON."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((depth(v) for v in value), default=0)
    return 0




def opened(raw, channel: int = 1) -> RawAMQPClient:
    c = raw()
    c.handshake(heartbeat=0)
    c.open_channel(channel)
    return c


def get_body(c: RawAMQPClient, channel: int, queue: str) -> bytes | None:
    """basic.get (no-ack) on the raw client: the body, or None for get-empty."""
    c.send_method(channel, commands.Basic.Get(queue=queue, no_ack=True))
    f = c.wait_for(lambda f: f.is_method(commands.Basic.GetOk, channel)
                   or f.is_method(commands.Basic.GetEmpty, channel))
    if f.is_method(commands.Basic.GetEmpty):
        return None
    c.wait_for(lambda f: f.channel == channel)  # content header
    return c.wait_for(lambda f: f.channel == channel).payload


class Http:
    """The HTTP API of the module's broker, with basic auth as guest."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def __call__(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        req = urllib.request.Request(
            self.base + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, text = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory):
    """A Leveret of this module's own: HTTP API on, handshake_timeout of 1 s. Yields (broker, Http)."""
    if EXTERNAL_URL:
        pytest.skip("needs a Leveret process of its own")
    tmp = tmp_path_factory.mktemp("limits")
    mport = free_port()
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log",
                      extra_args=["--management-port", str(mport), "--prometheus-port", "0",
                                  "--set", f"handshake_timeout={int(HANDSHAKE_TIMEOUT * 1000)}"])
    b.start()
    http = Http(mport)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the HTTP listener starts just after the AMQP one
        try:
            if http("GET", "/api/overview")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.05)
    try:
        yield b, http
    finally:
        b.stop()


# -- headers nested past the limit ---------------------------------------------------------------------


@pytest.mark.leveret_only
@pytest.mark.parametrize("exchange", ["", "amq.headers"], ids=["default-exchange", "headers-exchange"])
@pytest.mark.parametrize("kind", ["table", "array", "mixed"])
def test_headers_nested_past_the_limit_close_the_channel(raw, broker, kind, exchange):
    c = opened(raw)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    q = c.expect_method(commands.Queue.DeclareOk, 1).queue
    if exchange:
        c.send_method(1, commands.Queue.Bind(queue=q, exchange=exchange, arguments={"x-match": "any", "to": q}))
        c.expect_method(commands.Queue.BindOk, 1)
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk, 1)

    headers = {"to": q, "deep": nested(LIMIT + 1, kind)}
    c.publish(1, b"too deep", exchange=exchange, routing_key=q,
              properties=commands.Basic.Properties(headers=headers))
    code, text, class_id, method_id = c.expect_channel_close(1)
    assert code == 406, text
    assert text.startswith("PRECONDITION_FAILED") and str(LIMIT) in text, text
    assert (class_id, method_id) == (60, 40)
    assert not any(f.is_method(commands.Basic.Ack) for f in c.received), "the refused message was confirmed"

    # The connection goes on: another channel publishes the same message one level shallower, and the queue
    # holds that one only.
    c.open_channel(2)
    c.publish(2, b"deep enough", exchange=exchange, routing_key=q,
              properties=commands.Basic.Properties(headers={"to": q, "deep": nested(LIMIT, kind)}))
    assert get_body(c, 2, q) == b"deep enough"
    assert get_body(c, 2, q) is None
    c.close_connection()


@pytest.mark.parametrize("kind", ["table", "array"])
def test_headers_nested_to_the_limit_are_routed_and_dead_lettered(conn, make_queue, make_exchange, kind):
    hx = make_exchange("hx", "headers")
    dlx = make_exchange("dlx", "fanout")
    dlq = make_queue("dlq")
    q = make_queue("q", {"x-dead-letter-exchange": dlx})
    ch = conn.channel()
    ch.queue_bind(dlq, dlx)
    ch.queue_bind(q, hx, arguments={"x-match": "all", "route": "yes"})
    ch.confirm_delivery()
    deep = nested(LIMIT, kind)
    ch.basic_publish(hx, "", b"deep", pika.BasicProperties(headers={"route": "yes", "deep": deep}),
                     mandatory=True)  # raises if unroutable or nacked

    method, props, body = ch.basic_get(q, auto_ack=False)
    assert body == b"deep"
    assert props.headers["deep"] == deep and depth(props.headers["deep"]) == LIMIT
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert wait_ready(conn, dlq, 1) == 1
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"deep"
    assert props.headers["deep"] == deep
    assert props.headers["x-death"][0]["reason"] == "rejected"
    assert props.headers["x-death"][0]["queue"] == q


@pytest.mark.leveret_only
def test_headers_nested_to_the_limit_are_shown_over_http(own_broker, uid):
    b, http = own_broker
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        q, dlq = f"{uid}-q", f"{uid}-dlq"
        ch.queue_declare(dlq)
        ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
        ch.confirm_delivery()
        deep = nested(LIMIT, "mixed")
        ch.basic_publish("", q, b"deep", pika.BasicProperties(headers={"deep": deep}), mandatory=True)

        path = f"/api/queues/%2F/{q}/get"
        status, got = http("POST", path, {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        assert status == 200, got
        assert got[0]["payload"] == "deep"
        assert got[0]["properties"]["headers"]["deep"] == deep

        method, _props, _body = ch.basic_get(q, auto_ack=False)
        ch.basic_reject(method.delivery_tag, requeue=False)
        assert wait_ready(conn, dlq, 1) == 1
        status, got = http("POST", f"/api/queues/%2F/{dlq}/get",
                           {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        assert status == 200, got
        headers = got[0]["properties"]["headers"]
        assert headers["deep"] == deep and depth(headers["deep"]) == LIMIT
        assert headers["x-death"][0]["reason"] == "rejected"
        ch.queue_delete(q)
        ch.queue_delete(dlq)
    finally:
        if conn.is_open:
            conn.close()


# -- properties publish does not read, read later -------------------------------------------------------
#
# Publish reads only the properties it acts on (docs/decisions/hot-path-messages.md), so these messages are accepted; what reads them
# later (dead-lettering, the HTTP API) must not fail on them: a reject that dead-letters one used to close the
# rejecting consumer's connection with 501, and an HTTP get answered 500 and left the message taken for good.

def _table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def _entry(key: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + value


_HEADERS = struct.pack(">H", 1 << 13)
UNDECODABLE = {  # flags + property list
    "header-of-type-U": _HEADERS + _table(_entry(b"u", b"U\x00\x07")),
    "header-key-not-utf8": _HEADERS + _table(_entry(b"\xff\xfe", b"t\x01")),
    "header-timestamp-beyond-datetime": _HEADERS + _table(_entry(b"ts", b"T" + b"\xff" * 8)),
    "headers-table-malformed": _HEADERS + _table(_entry(b"k", b"?\x00\x00")),
    "content-type-not-utf8": struct.pack(">H", 1 << 15) + b"\x02\xff\xfe",
    "property-list-cut": struct.pack(">H", 1 << 15),
}


def _publish_with_properties(c: RawAMQPClient, channel: int, queue: str, props_raw: bytes, body: bytes) -> None:
    header = struct.pack(">HHQ", 60, 0, len(body)) + props_raw
    c.send_raw(method_frame(channel, commands.Basic.Publish(exchange="", routing_key=queue))
               + raw_frame(FRAME_HEADER, channel, header) + raw_frame(FRAME_BODY, channel, body))


@pytest.mark.leveret_only
@pytest.mark.parametrize("case", list(UNDECODABLE))
def test_undecodable_properties_are_dead_lettered_without_closing_the_consumer(raw, uid, case):
    c = opened(raw)
    q, dlq = f"{uid}-q", f"{uid}-dlq"
    c.send_method(1, commands.Queue.Declare(queue=dlq, exclusive=True))
    c.expect_method(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Queue.Declare(queue=q, exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}))
    c.expect_method(commands.Queue.DeclareOk, 1)
    _publish_with_properties(c, 1, q, UNDECODABLE[case], b"body")

    c.send_method(1, commands.Basic.Get(queue=q))
    tag = c.expect_method(commands.Basic.GetOk, 1).delivery_tag
    c.wait_for(lambda f: f.type == FRAME_HEADER)
    assert c.wait_for(lambda f: f.type == FRAME_BODY).payload == b"body"
    c.send_method(1, commands.Basic.Reject(delivery_tag=tag, requeue=False))
    closes = [f for f in c.drain(0.3) if getattr(f, "type", None) == 1
              and (f.is_method(commands.Connection.Close) or f.is_method(commands.Channel.Close))]
    assert not closes, f"rejecting closed {closes[0].value!r}"

    c.send_method(1, commands.Basic.Get(queue=dlq, no_ack=True))
    c.expect_method(commands.Basic.GetOk, 1)
    header = c.wait_for(lambda f: f.type == FRAME_HEADER).payload
    assert c.wait_for(lambda f: f.type == FRAME_BODY).payload == b"body"
    assert b"x-death" in header and b"rejected" in header
    if case.startswith("header-"):  # a table that is well-formed is kept, entry for entry
        assert UNDECODABLE[case][6:] in header
    c.close_connection()


@pytest.mark.leveret_only
@pytest.mark.parametrize("case", list(UNDECODABLE))
def test_undecodable_properties_are_shown_over_http(own_broker, uid, case):
    b, http = own_broker
    with RawAMQPClient(b.host, b.port, timeout=5) as c:
        c.handshake(heartbeat=0)
        c.open_channel(1)
        c.send_method(1, commands.Queue.Declare(queue=uid))
        c.expect_method(commands.Queue.DeclareOk, 1)
        _publish_with_properties(c, 1, uid, UNDECODABLE[case], b"body")

        status, got = http("POST", f"/api/queues/%2F/{uid}/get",
                           {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        assert status == 200, got
        assert got[0]["payload"] == "body"
        assert isinstance(got[0]["properties"], dict)
        # ack_requeue_true: the message is back in the queue, not left taken.
        c.send_method(1, commands.Queue.Declare(queue=uid, passive=True))
        assert c.expect_method(commands.Queue.DeclareOk, 1).message_count == 1
        c.send_method(1, commands.Queue.Delete(queue=uid))
        c.expect_method(commands.Queue.DeleteOk, 1)
        c.close_connection()


# -- arguments that are not UTF-8 ------------------------------------------------------------------------

BAD_UTF8 = b"x-\xc3\x28\xff"  # a cut two-byte sequence, then a byte that never occurs in UTF-8
PLACEHOLDER = "@@@@@"  # as many bytes as BAD_UTF8, replaced in the encoded frame


def _bad_argument_frame(channel: int, method: object) -> bytes:
    frame = method_frame(channel, method)
    assert frame.count(PLACEHOLDER.encode()) == 1 and len(PLACEHOLDER.encode()) == len(BAD_UTF8)
    return frame.replace(PLACEHOLDER.encode(), BAD_UTF8)


BAD_ARGUMENTS = {
    "queue-x-dead-letter-exchange": (
        lambda n: commands.Queue.Declare(queue=n, arguments={"x-dead-letter-exchange": PLACEHOLDER}), (50, 10)),
    "durable-queue-x-dead-letter-exchange": (
        lambda n: commands.Queue.Declare(queue=n, durable=True,
                                         arguments={"x-dead-letter-exchange": PLACEHOLDER}), (50, 10)),
    "queue-x-dead-letter-routing-key": (
        lambda n: commands.Queue.Declare(queue=n, arguments={"x-dead-letter-exchange": "",
                                                             "x-dead-letter-routing-key": PLACEHOLDER}),
        (50, 10)),
    "queue-x-queue-type": (
        lambda n: commands.Queue.Declare(queue=n, durable=True, arguments={"x-queue-type": PLACEHOLDER}),
        (50, 10)),
    "queue-x-overflow": (
        lambda n: commands.Queue.Declare(queue=n, arguments={"x-overflow": PLACEHOLDER}), (50, 10)),
    "queue-x-queue-mode": (
        lambda n: commands.Queue.Declare(queue=n, arguments={"x-queue-mode": PLACEHOLDER}), (50, 10)),
    "durable-exchange-alternate-exchange": (
        lambda n: commands.Exchange.Declare(exchange=n, exchange_type="fanout", durable=True,
                                            arguments={"alternate-exchange": PLACEHOLDER}), (40, 10)),
    "binding-x-match": (
        lambda n: commands.Queue.Bind(queue=n, exchange="amq.headers", arguments={"x-match": PLACEHOLDER}),
        (50, 20)),
    "consume-x-priority": (
        lambda n: commands.Basic.Consume(queue=n, arguments={"x-priority": PLACEHOLDER}), (60, 20)),
}


@pytest.mark.leveret_only
@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_argument_not_utf8_is_precondition_failed(raw, broker, uid, case):
    make_method, ids = BAD_ARGUMENTS[case]
    name = f"{uid}-{case}"
    c = opened(raw)
    if ids[0] in (50, 60) and ids != (50, 10):  # bind and consume need the queue
        c.send_method(1, commands.Queue.Declare(queue=name, exclusive=True))
        c.expect_method(commands.Queue.DeclareOk, 1)
    c.send_raw(_bad_argument_frame(1, make_method(name)))
    code, text, class_id, method_id = c.expect_channel_close(1)
    assert code == 406, text
    assert text.startswith("PRECONDITION_FAILED"), text
    assert (class_id, method_id) == ids

    # The connection goes on; a declare that was refused created nothing.
    c.open_channel(2)
    if ids == (50, 10):
        c.send_method(2, commands.Queue.Declare(queue=name, passive=True))
        assert c.expect_channel_close(2).reply_code == 404
    elif ids == (40, 10):
        c.send_method(2, commands.Exchange.Declare(exchange=name, passive=True))
        assert c.expect_channel_close(2).reply_code == 404
    c.open_channel(3)
    c.send_method(3, commands.Queue.Declare(queue="", exclusive=True))
    c.expect_method(commands.Queue.DeclareOk, 3)
    c.close_connection()


# -- handshake timeout ------------------------------------------------------------------------------------

def _stop_after(c: RawAMQPClient, stage: str) -> None:
    """Go through the handshake up to ``stage`` and stop there."""
    c.send_protocol_header()
    c.expect_method(commands.Connection.Start, 0)
    if stage == "start":
        return
    c.send_method(0, commands.Connection.StartOk(mechanism="PLAIN", response=f"\0{c.user}\0{c.password}",
                                                 locale="en_US"))
    tune = c.expect_method(commands.Connection.Tune, 0)
    if stage == "tune":
        return
    heartbeat = {"tune-ok-heartbeat-0": 0, "tune-ok-heartbeat-65535": 65535}[stage]
    c.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                heartbeat=heartbeat))


@pytest.mark.leveret_only
@pytest.mark.parametrize("stage", ["nothing", "start", "tune", "tune-ok-heartbeat-0", "tune-ok-heartbeat-65535"])
def test_unfinished_handshake_is_closed_after_the_handshake_timeout(own_broker, stage):
    b, _http = own_broker
    logged = b.log_text().count("handshake timeout")
    t0 = time.monotonic()
    c = RawAMQPClient(b.host, b.port, timeout=5)
    try:
        if stage != "nothing":
            _stop_after(c, stage)
        waited = c.wait_closed(HANDSHAKE_TIMEOUT + 4)
        assert waited is not None, f"socket still open {HANDSHAKE_TIMEOUT + 4:.0f} s after stopping at {stage}"
        elapsed = time.monotonic() - t0
        assert elapsed >= HANDSHAKE_TIMEOUT * 0.9, f"closed after {elapsed:.2f} s, before the timeout"
    finally:
        c.close()
    deadline = time.monotonic() + 2
    while b.log_text().count("handshake timeout") == logged and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.log_text().count("handshake timeout") == logged + 1, "the close was not the handshake timeout's"


@pytest.mark.leveret_only
def test_connection_opened_in_time_outlives_the_handshake_timeout(own_broker):
    b, _http = own_broker
    c = RawAMQPClient(b.host, b.port, timeout=5)
    try:
        c.handshake(heartbeat=65535)
        time.sleep(HANDSHAKE_TIMEOUT * 1.5)
        c.open_channel(1)
        c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        c.expect_method(commands.Queue.DeclareOk, 1)
        c.close_connection()
    finally:
        c.close()
