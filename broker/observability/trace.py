"""The firehose: per-vhost tracing of every publish and delivery (RabbitMQ's ``rabbit_trace``), plus two
Leveret-only event kinds, acks and dead-letterings, so that a message's life can be followed downstream.

When a vhost traces (``leveret ctl trace_on -p VHOST``, or ``PUT /api/vhosts/{name}`` with
``{"tracing": true}``), ``vhost.tracing`` holds a :class:`Tracer`; when it does not, it is None and the hot
paths pay one attribute check (VHost.publish, Channel.deliver, QueueProcess.ack / dead_letter_msgs), no call.
As in RabbitMQ the state is not persistent: every vhost starts with tracing off ("the firehose state is not
persistent; it will default of off at server start time", RabbitMQ's firehose guide).

Every event is a transient copy published to the topic exchange ``amq.rabbitmq.trace`` (one per vhost,
durable, internal: clients cannot publish to it, 403), whose only property is its headers table. Routing keys
and headers are RabbitMQ 3.10's, checked against it (``rabbitmqctl trace_on``, a queue bound with ``#``)::

    publish.<exchange>   (publish. for the default exchange)   body: the message's
        exchange_name, routing_keys (array: the routing key, then CC and BCC keys), properties (table: the
        message's properties by RabbitMQ's names, e.g. ``type`` for the type property), node, vhost,
        connection, channel, user (of the publishing channel; absent for a publish that is not a channel's),
        routed_queues (array: the queues reached; RabbitMQ lists the default exchange's routing keys even when
        no such queue exists, Leveret only the queues that exist)
    deliver.<queue>      body: the message's
        the same first four, redelivered (0 / 1), vhost, connection, channel, user (of the consuming channel);
        basic.get counts as a delivery

Leveret-only kinds (no channel: they happen in the queue)::

    ack.<queue>          a consumer acked the message (manual acks only; an auto-ack delivery has no ack);
                         empty body, the same first four headers and vhost
    deadletter.<queue>   the message died in the queue: ``reason`` (expired, rejected, maxlen,
                         delivery_limit, as x-death has it) and ``dead_letter_exchange`` if the queue has one
                         (without one the message is dropped: the event still says it left the queue); body:
                         the message's

Every event (all kinds) also carries ``x-leveret-event-time`` (long: ms since the epoch on the vhost's clock,
when the event happened) and, when the message has an identity, ``x-leveret-message-id``: its ``message_id``
property if it has one, else the id the broker stamped on it at publish while tracing was on — a
``x-leveret-trace-id`` header added to the message itself (consumers see it too; it survives paging, restarts
and dead-lettering, because it is part of the message). A message published before tracing was turned on,
without a message_id, has no identity. Joining the events of one vhost on ``x-leveret-message-id`` gives
publish → deliver → ack latency per message.

Tracing never recurses (a message published to, or routed from, ``amq.rabbitmq.trace`` is not traced, as in
RabbitMQ) and never blocks or fails what it traces: a copy is published as the broker's own message
(VHost.publish with ``held``: no credit flow, no confirms, not counted), and an error building or routing it is
logged and dropped.
"""

from __future__ import annotations

import datetime
import itertools
import os
import struct
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.message import Message
from protocol.fastcodec import build_content_header
from protocol.properties import Long, decode_properties, encode_field_value, table_values, with_properties

if TYPE_CHECKING:
    from broker.clock import Clock

log = structlog.get_logger("leveret.trace")

TRACE_EXCHANGE = "amq.rabbitmq.trace"
EVENT_TIME = "x-leveret-event-time"
MESSAGE_ID = "x-leveret-message-id"
TRACE_ID = "x-leveret-trace-id"

_TRACE_ID_KEY = TRACE_ID.encode()
_HEADERS_FLAG = struct.pack(">H", 1 << 13)
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_LONGSTR = ord("S")
# Broker-assigned ids: a random prefix per process (unique across restarts) and a counter.
_ID_PREFIX = os.urandom(6).hex()
_id_counter = itertools.count(1)
# pamqp's property names → RabbitMQ's (the P_basic record's field names).
_RABBIT_NAMES = {"message_type": "type"}
_PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                   "reply_to", "expiration", "message_id", "timestamp", "message_type", "user_id", "app_id",
                   "cluster_id")


class TraceHost(Protocol):
    """What the tracer needs of its vhost (broker/vhost.py's VHost)."""

    name: str
    clock: Clock
    exchanges: dict[str, Any]
    tracing: Tracer | None

    def publish(self, exchange: Any, msg: Message, persistent: bool, mandatory: bool = False,
                publisher: Any = None, confirm_seq: int = 0, dead_letter: bool = False,
                held: bool = False) -> int: ...


class TracedChannel(Protocol):
    """The channel a publish or delivery event names: its connection (``reader``, which the publish path's
    Publisher declares: None, or a stand-in that is no connection, for a publisher no client drives) and its
    channel number (read only when ``reader`` is a connection, and so the publisher a channel)."""

    reader: Any
    id: int


def start(vhost: TraceHost, node_name: str) -> None:
    """``rabbitmqctl trace_on``: idempotent."""
    if vhost.tracing is None:
        vhost.tracing = Tracer(vhost, node_name)
        log.info("tracing started", vhost=vhost.name)


def stop(vhost: TraceHost) -> None:
    """``rabbitmqctl trace_off``: idempotent."""
    if vhost.tracing is not None:
        vhost.tracing = None
        log.info("tracing stopped", vhost=vhost.name)


def new_trace_id() -> str:
    return f"{_ID_PREFIX}-{next(_id_counter)}"


# -- field table pieces (the copy's headers are built raw: the message's own headers table is copied as is) --

def _entry(key: str, value_raw: bytes) -> bytes:
    raw = key.encode()
    return bytes([len(raw)]) + raw + value_raw


def _signedint(value: int) -> bytes:
    """RabbitMQ writes integers of the trace as ``signedint`` ('I'); too big for 32 bits: a long."""
    if -(2**31) <= value < 2**31:
        return b"I" + _I32.pack(value)
    return encode_field_value(Long(value))


def _longstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return b"S" + _U32.pack(len(raw)) + raw


def _array(values: list[str]) -> bytes:
    body = b"".join(_longstr(v) for v in values)
    return b"A" + _U32.pack(len(body)) + body


def _table(entries: list[bytes]) -> bytes:
    body = b"".join(entries)
    return b"F" + _U32.pack(len(body)) + body


def _properties(msg: Message, props: Any) -> bytes:
    """The ``properties`` table: each property the message has, by RabbitMQ's name, integers as signedint,
    strings as long strings, the headers table copied byte for byte. ``props``: decode_properties's."""
    entries = []
    for name in _PROPERTY_NAMES:
        if name == "headers":
            span = msg.props.headers_span
            if span is not None:
                entries.append(_entry(name, b"F" + msg.header[span[0]:span[1]]))
            continue
        value = getattr(props, name)  # reflection over _PROPERTY_NAMES, the properties' declared names
        if value is None:
            continue
        if name == "timestamp" and isinstance(value, datetime.datetime):
            value = int(value.timestamp())
        raw = _signedint(value) if isinstance(value, int) else _longstr(value)
        entries.append(_entry(_RABBIT_NAMES.get(name, name), raw))
    return _table(entries)


def message_identity(msg: Message, message_id: str | bytes | None) -> str | bytes | None:
    """The message's ``message_id`` property, else the ``x-leveret-trace-id`` header stamped at publish."""
    if message_id is not None:
        return message_id
    span = msg.props.headers_span
    if span is None:
        return None
    found = table_values(msg.header, span[0], span[1], (_TRACE_ID_KEY,)).get(_TRACE_ID_KEY)
    if found is not None and msg.header[found[0]] == _LONGSTR:
        return msg.header[found[0] + 5:found[1]]
    return None


def _routing_key(kind: str, name: str) -> str:
    key = f"{kind}.{name}"
    raw = key.encode()
    return key if len(raw) <= 255 else raw[:255].decode(errors="ignore")


class Tracer:
    """A tracing vhost's firehose: builds each event's copy and publishes it to ``amq.rabbitmq.trace``."""

    def __init__(self, vhost: TraceHost, node_name: str) -> None:
        self.vhost = vhost
        self.node_name = node_name
        self._names_prefix = bytes([len(TRACE_EXCHANGE)]) + TRACE_EXCHANGE.encode()

    # -- the hooks (called only while tracing is on) ----------------------------------------------------------
    def stamp(self, msg: Message) -> None:
        """Before a client's message is routed: give it an identity if it has no message_id."""
        if msg.exchange == TRACE_EXCHANGE:
            return
        try:
            if decode_properties(msg.header, skip_headers=True).message_id is None:
                msg.replace_header(with_properties(msg.header, headers_set={TRACE_ID: new_trace_id()}))
        except Exception:  # tracing never fails the publish it traces
            log.exception("trace: could not stamp a message id", vhost=self.vhost.name)

    def published(self, exchange_name: str, msg: Message, queues: list[Any] | None, publisher: Any) -> None:
        """After a client's publish was routed (RabbitMQ's ``tap_in``)."""
        if exchange_name == TRACE_EXCHANGE:
            return
        try:
            extra = self._channel_fields(publisher)
            extra.append(_entry("routed_queues", _array([q.name for q in queues] if queues else [])))
            self._emit(_routing_key("publish", exchange_name), msg, msg.body, extra)
        except Exception:
            log.exception("trace: publish event dropped", vhost=self.vhost.name)

    def delivered(self, queue_name: str, msg: Message, redelivered: bool, channel: Any) -> None:
        """A delivery to a consumer or a basic.get (RabbitMQ's ``tap_out``)."""
        if msg.exchange == TRACE_EXCHANGE:
            return
        try:
            extra = [_entry("redelivered", _signedint(1 if redelivered else 0)), *self._channel_fields(channel)]
            self._emit(_routing_key("deliver", queue_name), msg, msg.body, extra)
        except Exception:
            log.exception("trace: deliver event dropped", vhost=self.vhost.name)

    def acked(self, queue_name: str, msgs: list[Any]) -> None:
        """Leveret-only: a consumer acked these messages of ``queue_name``."""
        key = _routing_key("ack", queue_name)
        vhost_entry = [_entry("vhost", _longstr(self.vhost.name))]
        for msg in msgs:
            if msg is None or msg.exchange == TRACE_EXCHANGE:
                continue
            try:
                self._emit(key, msg, b"", vhost_entry)
            except Exception:
                log.exception("trace: ack event dropped", vhost=self.vhost.name)

    def dead_lettered(self, queue_name: str, msgs: list[Message], reason: str, dlx: str | None) -> None:
        """Leveret-only: these messages died in ``queue_name`` for ``reason``."""
        key = _routing_key("deadletter", queue_name)
        extra = [_entry("reason", _longstr(reason)), _entry("vhost", _longstr(self.vhost.name))]
        if dlx is not None:
            extra.append(_entry("dead_letter_exchange", _longstr(dlx)))
        for msg in msgs:
            if msg.exchange == TRACE_EXCHANGE:
                continue
            try:
                self._emit(key, msg, msg.body, extra)
            except Exception:
                log.exception("trace: deadletter event dropped", vhost=self.vhost.name)

    # -- building and publishing a copy -----------------------------------------------------------------------
    def _channel_fields(self, channel: TracedChannel | None) -> list[bytes]:
        """The publishing or consuming channel's fields (none for a publish that is no channel's)."""
        fields = [_entry("vhost", _longstr(self.vhost.name))]
        reader = None if channel is None else channel.reader
        if channel is not None and reader is not None:
            fields.append(_entry("connection", _longstr(reader.name)))
            fields.append(_entry("channel", _signedint(channel.id)))
            fields.append(_entry("user", _longstr(reader.user.name)))
        return fields

    def _emit(self, key: str, msg: Message, body: bytes, extra: list[bytes]) -> None:
        vhost = self.vhost
        keys = [msg.routing_key] if msg.extra_keys is None else [msg.routing_key, *msg.extra_keys]
        props = decode_properties(msg.header, skip_headers=True)
        entries = [
            _entry("exchange_name", _longstr(msg.exchange)),
            _entry("routing_keys", _array(keys)),
            _entry("properties", _properties(msg, props)),
            _entry("node", _longstr(self.node_name)),
            *extra,
            _entry(EVENT_TIME, encode_field_value(Long(int(vhost.clock.now_ms())))),
        ]
        identity = message_identity(msg, props.message_id)
        if identity is not None:
            entries.append(_entry(MESSAGE_ID, _longstr(identity)))
        table = _table(entries)
        header = build_content_header(len(body), _HEADERS_FLAG + table[1:])
        raw_key = key.encode()
        copy = Message(TRACE_EXCHANGE, key, self._names_prefix + bytes([len(raw_key)]) + raw_key, header, body)
        exchange = vhost.exchanges.get(TRACE_EXCHANGE)
        if exchange is not None:
            vhost.publish(exchange, copy, False, held=True)
