"""The firehose (broker/observability/trace.py) on a VHost built directly, with a ManualClock: the trace exchange, what a
publish, an ack and a dead-lettering put on ``amq.rabbitmq.trace`` (routing keys, header names and field
types), the message identity, no recursion, tracing off publishing nothing, and a failing tracer never
failing the publish it traces. Deliveries need a channel: tests/integration/management/test_trace.py covers them."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.errors import AMQPError
from broker.message import Message
from broker.observability import trace
from broker.observability.counters import GlobalCounters
from broker.publish import ROUTED
from broker.queues.queue_process import QueueProcess
from broker.vhost import VHost
from protocol.constants import ACCESS_REFUSED
from protocol.fastcodec import build_content_header, shortstr
from protocol.properties import field_table_entries

START_MS = 1_700_000_000_000.0


def message(exchange: str, key: str, body: bytes = b"m", extra_keys: list[str] | None = None,
            **props: Any) -> Message:
    header = build_content_header(len(body), spec.Basic.Properties(**props).marshal())
    msg = Message(exchange, key, shortstr(exchange) + shortstr(key), header, body)
    msg.extra_keys = extra_keys
    return msg


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_MS)


@pytest.fixture
def vh(clock: ManualClock) -> VHost:
    return VHost("/", counters=GlobalCounters(), clock=clock)


def declare(vh: VHost, name: str, **arguments: Any) -> QueueProcess:
    return vh.queues.declare(name, False, False, False, False, arguments, None)[0]  # type: ignore[arg-type]


@pytest.fixture
def sink(vh: VHost) -> QueueProcess:
    q = declare(vh, "sink")
    vh.bind(trace.TRACE_EXCHANGE, "sink", "queue", "#", {})
    return q


def drain(q: QueueProcess) -> list[Message]:
    out = []
    while (got := q.basic_get(True)) is not None:
        out.append(got[1])
    return out


def header_types(msg: Message) -> dict[bytes, int]:
    """Each header's field type octet, as written."""
    start, end = msg.props.headers_span or (0, 0)
    return {key: msg.header[s + 1 + len(key)] for key, s, _e in field_table_entries(msg.header, start, end)}


def test_the_trace_exchange_is_a_durable_internal_topic_exchange_in_every_vhost(vh: VHost) -> None:
    ex = vh.exchanges[trace.TRACE_EXCHANGE]
    assert (ex.type_name, ex.durable, ex.internal, ex.auto_delete) == ("topic", True, True, False)
    with pytest.raises(AMQPError) as err:
        vh.check_publishable(trace.TRACE_EXCHANGE)
    assert err.value.reply_code == ACCESS_REFUSED
    with pytest.raises(AMQPError) as err:
        vh.delete_exchange(trace.TRACE_EXCHANGE, False)
    assert err.value.reply_code == ACCESS_REFUSED


def test_tracing_off_publishes_nothing(vh: VHost, sink: QueueProcess) -> None:
    declare(vh, "q")
    assert vh.tracing is None
    assert vh.publish(vh.default_exchange, message("", "q"), False) & ROUTED
    assert drain(sink) == []


def test_a_publish_event_has_rabbitmqs_routing_key_and_headers(vh: VHost, sink: QueueProcess,
                                                               clock: ManualClock) -> None:
    declare(vh, "q")
    trace.start(vh, "leveret@test")
    msg = message("", "q", b"hello", extra_keys=["q2"], message_id="m1", content_type="text/plain",
                  delivery_mode=2, priority=3,
                  timestamp=datetime.datetime.fromtimestamp(123, datetime.UTC), message_type="t",
                  headers={"h": 1})
    vh.publish(vh.default_exchange, msg, True)
    (event,) = drain(sink)
    assert (event.exchange, event.routing_key, event.body) == (trace.TRACE_EXCHANGE, "publish.", b"hello")
    h = event.headers
    assert h["exchange_name"] == ""
    assert h["routing_keys"] == ["q", "q2"]
    assert h["node"] == "leveret@test"
    assert h["vhost"] == "/"
    assert h["routed_queues"] == ["q"]
    assert "cluster_id" not in h["properties"]  # only the properties the message has, as RabbitMQ lists them
    assert h["properties"] == {"content_type": "text/plain", "headers": {"h": 1}, "delivery_mode": 2,
                               "priority": 3, "message_id": "m1", "timestamp": 123, "type": "t"}
    assert h[trace.EVENT_TIME] == int(START_MS)
    assert h[trace.MESSAGE_ID] == "m1"
    assert "connection" not in h and "user" not in h  # not a channel's publish
    types = header_types(event)
    assert types[b"routing_keys"] == ord("A") and types[b"properties"] == ord("F")
    assert types[trace.EVENT_TIME.encode()] == ord("l")
    # the copy is transient and carries nothing but its headers
    assert event.header[12:14] == b"\x20\x00"  # property flags: headers only


def test_a_message_without_message_id_gets_a_broker_assigned_identity(vh: VHost, sink: QueueProcess) -> None:
    q = declare(vh, "q")
    trace.start(vh, "n")
    vh.publish(vh.default_exchange, message("", "q"), False)
    vh.publish(vh.default_exchange, message("", "q"), False)
    events = drain(sink)
    ids = [e.headers[trace.MESSAGE_ID] for e in events]
    assert len(set(ids)) == 2
    stored = [m.headers[trace.TRACE_ID] for m in drain(q)]  # the message itself carries it (consumers see it)
    assert stored == ids


def test_ack_and_deadletter_events(vh: VHost, sink: QueueProcess, clock: ManualClock) -> None:
    q = declare(vh, "q")
    trace.start(vh, "n")
    for mid in ("a", "b"):
        vh.publish(vh.default_exchange, message("", "q", b"body-" + mid.encode(), message_id=mid), False)
    drain(sink)
    seq_a = q.basic_get(False)
    seq_b = q.basic_get(False)
    assert seq_a is not None and seq_b is not None
    clock.advance(1.5)
    q.ack([seq_a[0]])
    q.reject_discard([seq_b[0]])
    ack, dead = drain(sink)
    assert (ack.routing_key, ack.body) == ("ack.q", b"")
    assert ack.headers[trace.MESSAGE_ID] == "a"
    assert ack.headers[trace.EVENT_TIME] == int(START_MS) + 1500
    assert (dead.routing_key, dead.body) == ("deadletter.q", b"body-b")
    assert dead.headers["reason"] == "rejected"
    assert "dead_letter_exchange" not in dead.headers  # no DLX: dropped, the event still says it died


def test_a_dead_letter_to_a_dlx_is_an_event_not_a_publish(vh: VHost, sink: QueueProcess) -> None:
    vh.declare_exchange("dlx", "fanout", False, False, False, False, {})
    declare(vh, "dlq")
    vh.bind("dlx", "dlq", "queue", "", {})
    q = declare(vh, "q", **{"x-dead-letter-exchange": "dlx"})
    trace.start(vh, "n")
    vh.publish(vh.default_exchange, message("", "q", message_id="x"), False)
    got = q.basic_get(False)
    assert got is not None
    q.reject_discard([got[0]])
    keys = [(e.routing_key, e.headers.get("dead_letter_exchange")) for e in drain(sink)]
    assert keys == [("publish.", None), ("deadletter.q", "dlx")]


def test_trace_messages_are_not_traced(vh: VHost, sink: QueueProcess) -> None:
    declare(vh, "q")
    trace.start(vh, "n")
    vh.publish(vh.default_exchange, message("", "q"), False)
    got = sink.basic_get(False)
    assert got is not None
    sink.ack([got[0]])  # acking a trace copy is not an event either
    assert drain(sink) == []


def test_trace_off_stops_and_on_twice_is_one_tracer(vh: VHost, sink: QueueProcess) -> None:
    declare(vh, "q")
    trace.start(vh, "n")
    tracer = vh.tracing
    trace.start(vh, "n")
    assert vh.tracing is tracer
    trace.stop(vh)
    assert vh.tracing is None
    vh.publish(vh.default_exchange, message("", "q"), False)
    assert drain(sink) == []


def test_a_failing_tracer_never_fails_the_publish(vh: VHost, sink: QueueProcess,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    q = declare(vh, "q")
    trace.start(vh, "n")

    def broken(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(trace.Tracer, "_emit", broken)
    assert vh.publish(vh.default_exchange, message("", "q", message_id="m"), False) & ROUTED
    got = q.basic_get(False)
    assert got is not None
    q.ack([got[0]])
    assert q.message_count() == 0
    assert drain(sink) == []


def test_a_messages_own_fields_are_what_its_decoded_properties_give() -> None:
    """message_fields reads the raw property list in one walk; it must write what decoding every property
    and encoding it again as RabbitMQ's trace does gives (each property by RabbitMQ's name, integers as
    signedint, strings as long strings, the headers table as it came) and find the same identity. (The
    decode-and-encode it replaced also wrote an empty cluster_id for every message without one: pamqp's
    default value; RabbitMQ lists only the properties a message has. Timestamps past 2038 are left out of the
    comparison: pamqp reads a value that large as milliseconds, the raw walk writes the seconds sent.)"""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from protocol.properties import decode_properties, scan_properties

    names = {"message_type": "type"}
    order = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
             "reply_to", "expiration", "message_id", "timestamp", "message_type", "user_id", "app_id", "cluster_id")

    def entry(key: str, raw: bytes) -> bytes:
        return shortstr(key) + raw

    def reference(header: bytes) -> tuple[bytes, bytes | None]:
        props = decode_properties(header, skip_headers=True)
        span = scan_properties(header).headers_span
        entries = []
        for name in order:
            if name == "headers":
                if span is not None:
                    entries.append(entry(name, b"F" + header[span[0]:span[1]]))
                continue
            value = getattr(props, name)
            if value is None or (name == "cluster_id" and not header[13] & 1 << 2):  # pamqp's default: ""
                continue
            if name == "timestamp" and isinstance(value, datetime.datetime):
                value = int(value.timestamp())
            raw = trace._signedint(value) if isinstance(value, int) else trace._longstr(value)
            entries.append(entry(names.get(name, name), raw))
        identity = props.message_id
        if identity is None and span is not None:
            stamped = decode_properties(header).headers.get(trace.TRACE_ID)
            identity = stamped if isinstance(stamped, (str, bytes)) else None
        body = b"".join(entries)
        own = identity.encode() if isinstance(identity, str) else identity
        return shortstr("properties") + b"F" + len(body).to_bytes(4, "big") + body, own

    text = st.text(max_size=12)
    header_values = st.one_of(st.integers(-5, 5), text, st.booleans())
    strategy = st.fixed_dictionaries({}, optional={
        "content_type": text, "content_encoding": text, "delivery_mode": st.integers(1, 2),
        "priority": st.integers(0, 255), "correlation_id": text, "reply_to": text, "expiration": st.just("60000"),
        "message_id": text, "timestamp": st.datetimes(min_value=datetime.datetime(1971, 1, 1),
                                  max_value=datetime.datetime(2038, 1, 1)).map(
            lambda d: d.replace(tzinfo=datetime.UTC)),
        "message_type": text, "user_id": text, "app_id": text,
        "headers": st.dictionaries(st.sampled_from(["a", "bb", trace.TRACE_ID]), header_values, max_size=3)})

    @settings(max_examples=300, deadline=None)
    @given(strategy)
    def check(props: dict[str, Any]) -> None:
        header = build_content_header(3, spec.Basic.Properties(**props).marshal())
        properties, identity = trace.message_fields(header)
        expected_properties, expected_identity = reference(header)
        assert properties == expected_properties
        if expected_identity is None:
            assert identity == b""
        else:
            assert identity == shortstr(trace.MESSAGE_ID) + trace._longstr(expected_identity)

    check()


def test_the_three_events_of_a_message_carry_the_same_fields_and_its_own_time(vh: VHost, sink: QueueProcess,
                                                                              clock: ManualClock) -> None:
    """The message's part of an event is built once per content header and reused: every event still has its
    own time, and a message whose header differs (another id) gets its own fields."""
    q = declare(vh, "q")
    trace.start(vh, "n")
    for mid in ("one", "two"):
        vh.publish(vh.default_exchange, message("", "q", message_id=mid, app_id=mid), False)
        clock.advance(1)
    got = [q.basic_get(False) for _ in range(2)]
    clock.advance(1)
    q.ack([g[0] for g in got if g is not None])
    events = drain(sink)
    assert [(e.routing_key, e.headers[trace.MESSAGE_ID], e.headers["properties"]["app_id"]) for e in events] == [
        ("publish.", "one", "one"), ("publish.", "two", "two"), ("ack.q", "one", "one"), ("ack.q", "two", "two")]
    assert [e.headers[trace.EVENT_TIME] for e in events] == [int(START_MS), int(START_MS) + 1000,
                                                             int(START_MS) + 3000, int(START_MS) + 3000]


def test_a_message_with_a_malformed_headers_table_is_not_stamped(vh: VHost, sink: QueueProcess) -> None:
    """Tracing never changes a message it cannot read: the table is left as it came (no trace id appended after
    the cut entry), and the publish is routed."""
    import struct

    q = declare(vh, "q")
    trace.start(vh, "n")
    table = b"\x05ab"  # an entry cut inside its key
    header = build_content_header(1, b"\x20\x00" + struct.pack(">I", len(table)) + table)
    msg = Message("", "q", shortstr("") + shortstr("q"), header, b"m")
    assert vh.publish(vh.default_exchange, msg, False) & ROUTED
    got = q.basic_get(True)
    assert got is not None and got[1].header == header


def test_large_headers_are_not_kept_by_the_tracer(vh: VHost, sink: QueueProcess) -> None:
    """The tracer's per-header cache holds small headers only: a client's large ones are rebuilt per event."""
    declare(vh, "q")
    trace.start(vh, "n")
    vh.publish(vh.default_exchange, message("", "q", message_id="big", headers={"pad": "x" * 5000}), False)
    vh.publish(vh.default_exchange, message("", "q", message_id="small"), False)
    tracer = vh.tracing
    assert tracer is not None
    assert [len(h) < 2048 for h in tracer._fields] == [True]
    assert [e.headers[trace.MESSAGE_ID] for e in drain(sink)] == ["big", "small"]


def test_a_turns_events_are_published_together_at_its_end_in_order(vh: VHost) -> None:
    """With a ``defer`` (the loop's call_soon in the broker), the copies of one turn wait for its end and go
    out in the order they were made, into a trace stream in one append; the next turn schedules a flush again."""
    from broker.queues.stream_queue import StreamQueue

    stream, _ = vh.queues.declare("trace-stream", False, True, False, False, {"x-queue-type": "stream"}, None)
    assert isinstance(stream, StreamQueue)
    vh.bind(trace.TRACE_EXCHANGE, "trace-stream", "queue", "#", {})
    appends: list[int] = []
    append_run = stream.log.append_run

    def counted_append_run(payloads: list[bytes], *args: Any) -> int:
        appends.append(len(payloads))
        return append_run(payloads, *args)

    stream.log.append_run = counted_append_run  # type: ignore[method-assign]
    deferred: list[Any] = []
    trace.start(vh, "n", deferred.append)
    declare(vh, "q")
    for body in (b"first", b"second", b"third"):
        vh.publish(vh.default_exchange, message("", "q", body), False)
    assert stream.log.next_offset == 0  # nothing before the turn ends
    assert len(deferred) == 1  # one flush scheduled for the turn
    deferred.pop()()
    records = stream.log.read(0, 10)
    assert [r.payload.endswith(b) for r, b in zip(records, (b"first", b"second", b"third"), strict=True)] == \
        [True] * 3
    assert appends == [3]  # the stream took the turn's three events in one append
    vh.publish(vh.default_exchange, message("", "q", b"fourth"), False)
    assert len(deferred) == 1
    deferred.pop()()
    assert stream.log.next_offset == 4 and stream.log.read(3, 1)[0].payload.endswith(b"fourth")


def test_an_event_that_fails_is_dropped_alone(vh: VHost, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A turn's events go out together, but a failure costs only the run that failed: events routed elsewhere
    after a run whose hand-over raises are still published, and the failures are logged once."""
    from broker.queues import delegate

    declare(vh, "q")
    for name in ("a", "b"):
        vh.declare_exchange(name, "fanout", False, False, False, False, {})
        vh.bind(name, "q", "queue", "", {})
    broken, kept = declare(vh, "broken-sink"), declare(vh, "kept-sink")
    vh.bind(trace.TRACE_EXCHANGE, "broken-sink", "queue", "publish.a", {})
    vh.bind(trace.TRACE_EXCHANGE, "kept-sink", "queue", "publish.b", {})
    deliver_run = delegate.deliver_run

    def failing_for_broken_sink(queues: list[Any], *args: Any) -> Any:
        if broken in queues:
            raise RuntimeError("boom")
        return deliver_run(queues, *args)

    monkeypatch.setattr(delegate, "deliver_run", failing_for_broken_sink)
    deferred: list[Any] = []
    trace.start(vh, "n", deferred.append)
    for exchange in ("a", "b", "a", "b"):
        vh.publish(vh.exchanges[exchange], message(exchange, "", exchange.encode()), False)
    assert len(deferred) == 1
    deferred.pop()()
    assert [m.body for m in drain(kept)] == [b"b", b"b"]
    assert drain(broken) == []
    assert vh.exchanges[trace.TRACE_EXCHANGE].publish_out == 2  # what was handed over, not what was dropped
    logged = [line for line in capsys.readouterr().out.splitlines() if "broker messages dropped" in line]
    assert len(logged) == 1 and "dropped=2" in logged[0]
