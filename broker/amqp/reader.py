"""One client connection (RabbitMQ's ``rabbit_reader`` and ``rabbit_writer``): an asyncio.Protocol.

Bytes in go through the sans-IO frame parser; the handshake (start, tune, open), heartbeats,
connection.close and the channel table live here, and every other frame goes to its channel. Frames
out are collected in a list and written once per event-loop tick (``_flush``), after each channel with
pending publisher confirms has added them, so a burst of publishes costs one write and one confirm.

Time (heartbeats, the handshake and close-ok timeouts, when credit flow blocked the connection, when it
connected) is read from the node's clock (broker/clock.py), so tests can move it without sleeping; only the
per-tick scheduling (``call_soon``) uses the event loop itself.
"""

from __future__ import annotations

import asyncio
import platform
import struct
from typing import TYPE_CHECKING, Any, cast

import structlog
from pamqp import commands as spec

from broker import PRODUCT, VERSION
from broker.amqp.channel import Channel
from broker.errors import AMQPError
from broker.policies import limits
from broker.queues.delegate import handovers
from broker.security.auth import User
from broker.security.tls import peer_login_name
from protocol import fastcodec
from protocol.constants import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    CLASS_CONNECTION,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_PUBLISH,
    IDX_BASIC_ACK,
    IDX_BASIC_NACK,
    IDX_BASIC_PUBLISH,
    IDX_BASIC_REJECT,
    NOT_ALLOWED,
    PROTOCOL_HEADER,
    TUNE_FRAME_MIN,
    UNEXPECTED_FRAME,
)
from protocol.frames import HEARTBEAT_FRAME, BadProtocolHeader, Frame, FrameError, FrameParser, encode_frame
from protocol.methods import decode_method, method_frame, method_ids, method_index

if TYPE_CHECKING:
    from broker.clock import Clock, TimerHandle
    from broker.config import Settings
    from broker.node import Node
    from broker.vhost import VHost

log = structlog.get_logger("leveret.connection")

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}
# Time to wait for connection.close-ok after we sent connection.close.
CLOSE_OK_TIMEOUT = 3.0
# After close-ok to the client's connection.close, the longest the socket is left to the client to close
# (RabbitMQ's CLOSING_TIMEOUT, 30 s, or the heartbeat timeout when that is shorter).
CLIENT_CLOSE_TIMEOUT = 30.0
# Fairness: after this many bytes in one turn of the event loop a connection's socket is left alone until
# the next turn. libuv reads a busy socket up to 32 times per turn; without this, one fast publisher
# starves every other connection (consumers' acks included) of the loop.
READ_BYTES_PER_TURN = 16 * 1024
# Fairness in work as well as bytes: after a turn's publishes have been handed to this many queues, the
# frames left wait for the next turn. 16 KiB of small publishes to a fanout of 1,000 queues is 200,000
# hand-overs (seconds of work) in one turn, during which no consumer's socket is written (the cost
# curves, docs/decisions/performance.md: fan-out to 1,000 queues delivered nothing in a 10 s window). About 10-40 ms of work.
ROUTED_PER_TURN = 2048
_ACCESS_REQUEST = (30 << 16) | 10
_CHANNEL_CLOSE = (20 << 16) | 40  # channel.close
_RUNNING = 4  # Reader.RUNNING, as a module constant for the hot path
_unpack_index = struct.Struct(">I").unpack_from
_ACCESS_REQUEST_OK = b"\x00\x1e\x00\x0b\x00\x01"  # class 30, method 11, ticket 1
# Reasons to pause reading that are the connection's own (resource alarm, fairness); any other reason is a
# queue withholding credit (credit flow).
_OWN_PAUSE_REASONS = ("alarm", "turn")
# How long a connection that credit flow held back is still shown as "flow" (RabbitMQ's 5 seconds).
FLOW_SHOWN_FOR = 5.0
# The management API's names of the connection states before and after running.
_STATE_NAMES = ("starting", "starting", "tuning", "opening", "running", "closing", "closed")


def server_properties(cluster_name: str) -> dict[str, Any]:
    """Connection.Start's server properties; ``cluster_name``: the node's (a member's: the cluster's), as
    RabbitMQ sends its cluster name."""
    return {
        "product": PRODUCT,
        "version": VERSION,
        "platform": f"Python {platform.python_version()}",
        "capabilities": dict(CAPABILITIES),
        "cluster_name": cluster_name,
        "copyright": "Copyright (c) the Leveret authors",
        "information": "Licensed under the Apache License 2.0",
    }


# Seconds before the socket of a failed tune-ok is closed (RabbitMQ's handshake failure pause).
NEGOTIATION_FAILURE_DELAY = 3.0

class Reader(asyncio.Protocol):
    # Connection states, in order.
    HANDSHAKE, STARTING, TUNING, OPENING, RUNNING, CLOSING, CLOSED = range(7)

    # State that starts the same for every connection is a class attribute until a connection sets its own:
    # an idle connection's instance dictionary then stays under CPython 3.11's 30 shared keys (1.6 KB more
    # per connection above them; tests/unit/broker/test_connection_footprint.py). Only immutable values here.
    transport: asyncio.Transport | None = None
    peer: tuple[str, int] = ("", 0)
    name = "?"
    vhost: VHost = None  # type: ignore[assignment]
    frame_max = FRAME_MIN_SIZE
    channel_max = 0
    heartbeat = 0
    writable = True
    has_published = False
    blocked_by_alarm = False
    # close-ok answered the client's connection.close: the socket is left for the client to close.
    _close_ok_sent = False
    # When credit flow last paused reading (the clock's monotonic seconds; 0.0: never): "flow" in the
    # management API.
    flow_blocked_at = 0.0
    auth_mechanism = ""  # the SASL mechanism of connection.start-ok
    _read_this_turn = 0
    # A read larger than READ_BYTES_PER_TURN, taken a slice per turn (see data_received): the bytes, how
    # far they are taken, and whether _next_turn is scheduled.
    _unread: bytes | None = None
    _unread_at = 0
    # broker/queues/delegate.py's hand-over count when this connection's turn began, and the parsed frames
    # (with the read's frame error, if any) held for the next turn once the turn passed ROUTED_PER_TURN.
    _turn_handovers = 0
    _held_frames: tuple[list[Frame], FrameError | None] | None = None
    _turn_scheduled = False
    _flush_scheduled = False
    _received_since_tick = True
    _sent_since_tick = False
    _missed_heartbeats = 0
    # Runs from the first byte to connection.open-ok (RabbitMQ's handshake_timeout): a client that
    # stops anywhere in the handshake, heartbeats negotiated or not, loses its socket.
    _handshake_timer: TimerHandle | None = None
    # The connection's timers (heartbeats, close waits; a tuple until it has one), the channels whose confirms
    # go out at the next flush (a tuple until the first), and the channel numbers closed by the server and
    # waiting for the client's close-ok (a frozenset: replaced, never changed in place).
    _timers: list[TimerHandle] | tuple[()] = ()
    _confirm_channels: list[Channel] | tuple[()] = ()
    closing_channels: frozenset[int] = frozenset()

    def __init__(self, node: Node) -> None:
        self.node = node
        self.state = Reader.HANDSHAKE
        # combine_publish: a publish whose header and single body frame came in the same read is one item
        # (protocol/frames.py), handed to the channel in one call (_channel_frame).
        self.parser = FrameParser(FRAME_MIN_SIZE, combine_publish=True)
        self.user: User = User("", "")
        self.client_properties: dict[str, Any] = {}
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: list[Any] = []
        # Why the socket is not being read: "alarm" (memory/disk), or queues that withhold credit.
        self._pause_reasons: set[object] = set()
        self._out: list[bytes | memoryview] = []
        # Bytes read from and written to the socket, and the reads and writes (RabbitMQ's recv_oct, recv_cnt,
        # send_oct, send_cnt, the properties below; one list, not four attributes): added to per socket read
        # and per write, never per frame.
        self._io = [0, 0, 0, 0]
        self._loop = asyncio.get_event_loop()  # for call_soon: the flush at the end of this tick
        self.connected_at = self.clock.now_ms() / 1000.0  # seconds since the epoch

    @property
    def settings(self) -> Settings:
        return self.node.settings

    @property
    def clock(self) -> Clock:
        return self.node.clock

    @property
    def recv_oct(self) -> int:
        return self._io[0]

    @property
    def recv_cnt(self) -> int:
        return self._io[1]

    @property
    def send_oct(self) -> int:
        return self._io[2]

    @property
    def send_cnt(self) -> int:
        return self._io[3]

    # -- transport events ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's transports are asyncio.Transport (read and write); tests hand in look-alikes.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        self.peer = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else (str(peer), 0)
        self.name = f"{self.peer[0]}:{self.peer[1]} -> {local[0]}:{local[1]}"
        transport.set_write_buffer_limits(high=1 << 20)
        self.node.connections.add(self)
        self._handshake_timer = self.clock.call_later(self.settings.handshake_timeout, self._handshake_timeout)
        log.info("connection accepted", **self.log_id)

    @property
    def log_id(self) -> dict[str, str]:
        """How log lines name this connection: its addresses, and the client's ``connection_name`` property
        when it gave one (as RabbitMQ adds it to its connection lines)."""
        name = self.client_properties.get("connection_name")
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).decode(errors="replace")
        if isinstance(name, str) and name:
            return {"connection": self.name, "connection_name": name}
        return {"connection": self.name}

    def connection_lost(self, exc: Exception | None) -> None:
        was_open = self.state == Reader.RUNNING
        if self.vhost is not None:
            self.node.counters.connections_closed += 1
        self.state = Reader.CLOSED
        for timer in self._timers:
            timer.cancel()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self._cleanup()
        self.node.connections.discard(self)
        if was_open:
            log.info("connection closed abruptly", **self.log_id, user=self.user.name,
                     reason=str(exc) if exc else "client closed the socket")

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for ch in list(self.channels.values()):
            for consumer in list(ch.consumers.values()):
                consumer.queue.schedule_run()

    def data_received(self, data: bytes) -> None:
        if self.state >= Reader.CLOSED:
            return
        self._received_since_tick = True
        io = self._io
        io[0] += len(data)
        io[1] += 1
        if self._unread is not None or self._held_frames is not None:
            # Not expected (reading is paused meanwhile): keep the order anyway.
            self._unread = data if self._unread is None else self._unread[self._unread_at:] + data
            self._unread_at = 0
            return
        self._turn_handovers = handovers.count
        if len(data) > READ_BYTES_PER_TURN:
            # One read can bring 256 KiB (uvloop's buffer): ~250 publishes that would all be handled in this
            # turn while every other connection waits, so a consumer's acks, and with them its deliveries,
            # come round only every few milliseconds (S2: 100 deliveries per 8 ms round trip). The rest is
            # taken a slice per turn, reading paused meanwhile.
            self._unread = data
            self._unread_at = 0
            self.pause_for("turn")
            self._take_unread_slice()
            return
        self._read_this_turn += len(data)
        if self._read_this_turn > READ_BYTES_PER_TURN and "turn" not in self._pause_reasons:
            self.pause_for("turn")
            self._schedule_turn()
        self._take(data)

    def _take(self, data: bytes) -> None:
        """Parse ``data`` and handle its frames."""
        try:
            frames = self.parser.feed(data)
        except BadProtocolHeader as exc:
            self._refuse_protocol(exc)
            return
        except FrameError as exc:
            # The protocol header may have come in the same read as the bad frame: the connection starts
            # all the same, so the frames before the bad one are taken in the right state and the error is
            # answered with connection.close (found by the live fuzzer: it used to be a silent close).
            if self.state == Reader.HANDSHAKE and self.parser.header_received:
                self._start()
            self._unread = None  # what followed the bad frame in this read is dropped with it
            self._frames(exc.frames, exc)
            return
        if self.state == Reader.HANDSHAKE and self.parser.header_received:
            self._start()
        self._frames(frames, None)

    def _frames(self, frames: list[Frame], error: FrameError | None) -> None:
        index = 0
        count = len(frames)
        single_until = 0  # frames before this were found not to be a run: one by one, not looked at again
        while index < count:
            if self.state >= Reader.CLOSED:
                return
            if handovers.count - self._turn_handovers > ROUTED_PER_TURN:
                # This turn's publishes went to many queues (a wide fanout): the rest waits a turn, so that
                # the deliveries made so far are written and other connections are read.
                self._held_frames = (frames[index:], error)
                self.pause_for("turn")
                self._schedule_turn()
                return
            frame_type, channel_id, payload = frames[index]
            if frame_type == FRAME_PUBLISH and index >= single_until and index + 1 < count:
                end = publish_run_end(frames, index, count)
                if end - index > 1:
                    reached = self._publish_run(channel_id, frames, index, end)
                    if reached > index:
                        index = reached
                        continue
                    single_until = end
            try:
                self._frame(frame_type, channel_id, payload)
            except Exception as exc:  # noqa: BLE001 (answered by kind in _frame_failed)
                self._frame_failed(exc, frame_type, channel_id, payload)
            index += 1
        if error is not None and self.state < Reader.CLOSING:
            self.close_connection(error.reply_code, error.text)

    def _frame_failed(self, exc: Exception, frame_type: int, channel_id: int, payload: Any) -> None:
        """The answer to a frame whose handling raised: a channel or connection error as RabbitMQ gives it,
        541 (logged) for anything unexpected."""
        if isinstance(exc, AMQPError):
            if exc.class_id is None:
                exc.class_id, exc.method_id = self._failing_method(frame_type, channel_id, payload)
            self._error(channel_id, exc)
        elif isinstance(exc, FrameError):
            self.close_connection(exc.reply_code, exc.text, *self._failing_method(frame_type, channel_id, payload))
        else:
            log.exception("internal error handling a frame", **self.log_id)  # (called in the except clause)
            self.close_connection(541, "internal error")

    def _publish_run(self, channel_id: int, frames: list[Frame], start: int, end: int) -> int:
        """``frames[start:end]``: whole publishes on one channel with the same method and content header
        (:func:`publish_run_end`), handed to the channel as one run (broker/amqp/publish_run.py). Returns the
        index of the first frame not handled: ``start`` when the run must go frame by frame after all (the
        channel is not in its plain publishing state, or the run is not one the batched path takes), less
        than ``end`` when this turn's hand-over budget ran out part way."""
        channel = self.channels.get(channel_id) if channel_id and self.state == _RUNNING else None
        if channel is None or channel.pipeline.backlog is not None or channel.assembler.publish is not None:
            return start
        if not self.has_published:
            self._first_publish()
        budget = ROUTED_PER_TURN - (handovers.count - self._turn_handovers)
        try:
            return channel.publish_run.take(frames, start, end, budget)
        except Exception as exc:  # noqa: BLE001 (answered by kind in _frame_failed)
            # A run's errors come from its checks, before anything is published: they are its first publish's.
            self._frame_failed(exc, FRAME_PUBLISH, channel_id, frames[start][2])
            return start + 1

    def _failing_method(self, frame_type: int, channel_id: int, payload: bytes) -> tuple[int, int]:
        """(class id, method id) that a close reports: the method itself, or basic.publish for content."""
        if frame_type == FRAME_METHOD and len(payload) >= 4:
            index = method_index(payload)
            return index >> 16, index & 0xFFFF
        if frame_type == FRAME_PUBLISH:
            return 60, 40
        if frame_type in (FRAME_HEADER, FRAME_BODY):
            channel = self.channels.get(channel_id)
            if channel is not None and channel.assembler.publish is not None:
                return 60, 40
        return 0, 0

    # -- frame dispatch --------------------------------------------------------------------------------
    def _frame(self, frame_type: int, channel_id: int, payload: bytes) -> None:
        if channel_id and self.state == _RUNNING:
            # The hot path: a frame for an open channel of a running connection.
            channel = self.channels.get(channel_id)
            if channel is not None:
                # (_channel_frame inlined: one call fewer per frame while the channel's pipeline runs)
                if channel.pipeline.backlog is None:
                    self._handle_channel_frame(channel, frame_type, payload)
                else:
                    channel.pipeline.add(frame_type, payload)
                return
        if self.state == Reader.CLOSING:
            # After connection.close only close-ok (or the peer's own close) matters.
            if frame_type == FRAME_METHOD and channel_id == 0:
                index = method_index(payload)
                if index == spec.Connection.CloseOk.index:
                    self._close_transport()
                elif index == spec.Connection.Close.index:
                    self.send(method_frame(0, spec.Connection.CloseOk))
                    self._close_transport()
            return
        if frame_type == FRAME_PUBLISH:
            self._frames(split_publish(channel_id, payload), None)  # not the hot path: frame by frame
            return
        if self.state < Reader.TUNING:  # noqa: SIM102
            # Before login nothing but start-ok is acceptable, and a client that has not logged in gets no
            # explanation: the socket is closed (as RabbitMQ does).
            if not (frame_type == FRAME_METHOD and channel_id == 0
                    and method_index(payload) == spec.Connection.StartOk.index):
                log.warning("unexpected frame before login, closing", **self.log_id)
                self._close_transport()
                return
        if frame_type == FRAME_HEARTBEAT:
            if channel_id != 0:
                raise AMQPError(UNEXPECTED_FRAME, f"heartbeat frame on channel {channel_id}")
            return
        if channel_id == 0:
            if frame_type != FRAME_METHOD:
                raise AMQPError(UNEXPECTED_FRAME, "expected method frame on channel 0, got a content frame")
            self._connection_method(payload)
            return
        if self.state != Reader.RUNNING:
            raise AMQPError(UNEXPECTED_FRAME, f"frame on channel {channel_id} before connection.open", 0, 0)
        channel = self.channels.get(channel_id)
        if channel is None:
            if channel_id in self.closing_channels:
                self._closing_channel_frame(channel_id, frame_type, payload)
                return
            if frame_type == FRAME_METHOD and method_index(payload) == spec.Channel.Open.index:
                self._open_channel(channel_id)
                return
            raise AMQPError(CHANNEL_ERROR, "expected 'channel.open'")
        self._channel_frame(channel, frame_type, payload)

    def _channel_frame(self, channel: Channel, frame_type: int, payload: bytes) -> None:
        """A frame for an open channel: it waits its turn while a reply of the channel is deferred
        (broker/amqp/method_pipeline.py), else it is handled now."""
        pipeline = channel.pipeline
        if pipeline.backlog is not None:
            pipeline.add(frame_type, payload)
            return
        self._handle_channel_frame(channel, frame_type, payload)

    def channel_frame_in_turn(self, channel: Channel, frame_type: int, payload: Any) -> None:
        """A frame of ``channel``'s backlog, its turn come (broker/amqp/method_pipeline.py): handled as a live
        frame is, its errors answered as :meth:`_frames` answers them."""
        if self.state >= Reader.CLOSING or self.channels.get(channel.id) is not channel:
            return
        try:
            self._handle_channel_frame(channel, frame_type, payload)
        except AMQPError as exc:
            if exc.class_id is None:
                exc.class_id, exc.method_id = self._failing_method(frame_type, channel.id, payload)
            self._error(channel.id, exc)
        except FrameError as exc:
            self.close_connection(exc.reply_code, exc.text, *self._failing_method(frame_type, channel.id, payload))
        except Exception:
            log.exception("internal error handling a frame", **self.log_id)
            self.close_connection(541, "internal error")

    def _handle_channel_frame(self, channel: Channel, frame_type: int, payload: Any) -> None:
        """A frame for an open channel, its turn come: the per-message frames go straight to the fast codec."""
        if frame_type == FRAME_PUBLISH:
            if channel.assembler.publish is None and self.has_published:
                channel.on_whole_publish(*payload)
            else:  # content was awaited (an error), or the first publish: the three frames one by one
                for part_type, _, part in split_publish(channel.id, payload):
                    self._handle_channel_frame(channel, part_type, part)
        elif frame_type == FRAME_BODY:
            channel.on_body(payload)
        elif frame_type == FRAME_HEADER:
            channel.on_header(payload)
        elif frame_type == FRAME_METHOD:
            if len(payload) < 4:
                raise FrameError("method frame shorter than its class and method id")
            index = _unpack_index(payload, 0)[0]
            if channel.assembler.publish is not None:
                channel.assembler.on_method()  # content is awaited: a method frame is unexpected (505)
            if index == IDX_BASIC_PUBLISH:
                if not self.has_published:
                    self._first_publish()
                channel.on_publish(payload)
            elif index == IDX_BASIC_ACK:
                channel.on_ack(*fastcodec.decode_ack(payload, 4))
            elif index == IDX_BASIC_NACK:
                channel.on_nack(*fastcodec.decode_nack(payload, 4))
            elif index == IDX_BASIC_REJECT:
                channel.on_reject(*fastcodec.decode_reject(payload, 4))
            else:
                self._channel_method(channel, index, payload)
        else:
            raise AMQPError(UNEXPECTED_FRAME, f"heartbeat frame on channel {channel.id}")

    def _channel_method(self, channel: Channel, index: int, payload: bytes) -> None:
        # The two methods answered here rather than by the channel come in their turn, like its other frames
        # (_channel_frame): their answer does not overtake the deferred replies of the methods before them.
        if index == _ACCESS_REQUEST:
            # access.request (class 30, deprecated): answered with request-ok, ticket 1, for old clients.
            self._access_request_ok(channel)
            return
        method = decode_method(payload)
        if isinstance(method, spec.Channel.Close):
            self._close_channel(channel)
        elif isinstance(method, spec.Channel.CloseOk):
            pass  # we never sent a close that this answers
        elif isinstance(method, spec.Channel.Open):
            raise AMQPError(CHANNEL_ERROR, "second 'channel.open' seen")
        elif method.index >> 16 == CLASS_CONNECTION:
            raise AMQPError(COMMAND_INVALID, f"{method.name} is only allowed on channel 0")
        else:
            channel.handle_method(method)

    def _access_request_ok(self, channel: Channel) -> None:
        self.send(encode_frame(FRAME_METHOD, channel.id, _ACCESS_REQUEST_OK))

    def _close_channel(self, channel: Channel) -> None:
        """The client's channel.close: the channel's resources released (its confirms settled so far go out
        first), close-ok, and the number free for a new channel.open."""
        self.node.counters.channels_closed += 1
        channel.shutdown()
        del self.channels[channel.id]
        self.send(method_frame(channel.id, spec.Channel.CloseOk))

    def _closing_channel_frame(self, channel_id: int, frame_type: int, payload: bytes) -> None:
        """The server closed this channel and waits for close-ok; everything else on it is dropped."""
        if frame_type != FRAME_METHOD:
            return
        index = method_index(payload)
        if index == spec.Channel.CloseOk.index:
            self.closing_channels = self.closing_channels - {channel_id}
        elif index == spec.Channel.Close.index:
            # Both sides closed at once: answer, but the number stays taken until our close is answered.
            self.send(method_frame(channel_id, spec.Channel.CloseOk))

    def _open_channel(self, channel_id: int) -> None:
        # Class and method 0 in the close, as RabbitMQ's reader refuses it (its create_channel raises the
        # not_allowed error with method 'none': the limit is the connection's, not channel.open's fault).
        if self.channel_max and len(self.channels) >= self.channel_max:
            raise AMQPError(NOT_ALLOWED, f"number of channels opened ({len(self.channels)}) has reached the "
                            f"negotiated channel_max ({self.channel_max})", 0, 0)
        limits.check_channel_open(self, self.node.connections)
        self.channels[channel_id] = Channel(self, channel_id)
        self.node.counters.channels_opened += 1
        self.send(method_frame(channel_id, spec.Channel.OpenOk))

    # -- flow control: alarms and credit ---------------------------------------------------------------
    def _first_publish(self) -> None:
        """A connection becomes a publisher: if an alarm is on, it is blocked from now on."""
        self.has_published = True
        alarms = self.node.alarm_state
        if alarms.active:
            self.block_for_alarm(alarms.reason())

    def block_for_alarm(self, reason: str) -> None:
        if self.blocked_by_alarm or self.state >= Reader.CLOSING:
            return
        self.blocked_by_alarm = True
        self.node.alarm_state.blocked.add(self)
        if self.client_capability("connection.blocked"):
            self.send(method_frame(0, spec.Connection.Blocked, reason=reason))
        self.pause_for("alarm")
        log.info("connection blocked", **self.log_id, reason=reason)

    def unblock_after_alarm(self) -> None:
        if not self.blocked_by_alarm:
            return
        self.blocked_by_alarm = False
        if self.state < Reader.CLOSING and self.client_capability("connection.blocked"):
            self.send(method_frame(0, spec.Connection.Unblocked))
        self.resume_for("alarm")
        log.info("connection unblocked", **self.log_id)

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self._loop.call_soon(self._next_turn)

    def _take_unread_slice(self) -> None:
        """Handle the next READ_BYTES_PER_TURN bytes of a large read; the rest waits for the next turn."""
        unread = self._unread
        assert unread is not None
        at = self._unread_at
        end = at + READ_BYTES_PER_TURN
        if end >= len(unread):
            self._unread = None
            end = len(unread)
        else:
            self._unread_at = end
        self._read_this_turn = end - at
        self._schedule_turn()
        self._take(unread[at:end])

    def _next_turn(self) -> None:
        self._turn_scheduled = False
        self._read_this_turn = 0
        self._turn_handovers = handovers.count
        held = self._held_frames
        if held is not None and self.state < Reader.CLOSED:
            if any(r != "turn" for r in self._pause_reasons):
                return  # credit flow or an alarm holds this connection: resume_for takes the rest up
            self._held_frames = None
            self._frames(*held)
            if self._held_frames is None and self._unread is not None:
                self._schedule_turn()  # the unread bytes next turn: this one has had its work
            elif self._held_frames is None:
                self.resume_for("turn")
            return
        self._held_frames = None
        if self._unread is not None and self.state < Reader.CLOSED:
            if any(r != "turn" for r in self._pause_reasons):
                return  # credit flow or an alarm holds this connection: resume_for takes the rest up
            self._take_unread_slice()
            return
        self._unread = None
        self.resume_for("turn")

    def pause_for(self, reason: object) -> None:
        """Stop reading the socket until every reason given here has been withdrawn (credit flow)."""
        if not self._pause_reasons and self.transport is not None:
            try:
                self.transport.pause_reading()
            except (RuntimeError, AttributeError):
                pass
        self._pause_reasons.add(reason)
        if reason not in _OWN_PAUSE_REASONS:
            self.flow_blocked_at = self.clock.monotonic()

    def resume_for(self, reason: object) -> None:
        if reason not in self._pause_reasons:
            return
        self._pause_reasons.discard(reason)
        if (self._unread is not None or self._held_frames is not None) and self._pause_reasons == {"turn"}:
            self._schedule_turn()  # the rest of a large read, held back while paused for another reason
            return
        if not self._pause_reasons and self.transport is not None and not self.transport.is_closing():
            try:
                self.transport.resume_reading()
            except (RuntimeError, AttributeError):
                pass

    @property
    def connection_state(self) -> str:
        """The state the management API shows (``rabbit_reader``'s ``state``): starting, tuning, opening
        during the handshake, closing and closed at the end. A running connection is "blocked" once a
        resource alarm blocked it, "blocking" while an alarm is on and it has not published (it is blocked
        at its first publish), else "flow" while a queue's credit flow holds its reading back and for
        ``FLOW_SHOWN_FOR`` seconds after that began, else "running"."""
        if self.state != Reader.RUNNING:
            return _STATE_NAMES[self.state]
        if self.blocked_by_alarm:
            return "blocked"
        if self.node.alarm_state.active:
            return "blocking"
        if self.flow_blocked_at and (
                self.clock.monotonic() - self.flow_blocked_at < FLOW_SHOWN_FOR
                or any(r not in _OWN_PAUSE_REASONS for r in self._pause_reasons)):
            return "flow"
        return "running"

    # -- connection class ------------------------------------------------------------------------------
    def _connection_method(self, payload: bytes) -> None:
        method = decode_method(payload)
        state = self.state
        if isinstance(method, spec.Connection.Close):
            # Channels first (RabbitMQ shuts them down before close-ok): confirms they have ready go out
            # now, and nothing of theirs can follow close-ok.
            self._cleanup()
            self.send(method_frame(0, spec.Connection.CloseOk))
            log.info("connection closed", **self.log_id, user=self.user.name,
                     reply_code=method.reply_code, reason=method.reply_text)
            self._await_client_close()
        elif state == Reader.STARTING and isinstance(method, spec.Connection.StartOk):
            self._start_ok(method)
        elif state == Reader.TUNING and isinstance(method, spec.Connection.TuneOk):
            self._tune_ok(method)
        elif state == Reader.OPENING and isinstance(method, spec.Connection.Open):
            self._open(method)
        elif state == Reader.RUNNING and isinstance(method, spec.Connection.CloseOk):
            self._close_transport()
        elif state == Reader.RUNNING and isinstance(method, (spec.Connection.Blocked, spec.Connection.Unblocked)):
            pass
        elif state == Reader.RUNNING and isinstance(method, spec.Connection.UpdateSecret):
            self._update_secret(method)
        else:
            state_name = {Reader.TUNING: "tuning", Reader.OPENING: "opening"}.get(state, "running")
            raise AMQPError(CHANNEL_ERROR, f"unexpected method in connection state {state_name}",
                            *method_ids(method))

    def _start(self) -> None:
        self.state = Reader.STARTING
        self.send(method_frame(0, spec.Connection.Start, version_major=0, version_minor=9,
                               server_properties=server_properties(self.node.cluster_name), mechanisms=" ".join(self._mechanisms()),
                               locales="en_US"))

    def _mechanisms(self) -> list[str]:
        """The configured SASL mechanisms; EXTERNAL only to a client whose certificate was verified (as
        RabbitMQ's should_offer)."""
        settings = self.settings
        return [m for m in settings.auth_mechanisms
                if m != "EXTERNAL" or peer_login_name(self.transport, settings.ssl_cert_login_from) is not None]

    def _start_ok(self, m: spec.Connection.StartOk) -> None:
        self.client_properties = dict(m.client_properties or {})
        self.auth_mechanism = str(m.mechanism)
        response = m.response.encode("latin-1") if isinstance(m.response, str) else bytes(m.response)
        settings = self.settings
        users = self.node.users
        result: User | str
        if m.mechanism not in self._mechanisms():
            result = f"unsupported authentication mechanism '{m.mechanism}'"
        elif m.mechanism == "EXTERNAL":
            result = users.authenticate_external(peer_login_name(self.transport, settings.ssl_cert_login_from),
                                                 self.peer[0], settings.loopback_users)
        else:
            result = users.authenticate(m.mechanism, response, self.peer[0], settings.loopback_users)
        counters = self.node.counters
        counters.auth_attempts += 1
        if isinstance(result, str):
            counters.auth_attempts_failed += 1
            log.warning("authentication failed", **self.log_id, reason=result)
            if self.client_capability("authentication_failure_close"):
                self.close_connection(ACCESS_REFUSED, result, CLASS_CONNECTION, 11)
            else:
                self._close_transport()
            return
        counters.auth_attempts_succeeded += 1
        self.user = result
        self.state = Reader.TUNING
        self.send(method_frame(0, spec.Connection.Tune, channel_max=self.settings.channel_max,
                               frame_max=self.settings.frame_max, heartbeat=self.settings.heartbeat))

    def _tune_ok(self, m: spec.Connection.TuneOk) -> None:
        """Check the client's choices as RabbitMQ's ``validate_negotiated_integer_value`` does. frame_max may
        go down to the spec's 4096; the frames we send are then split to fit (``send_content``).

        A refused choice gets no connection.close: RabbitMQ (3.10 through 4.x, checked against 3.10.8) logs
        "failed to negotiate connection parameters", sends nothing and closes the socket after
        ``NEGOTIATION_FAILURE_DELAY`` seconds, and so does Leveret."""
        for field, minimum, client, server in (
            ("frame_max", TUNE_FRAME_MIN, m.frame_max, self.settings.frame_max),
            ("channel_max", 1, m.channel_max, self.settings.channel_max),
        ):
            if client and client < minimum:
                self._fail_negotiation(f"negotiated {field} = {client} is lower than the minimum allowed value "
                                       f"({minimum})")
                return
            if server and (client == 0 or client > server):
                detail = " (no limit)" if field == "channel_max" and client == 0 else ""
                self._fail_negotiation(f"negotiated {field} = {client}{detail} is higher than the maximum "
                                       f"allowed value ({server})")
                return
        self.frame_max = m.frame_max
        self.parser.frame_max = m.frame_max
        self.channel_max = m.channel_max
        self.heartbeat = m.heartbeat
        self.state = Reader.OPENING
        if self.heartbeat:
            self._schedule_heartbeat()

    def _fail_negotiation(self, reason: str) -> None:
        """Tune-ok broke a limit: nothing more is read or sent; the socket closes after a delay."""
        log.warning("failed to negotiate connection parameters", **self.log_id, reason=reason)
        self.state = Reader.CLOSING
        if self.transport is not None:
            self.transport.pause_reading()
        self._timers = [*self._timers, self.clock.call_later(NEGOTIATION_FAILURE_DELAY, self._close_transport)]

    def _open(self, m: spec.Connection.Open) -> None:
        refusal = limits.connection_refusal(self.node, self.user, m.virtual_host) \
            or self.node.vhost_access_error(self.user, m.virtual_host)
        if refusal is not None:
            self.close_connection(NOT_ALLOWED, refusal, CLASS_CONNECTION, 40)
            return
        self.vhost = self.node.vhosts[m.virtual_host]
        self.node.counters.connections_opened += 1
        self.state = Reader.RUNNING
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if self.heartbeat:
            self._schedule_heartbeat()
        self.send(method_frame(0, spec.Connection.OpenOk))
        log.info("connection opened", **self.log_id, user=self.user.name, vhost=self.vhost.name)

    def _update_secret(self, m: spec.Connection.UpdateSecret) -> None:
        """connection.update-secret (an OAuth 2 client refreshing its token): RabbitMQ asks each auth
        backend whose state can expire to take the new secret, and skips the others. Leveret's users are
        the internal backend's, whose state never expires (``expiry_timestamp`` is ``never``), so, as in
        RabbitMQ, the secret is not checked and the same user goes on: update-secret-ok. A backend that
        checks it would refuse with 530 "New secret was refused by one of the backends"."""
        log.info("connection: user updated secret", **self.log_id, user=self.user.name,
                 reason=m.reason if isinstance(m.reason, str) else repr(m.reason))
        self.send(method_frame(0, spec.Connection.UpdateSecretOk))

    def client_capability(self, name: str) -> bool:
        caps = self.client_properties.get("capabilities")
        return bool(isinstance(caps, dict) and caps.get(name))

    # -- heartbeats ------------------------------------------------------------------------------------
    def _schedule_heartbeat(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = [self.clock.call_later(self.heartbeat / 2, self._heartbeat_tick)]

    def _heartbeat_tick(self) -> None:
        """Every half interval: send a heartbeat if we sent nothing; count the halves the peer was silent.
        Four silent halves are two missed heartbeats: the peer is dead (RabbitMQ's rule)."""
        if self.state >= Reader.CLOSING:
            return
        if self._received_since_tick:
            self._received_since_tick = False
            self._missed_heartbeats = 0
        else:
            self._missed_heartbeats += 1
            if self._missed_heartbeats >= 4:
                log.warning("missed heartbeats from client, closing connection", **self.log_id,
                            timeout=self.heartbeat)
                self._close_transport()
                return
        if not self._sent_since_tick:
            self.send(HEARTBEAT_FRAME)
        self._sent_since_tick = False
        self._timers = [self.clock.call_later(self.heartbeat / 2, self._heartbeat_tick)]

    def _handshake_timeout(self) -> None:
        self._handshake_timer = None
        if self.state < Reader.RUNNING:
            stage = {Reader.HANDSHAKE: "protocol header", Reader.STARTING: "connection.start-ok",
                     Reader.TUNING: "connection.tune-ok", Reader.OPENING: "connection.open"}[self.state]
            log.warning("handshake timeout, closing", **self.log_id, waiting_for=stage,
                        timeout=self.settings.handshake_timeout)
            self._close_transport()

    # -- errors and closing ----------------------------------------------------------------------------
    def _refuse_protocol(self, exc: BadProtocolHeader) -> None:
        reasons = {"http": "an HTTP request was sent to the AMQP port",
                   "tls": "a TLS handshake was sent to the plain AMQP port",
                   "amqp": f"unsupported AMQP protocol header {exc.received!r}",
                   "garbage": f"not an AMQP protocol header: {exc.received!r}"}
        log.warning("refused connection", **self.log_id, reason=reasons[exc.kind])
        if self.transport is not None:
            self.transport.write(PROTOCOL_HEADER)
        self._close_transport()

    def channel_error(self, channel_id: int, exc: AMQPError) -> None:
        """An error found outside frame handling (a timer): reported like one found in a frame."""
        self._error(channel_id, exc)

    def _error(self, channel_id: int, exc: AMQPError) -> None:
        if exc.is_soft and channel_id != 0 and channel_id in self.channels:
            channel = self.channels.pop(channel_id)
            self.node.counters.channels_closed += 1
            log.warning("channel error", **self.log_id, channel=channel_id, reply_code=exc.reply_code,
                        reply_text=exc.reply_text)
            # The client's channel.close may be waiting behind the failing method (in the channel's backlog);
            # shutdown drops it with the other waiting frames.
            client_closed = any(frame_type == FRAME_METHOD and method_index(payload) == _CHANNEL_CLOSE
                                for frame_type, payload in channel.pipeline.frames())
            channel.shutdown()
            self.closing_channels = self.closing_channels | {channel_id}
            self.send(method_frame(channel_id, spec.Channel.Close, reply_code=exc.reply_code,
                                   reply_text=exc.reply_text, class_id=exc.class_id or 0,
                                   method_id=exc.method_id or 0))
            if client_closed:
                # Answered as one that comes after ours (_closing_channel_frame): both sides closed at once.
                self.send(method_frame(channel_id, spec.Channel.CloseOk))
        else:
            self.close_connection(exc.reply_code, exc.text, exc.class_id or 0, exc.method_id or 0)

    def close_connection(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Send connection.close and wait (briefly) for close-ok; only close-ok is read from now on."""
        if self.state >= Reader.CLOSING:
            return
        err = AMQPError(code, text)
        log.warning("closing connection with error", **self.log_id, reply_code=code, reason=text)
        if self.state == Reader.HANDSHAKE:
            self._close_transport()
            return
        self.state = Reader.CLOSING
        self._cleanup()
        self.send(method_frame(0, spec.Connection.Close, reply_code=code, reply_text=err.reply_text,
                               class_id=class_id, method_id=method_id))
        self._timers = [*self._timers, self.clock.call_later(CLOSE_OK_TIMEOUT, self._close_transport)]

    def force_close(self, text: str = "closed via management") -> None:
        if self._close_ok_sent:
            self._close_transport()  # closed already, waiting for the client to drop the socket
            return
        self.close_connection(CONNECTION_FORCED, text)

    def _await_client_close(self) -> None:
        """The client's connection.close is answered: the socket is the client's to close (RabbitMQ's
        ``close_connection`` leaves it open in state ``closed`` and ignores every frame but close-ok until
        the client closes it, or for the heartbeat timeout, at most 30 s).

        Closing it here at once would lose frames the client is still writing: a client that sends
        connection.close ahead of publishes it had buffered (amqplib writes channel 0 before a busy channel's
        backlog) would get a reset, not close-ok (EPIPE in amqplib's "find high watermark" test). The bytes
        that follow are read and dropped, whatever paused reading before."""
        self.state = Reader.CLOSING
        self._close_ok_sent = True
        for timer in self._timers:
            timer.cancel()
        timeout = self.heartbeat if 0 < self.heartbeat < CLIENT_CLOSE_TIMEOUT else CLIENT_CLOSE_TIMEOUT
        self._timers = [self.clock.call_later(timeout, self._close_transport)]
        self._unread = None
        self._held_frames = None
        if self._pause_reasons:
            self._pause_reasons.clear()
            if self.transport is not None and not self.transport.is_closing():
                try:
                    self.transport.resume_reading()
                except (RuntimeError, AttributeError):
                    pass

    def _cleanup(self) -> None:
        """Release channels (requeueing their unacked messages) and delete the exclusive queues."""
        self.node.alarm_state.blocked.discard(self)
        for channel in list(self.channels.values()):
            self.node.counters.channels_closed += 1
            channel.shutdown()
        self.channels.clear()
        for q in list(self.exclusive_queues):
            q.vhost.queues.delete(q, reason="exclusive owner closed")
        self.exclusive_queues.clear()

    def _close_transport(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._flush()
            self.transport.close()
        self.state = max(self.state, Reader.CLOSING)
        self._cleanup()

    # -- output ----------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send_content(self, channel_id: int, header: bytes, body: bytes) -> None:
        self._out.extend(fastcodec.encode_content(channel_id, header, body, self.frame_max))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send_delivery(self, channel_id: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool,
                      names_raw: bytes, header: bytes, body: bytes) -> None:
        """basic.deliver and its content: a small message as one piece (fastcodec.encode_delivery_into)."""
        fastcodec.encode_delivery_into(self._out, channel_id, consumer_tag_raw, delivery_tag, redelivered, names_raw,
                                       header, body, self.frame_max)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def confirms_pending(self, channel: Channel) -> None:
        pending = self._confirm_channels
        if pending:
            pending.append(channel)  # (a non-empty one is a list)
        else:
            self._confirm_channels = [channel]
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._confirm_channels:
            channels = self._confirm_channels
            self._confirm_channels = ()
            for ch in channels:
                ch.flush_confirms()
        out = self._out
        if not out:
            return
        self._out = []
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._sent_since_tick = True
        data = b"".join(out)
        io = self._io
        io[2] += len(data)
        io[3] += 1
        transport.write(data)


def publish_run_end(frames: list[Frame], start: int, count: int) -> int:
    """The end of the run of whole publishes that begins at ``frames[start]`` (a FRAME_PUBLISH item): the
    index of the first frame after it that is not a whole publish on the same channel with the same method
    payload (exchange, routing key, flags) and the same content header (so the same properties and size)."""
    _, channel_id, (method, header, _) = frames[start]
    end = start + 1
    while end < count:
        frame_type, other_channel, parts = frames[end]
        if frame_type != FRAME_PUBLISH or other_channel != channel_id or parts[0] != method or parts[1] != header:
            break
        end += 1
    return end


def split_publish(channel_id: int, parts: Any) -> list[tuple[int, int, bytes]]:
    """A FRAME_PUBLISH item as the three frames it was parsed from, for the paths that take them one by one.
    ``parts``: the item's payload, (method, header, body) (typed as the parser's list of frames types it)."""
    method, header, body = parts
    return [(FRAME_METHOD, channel_id, method), (FRAME_HEADER, channel_id, header), (FRAME_BODY, channel_id, body)]


def open_connections(node: Node) -> list[Reader]:
    """The node's client connections as readers, for the modules above the reader (the HTTP API, the
    exporter, the server). The node holds them as ``ClientConnection`` (it sits below the reader); every one
    it holds is a Reader, so the check only narrows the type."""
    return [conn for conn in node.connections if isinstance(conn, Reader)]
