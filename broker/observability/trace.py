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
RabbitMQ) and never blocks or fails what it traces: a copy is published as the broker's own message (no credit
flow, no confirms, not counted as a client's publish), and an error building or routing it is logged and
dropped.

The copies of one loop turn are published together at its end (``VHost.publish_events``, scheduled once a turn
by the ``defer`` the tracer is started with): each is routed as it would be alone, and a run of them going to
the same queue is handed over in one call, so a trace stream appends a turn's events in one write. In order:
the events of a turn keep the order they happened in, after those of the turns before. A copy that fails to
route is dropped alone, and a run that fails to be handed over is dropped whole; the turn's other events still
go out.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.message import Message
from protocol.fastcodec import build_content_header, shortstr
from protocol.frames import FrameError
from protocol.properties import (
    PROPERTY_FIELDS,
    check_field_table,
    property_spans,
    table_values,
    with_longstr_header,
)

if TYPE_CHECKING:
    from broker.clock import Clock

log = structlog.get_logger("leveret.trace")

TRACE_EXCHANGE = "amq.rabbitmq.trace"
EVENT_TIME = "x-leveret-event-time"
MESSAGE_ID = "x-leveret-message-id"
TRACE_ID = "x-leveret-trace-id"

_TRACE_ID_KEY = TRACE_ID.encode()
_TRACE_ID_RAW = shortstr(TRACE_ID)
_HEADERS_FLAG = struct.pack(">H", 1 << 13)
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_LONG = struct.Struct(">cq")
_LONGSTR = ord("S")
_MESSAGE_ID_FLAG = next(bit for bit, name, _kind in PROPERTY_FIELDS if name == "message_id")
# What a message's own fields cost to build (its properties table, its identity) is paid once per content
# header: the publish, delivery and ack events of one message share it. Bounded in entries and in the size of a
# header kept (a client's large headers are rebuilt per event, not held: at most ~4 MB a traced vhost); a miss
# only rebuilds.
_FIELDS_CACHE_SIZE = 1024
_FIELDS_CACHED_HEADER_MAX = 2048
# Broker-assigned ids: a random prefix per process (unique across restarts) and a counter.
_ID_PREFIX = os.urandom(6).hex()
_id_counter = itertools.count(1)
# The basic properties in wire order (protocol/properties.py's list): pamqp's name, RabbitMQ's (the P_basic
# record's: ``type`` for the type property) as a field-table key, and the kind (s, o, t, q).
_PROPERTIES = tuple((name, shortstr("type" if name == "message_type" else name), kind)
                    for _bit, name, kind in PROPERTY_FIELDS)
# Keys of the event's own entries, as short strings.
_K_EXCHANGE_NAME = shortstr("exchange_name")
_K_ROUTING_KEYS = shortstr("routing_keys")
_K_PROPERTIES = shortstr("properties")
_K_NODE = shortstr("node")
_K_VHOST = shortstr("vhost")
_K_CONNECTION = shortstr("connection")
_K_CHANNEL = shortstr("channel")
_K_USER = shortstr("user")
_K_ROUTED_QUEUES = shortstr("routed_queues")
_K_REDELIVERED = shortstr("redelivered")
_K_REASON = shortstr("reason")
_K_DEAD_LETTER_EXCHANGE = shortstr("dead_letter_exchange")
_K_EVENT_TIME = shortstr(EVENT_TIME)
_K_MESSAGE_ID = shortstr(MESSAGE_ID)


class TraceHost(Protocol):
    """What the tracer needs of its vhost (broker/vhost.py's VHost)."""

    name: str
    clock: Clock
    exchanges: dict[str, Any]
    tracing: Tracer | None

    def publish_events(self, exchange: Any, msgs: list[Message]) -> int: ...


class TracedChannel(Protocol):
    """The channel a publish or delivery event names: its connection (``reader``, which the publish path's
    Publisher declares: None, or a stand-in that is no connection, for a publisher no client drives) and its
    channel number (read only when ``reader`` is a connection, and so the publisher a channel)."""

    reader: Any
    id: int


Defer = Callable[[Callable[[], None]], object]
"""How a tracer runs its flush at the end of the loop turn: the loop's ``call_soon``."""


def start(vhost: TraceHost, node_name: str, defer: Defer | None = None) -> None:
    """``rabbitmqctl trace_on``: idempotent. ``defer``: the running loop's ``call_soon`` (the events of a turn
    published together at its end); None: each event published as it happens (a vhost driven without a loop)."""
    if vhost.tracing is None:
        vhost.tracing = Tracer(vhost, node_name, defer)
        log.info("tracing started", vhost=vhost.name)


def stop(vhost: TraceHost) -> None:
    """``rabbitmqctl trace_off``: idempotent."""
    if vhost.tracing is not None:
        vhost.tracing = None
        log.info("tracing stopped", vhost=vhost.name)


def new_trace_id() -> str:
    return f"{_ID_PREFIX}-{next(_id_counter)}"


# -- field table pieces (the copy's headers are built raw: the message's own headers table is copied as is) --

def _signedint(value: int) -> bytes:
    """RabbitMQ writes integers of the trace as ``signedint`` ('I'); too big for 32 bits: a long."""
    if -(2**31) <= value < 2**31:
        return b"I" + _I32.pack(value)
    return _LONG.pack(b"l", value)


def _longstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return b"S" + _U32.pack(len(raw)) + raw


def _array(values: list[str]) -> bytes:
    body = b"".join([_longstr(v) for v in values])
    return b"A" + _U32.pack(len(body)) + body


def message_fields(header: bytes) -> tuple[bytes, bytes]:
    """A message's own entries of its events, from its raw content header in one walk of the property list:
    the ``properties`` entry (each property the message has, by RabbitMQ's name, integers as signedint,
    strings as long strings, the headers table copied byte for byte) and the ``x-leveret-message-id`` entry
    (its ``message_id`` property, else the ``x-leveret-trace-id`` header stamped at publish; b"" when it has
    neither). A cut property list or a malformed headers table (where the identity is looked for) raises
    FrameError."""
    spans = property_spans(header)
    parts = []
    for name, key, kind in _PROPERTIES:
        span = spans.get(name)
        if span is None:
            continue
        start, end = span
        if kind == "s":
            parts.append(key + b"S" + _U32.pack(end - start - 1) + header[start + 1:end])
        elif kind == "o":
            parts.append(key + b"I" + _I32.pack(header[start]))
        elif kind == "t":
            parts.append(key + b"F" + header[start:end])
        else:
            parts.append(key + _signedint(_U64.unpack_from(header, start)[0]))
    message_id = spans.get("message_id")
    body = b"".join(parts)
    properties = _K_PROPERTIES + b"F" + _U32.pack(len(body)) + body
    identity = header[message_id[0] + 1:message_id[1]] if message_id is not None \
        else _stamped_id(header, spans.get("headers"))
    return properties, b"" if identity is None else _K_MESSAGE_ID + _longstr(identity)


def _stamped_id(header: bytes, span: tuple[int, int] | None) -> bytes | None:
    """The ``x-leveret-trace-id`` header's value, if the headers table at ``span`` has one as a long string."""
    if span is None:
        return None
    found = table_values(header, span[0], span[1], (_TRACE_ID_KEY,)).get(_TRACE_ID_KEY)
    if found is not None and header[found[0]] == _LONGSTR:
        return header[found[0] + 5:found[1]]
    return None


def _routing_key(kind: str, name: str) -> str:
    key = f"{kind}.{name}"
    raw = key.encode()
    return key if len(raw) <= 255 else raw[:255].decode(errors="ignore")


class Tracer:
    """A tracing vhost's firehose: builds each event's copy and publishes it to ``amq.rabbitmq.trace``.

    An event's headers are written as raw field-table bytes from parts built once: the keys are constants, the
    node and vhost entries are made here, and a message's own entries (:func:`message_fields`) are kept per
    content header, so its delivery and ack events reuse what its publish event built (and the other way round:
    a message handed to a waiting consumer is delivered, and traced, before its publish is)."""

    def __init__(self, vhost: TraceHost, node_name: str, defer: Defer | None = None) -> None:
        self.vhost = vhost
        self.node_name = node_name
        self._defer = defer
        self._events: list[Message] = []  # this turn's copies, not published yet (only with ``defer``)
        self.names_prefix = bytes([len(TRACE_EXCHANGE)]) + TRACE_EXCHANGE.encode()
        """How the wire names (exchange, routing key) of a message published to ``amq.rabbitmq.trace`` begin:
        a stored message (a trace stream's) found to be one needs no decoding to know it is never traced."""
        self._node = _K_NODE + _longstr(node_name)
        self._vhost = _K_VHOST + _longstr(vhost.name)
        self._fields: dict[bytes, tuple[bytes, bytes]] = {}

    # -- the hooks (called only while tracing is on) ----------------------------------------------------------
    def stamp(self, msg: Message) -> None:
        """Before a client's message is routed: give it an identity if it has no message_id."""
        if msg.exchange == TRACE_EXCHANGE:
            return
        try:
            header = msg.header
            if len(header) < 14:
                raise FrameError("content header shorter than its property flags")
            if not header[13] & _MESSAGE_ID_FLAG:
                span = msg.props.headers_span
                if span is not None:
                    check_field_table(header, span[0], span[1])  # a malformed table is left as it came
                msg.replace_header(with_longstr_header(header, _TRACE_ID_RAW, new_trace_id().encode()))
        except Exception:  # tracing never fails the publish it traces
            log.exception("trace: could not stamp a message id", vhost=self.vhost.name)

    def published(self, exchange_name: str, msg: Message, queues: list[Any] | None, publisher: Any) -> None:
        """After a client's publish was routed (RabbitMQ's ``tap_in``)."""
        if exchange_name == TRACE_EXCHANGE:
            return
        try:
            routed = _K_ROUTED_QUEUES + _array([q.name for q in queues] if queues else [])
            self._emit(_routing_key("publish", exchange_name), msg, msg.body,
                       b"".join((self._channel_fields(publisher), routed)))
        except Exception:
            log.exception("trace: publish event dropped", vhost=self.vhost.name)

    def delivered(self, queue_name: str, msg: Message, redelivered: bool, channel: Any) -> None:
        """A delivery to a consumer or a basic.get (RabbitMQ's ``tap_out``)."""
        if msg.exchange == TRACE_EXCHANGE:
            return
        try:
            extra = (_REDELIVERED if redelivered else _NOT_REDELIVERED) + self._channel_fields(channel)
            self._emit(_routing_key("deliver", queue_name), msg, msg.body, extra)
        except Exception:
            log.exception("trace: deliver event dropped", vhost=self.vhost.name)

    def acked(self, queue_name: str, msgs: list[Any]) -> None:
        """Leveret-only: a consumer acked these messages of ``queue_name``."""
        key = _routing_key("ack", queue_name)
        for msg in msgs:
            if msg is None or msg.exchange == TRACE_EXCHANGE:
                continue
            try:
                self._emit(key, msg, b"", self._vhost)
            except Exception:
                log.exception("trace: ack event dropped", vhost=self.vhost.name)

    def dead_lettered(self, queue_name: str, msgs: list[Message], reason: str, dlx: str | None) -> None:
        """Leveret-only: these messages died in ``queue_name`` for ``reason``."""
        key = _routing_key("deadletter", queue_name)
        extra = _K_REASON + _longstr(reason) + self._vhost
        if dlx is not None:
            extra += _K_DEAD_LETTER_EXCHANGE + _longstr(dlx)
        for msg in msgs:
            if msg.exchange == TRACE_EXCHANGE:
                continue
            try:
                self._emit(key, msg, msg.body, extra)
            except Exception:
                log.exception("trace: deadletter event dropped", vhost=self.vhost.name)

    # -- building and publishing a copy -----------------------------------------------------------------------
    def _channel_fields(self, channel: TracedChannel | None) -> bytes:
        """The vhost entry and the publishing or consuming channel's (none for a publish that is no channel's)."""
        reader = None if channel is None else channel.reader
        if channel is None or reader is None:
            return self._vhost
        return b"".join((self._vhost, _K_CONNECTION, _longstr(reader.name), _K_CHANNEL, _signedint(channel.id),
                         _K_USER, _longstr(reader.user.name)))

    def _message_fields(self, header: bytes) -> tuple[bytes, bytes]:
        if len(header) > _FIELDS_CACHED_HEADER_MAX:
            return message_fields(header)
        fields = self._fields
        found = fields.get(header)
        if found is None:
            if len(fields) >= _FIELDS_CACHE_SIZE:
                fields.clear()  # (not the oldest alone: a dict emptied from its front is slow to iterate)
            found = fields[header] = message_fields(header)
        return found

    def _emit(self, key: str, msg: Message, body: bytes, extra: bytes) -> None:
        vhost = self.vhost
        properties, identity = self._message_fields(msg.header)
        keys = [msg.routing_key] if msg.extra_keys is None else [msg.routing_key, *msg.extra_keys]
        table = b"".join((
            _K_EXCHANGE_NAME, _longstr(msg.exchange), _K_ROUTING_KEYS, _array(keys), properties, self._node,
            extra, _K_EVENT_TIME, _LONG.pack(b"l", int(vhost.clock.now_ms())), identity,
        ))
        header = build_content_header(len(body), _HEADERS_FLAG + _U32.pack(len(table)) + table)
        raw_key = key.encode()
        copy = Message(TRACE_EXCHANGE, key, self.names_prefix + bytes([len(raw_key)]) + raw_key, header, body)
        events = self._events
        events.append(copy)
        if len(events) == 1:
            if self._defer is None:
                self.flush()
            else:
                self._defer(self.flush)

    def flush(self) -> None:
        """Publish the copies made since the last flush, in order (once a turn, at its end, with ``defer``)."""
        events = self._events
        if not events:
            return
        self._events = []  # (an event made while these are handed over goes to the next flush)
        exchange = self.vhost.exchanges.get(TRACE_EXCHANGE)
        if exchange is None:
            return
        try:
            self.vhost.publish_events(exchange, events)
        except Exception:  # tracing never fails what it traces, nor the turn it ends
            log.exception("trace: events dropped", vhost=self.vhost.name, events=len(events))


_REDELIVERED = _K_REDELIVERED + _signedint(1)
_NOT_REDELIVERED = _K_REDELIVERED + _signedint(0)
