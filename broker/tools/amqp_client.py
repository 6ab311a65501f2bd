"""A minimal asyncio AMQP 0-9-1 client made for the load generator, not for applications.

One connection carries one channel (number 1), like PerfTest's producers and consumers. The handshake and
the rare methods (declare, bind, qos, consume, confirm.select, close) go through pamqp; the frames every
message crosses never do:

* publishing writes pre-encoded bytes: :class:`PublishTemplate` builds method + content header + body frame
  once; a batch of n messages is ``(head + timestamp + tail) * n`` — one concatenation, one memcpy and one
  ``transport.write`` per batch, whatever n is;
* deliveries are parsed in :meth:`Connection.data_received` with precompiled structs straight from the
  receive buffer (frame head, class/method, delivery tag, body size, the 8-byte timestamp at the start of
  the body); latencies go into an integer histogram, not a list;
* manual acks are one ``basic.ack(multiple=true)`` per socket read, for the highest tag in that read;
* publisher confirms (basic.ack / basic.nack from the broker) are read the same way;
* on a stream (``track_offsets``), the ``x-stream-offset`` header of each delivery is found with one
  ``bytearray.find`` in its content header and marked in a bitmap shared by the worker's consumers, so that
  a consumer group's deliveries can be checked for exactly-once (a non-redelivered offset seen twice is a
  duplicate). Off, it costs one ``is not None`` test per delivery.

Latency: the body of every message starts with ``time.monotonic_ns()`` taken just before its batch was
written (8 bytes, big-endian). CLOCK_MONOTONIC is system-wide, so producer and consumer may be in different
processes on the same machine. The receive time is read once per socket read.

TLS: an ``amqps://`` URL (port 5671 unless given) connects over TLS; its ``cacertfile`` query parameter (the
name RabbitMQ's URI spec uses) is the CA the server certificate is checked against, else the system's CAs.
The TLS layer is the event loop's (uvloop's in the workers); the AMQP code above it is the same.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import time
from collections.abc import Sequence
from typing import Any, Protocol, cast
from urllib.parse import parse_qs, unquote, urlparse

from pamqp import base, commands
from pamqp import frame as pframe
from pamqp.common import FieldTable

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
CLIENT_FRAME_MAX = 131072

_HEAD = struct.Struct(">BHI")
_CLASS_METHOD = struct.Struct(">HH")
_U64 = struct.Struct(">Q")
_TAG_BITS = struct.Struct(">QB")
_METHOD_HEAD = struct.Struct(">BHIHH")
_CONTENT_HEADER = struct.Struct(">BHIHHQH")  # frame head + class, weight, body size, property flags
_ACK_PREFIX = _METHOD_HEAD.pack(FRAME_METHOD, 1, 13, 60, 80)
# A delivery's x-stream-offset header: field name (shortstr), then the value's type byte. RabbitMQ and Leveret
# send a long ('l', signed 64 bits); the other integer types are read too.
_OFFSET_KEY = b"\x0fx-stream-offset"
_OFFSET_TYPES = {ord("l"): struct.Struct(">q"), ord("L"): struct.Struct(">Q"), ord("I"): struct.Struct(">i"),
                 ord("i"): struct.Struct(">I")}
_monotonic_ns = time.monotonic_ns

# Latency histogram: microsecond buckets, exact below 2048 µs, then 1024 buckets per power of two
# (precision 0.1 %). Index → value with hist_value().
HIST_SIZE = 48 * 1024


def new_hist() -> list[int]:
    return [0] * HIST_SIZE


def hist_value(idx: int) -> float:
    if idx < 2048:
        return float(idx)
    s = (idx >> 10) - 1
    m = idx - (s << 10)
    return float((m << s) + (1 << (s - 1)))


def hist_percentiles(hist: list[int], quantiles: Sequence[float] = (0.5, 0.99, 0.999)) -> dict[str, Any]:
    total = sum(hist)
    out: dict[str, Any] = {"count": total}
    if not total:
        for q in quantiles:
            out[_qname(q)] = None
        out["max"] = None
        out["mean"] = None
        return out
    targets = sorted((max(1, int(q * total + 0.999999)), _qname(q)) for q in quantiles)
    acc = 0
    ti = 0
    weighted = 0.0
    last = 0
    for idx, n in enumerate(hist):
        if not n:
            continue
        acc += n
        v = hist_value(idx)
        weighted += v * n
        last = idx
        while ti < len(targets) and acc >= targets[ti][0]:
            out[targets[ti][1]] = v
            ti += 1
    out["max"] = hist_value(last)
    out["mean"] = round(weighted / total, 1)
    return out


def _qname(q: float) -> str:
    return "p" + (f"{q * 100:.1f}".rstrip("0").rstrip(".")).replace(".", "")


def merge_hists(hists: list[list[int]]) -> list[int]:
    out = new_hist()
    for h in hists:
        for i, n in enumerate(h):
            if n:
                out[i] += n
    return out


class AMQPError(Exception):
    pass


def parse_url(url: str) -> tuple[str, int, str, str, str]:
    u = urlparse(url)
    if u.scheme not in ("amqp", "amqps", ""):
        raise ValueError(f"only amqp:// and amqps:// URLs are supported, got {url!r}")
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return (u.hostname or "127.0.0.1", u.port or (5671 if u.scheme == "amqps" else 5672),
            unquote(u.username or "guest"), unquote(u.password or "guest"), vhost)


_ssl_contexts: dict[str, ssl.SSLContext] = {}


def ssl_context(url: str) -> ssl.SSLContext | None:
    """None for amqp://; for amqps:// a client context that checks the server's certificate and host name
    against ``?cacertfile=PATH`` (else the system's CAs). One context per CA file and process."""
    u = urlparse(url)
    if u.scheme != "amqps":
        return None
    cafile = (parse_qs(u.query).get("cacertfile") or [""])[0]
    ctx = _ssl_contexts.get(cafile)
    if ctx is None:
        ctx = _ssl_contexts[cafile] = ssl.create_default_context(cafile=cafile or None)
    return ctx


class PublishTemplate:
    """basic.publish + content header + one body frame, pre-encoded, split around the 8-byte timestamp."""

    __slots__ = ("head", "tail", "timestamped", "wire_size")

    def __init__(self, exchange: str, routing_key: str, body_size: int, persistent: bool,
                 channel: int = 1) -> None:
        ex = exchange.encode()
        rk = routing_key.encode()
        args = b"\x00\x00" + bytes([len(ex)]) + ex + bytes([len(rk)]) + rk + b"\x00"
        method = _METHOD_HEAD.pack(FRAME_METHOD, channel, len(args) + 4, 60, 40) + args + b"\xce"
        if persistent:  # delivery-mode (flag bit 12) = 2
            header = _CONTENT_HEADER.pack(FRAME_HEADER, channel, 15, 60, 0, body_size, 0x1000) + b"\x02\xce"
        else:  # no properties at all: transient
            header = _CONTENT_HEADER.pack(FRAME_HEADER, channel, 14, 60, 0, body_size, 0) + b"\xce"
        if body_size > CLIENT_FRAME_MAX - 8:
            raise ValueError("bodies larger than one frame are not supported by the load generator")
        body_head = _HEAD.pack(FRAME_BODY, channel, body_size) if body_size else b""
        self.timestamped = body_size >= 8
        if self.timestamped:
            self.head = method + header + body_head
            self.tail = b"\x00" * (body_size - 8) + b"\xce"
        else:
            self.head = method + header + body_head + b"\x00" * body_size + (b"\xce" if body_size else b"")
            self.tail = b""
        self.wire_size = len(self.head) + len(self.tail) + (8 if self.timestamped else 0)

    def batch(self, n: int) -> bytes:
        if self.timestamped:
            return (self.head + _U64.pack(_monotonic_ns()) + self.tail) * n
        return self.head * n


class ConfirmListener(Protocol):
    """Who hears a confirm-mode channel's basic.ack / basic.nack (perf.py's Publisher)."""

    def on_confirm(self, tag: int, multiple: int, nack: bool) -> None: ...


class Connection(asyncio.Protocol):
    """One AMQP connection with one channel. Consumer state is kept here as plain attributes so the delivery
    parser touches no other object per message."""

    def __init__(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                 name: str = "leveret-perf") -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.user, self.password, self.vhost, self.name = user, password, vhost, name
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.frame_max = CLIENT_FRAME_MAX
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.error: str | None = None
        self._rpc_waiter: asyncio.Future[Any] | None = None  # the reply: a pamqp method (see rpc)
        # flow control: TCP (pause_writing) and connection.blocked
        self.paused = False
        self.blocked = False
        self._writable: asyncio.Future[None] | None = None
        # consumer state
        self.consumed = 0
        self.last_tag = 0
        self.acked_tag = 0
        self.manual_ack = False
        self.hist: list[int] | None = None  # set to record latencies
        self._body_left = -1  # -1: no content expected; else bytes of body still to come
        self._ts = 0
        self.cancelled = False
        # stream offsets (track_offsets): bitmaps shared by a worker's consumers, of the offsets delivered first
        # (``seen``) and of those delivered again with redelivered=true (``again``: a group hands a member's
        # unsettled offsets to another member, maybe of another worker, and that is no duplicate)
        self.seen: bytearray | None = None
        self.again: bytearray | None = None
        self.duplicates = 0       # offsets delivered again without redelivered=true
        self.redelivered = 0
        self.no_offset = 0        # deliveries without an x-stream-offset header
        self.min_offset = -1
        self.max_offset = -1
        self._redeliv = 0
        # publisher confirms: the publisher object gets on_confirm(tag, multiple, nack)
        self.confirm_listener: ConfirmListener | None = None
        self.returned = 0

    # -- asyncio.Protocol ---------------------------------------------------------------------------------
    @property
    def wire(self) -> asyncio.Transport:
        """The transport of a connected connection, for callers that write raw batches (bench/)."""
        if self.transport is None:
            raise ConnectionError(f"{self.name}: not connected")
        return self.transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # a TCP (or TLS) connection's is one
        transport.set_write_buffer_limits(high=512 * 1024, low=128 * 1024)
        transport.write(PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None and not self.closed.done() and exc is not None:
            self.error = f"connection lost: {exc}"
        for fut in (self.opened, self._rpc_waiter):
            if fut is not None and not fut.done():
                fut.set_exception(AMQPError(self.error or "connection closed"))
        if not self.closed.done():
            self.closed.set_result(None)
        self.paused = False
        self._wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def _wake(self) -> None:
        w = self._writable
        if w is not None and not w.done():
            w.set_result(None)
        self._writable = None

    async def wait_writable(self) -> None:
        if self.closed.done():
            return
        if self._writable is None:
            self._writable = self.loop.create_future()
        await self._writable

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = len(buf)
        pos = 0
        unpack_head = _HEAD.unpack_from
        u64 = _U64.unpack_from
        hist = self.hist
        body_left = self._body_left
        ts = self._ts
        consumed = self.consumed
        last_tag = self.last_tag
        now = 0
        while end - pos >= 8:
            ftype, _ch, size = unpack_head(buf, pos)
            stop = pos + 7 + size
            if stop >= end:
                break
            if ftype == FRAME_BODY:
                if size >= 8 and body_left == self._body_size:
                    ts = u64(buf, pos + 7)[0]
                body_left -= size
                if body_left <= 0:
                    consumed += 1
                    body_left = -1
                    if hist is not None and ts:
                        if not now:
                            now = _monotonic_ns()
                        d = (now - ts) // 1000
                        if d < 2048:
                            hist[d if d > 0 else 0] += 1  # noqa: FURB136 - max() is a call per message
                        else:
                            s = d.bit_length() - 11
                            i = (s << 10) + (d >> s)
                            hist[i if i < HIST_SIZE else HIST_SIZE - 1] += 1
                    ts = 0
            elif ftype == FRAME_HEADER:
                body_left = u64(buf, pos + 11)[0]
                if self.seen is not None:
                    self._mark_offset(buf, pos + 21, stop)
                self._body_size = body_left
                if body_left == 0:
                    consumed += 1
                    body_left = -1
            elif ftype == FRAME_METHOD:
                cls, meth = _CLASS_METHOD.unpack_from(buf, pos + 7)
                if cls == 60 and meth == 60:  # basic.deliver
                    last_tag = u64(buf, pos + 12 + buf[pos + 11])[0]
                    if self.seen is not None:
                        self._redeliv = buf[pos + 20 + buf[pos + 11]] & 1
                elif cls == 60 and (meth == 80 or meth == 120):  # confirm ack / nack
                    tag, bits = _TAG_BITS.unpack_from(buf, pos + 11)
                    if self.confirm_listener is not None:
                        self.confirm_listener.on_confirm(tag, bits & 1, meth == 120)
                else:
                    self._on_method(bytes(buf[pos:stop + 1]))
            pos = stop + 1
        if pos:
            del buf[:pos]
        self._body_left = body_left
        self._ts = ts
        self.consumed = consumed
        self.last_tag = last_tag
        if self.manual_ack and last_tag > self.acked_tag and self.transport is not None:
            self.transport.write(_ACK_PREFIX + _TAG_BITS.pack(last_tag, 1) + b"\xce")
            self.acked_tag = last_tag

    _body_size = 0

    def _mark_offset(self, buf: bytearray, start: int, stop: int) -> None:
        """Record the x-stream-offset of the delivery whose content header spans ``buf[start:stop]``."""
        i = buf.find(_OFFSET_KEY, start, stop)
        st = _OFFSET_TYPES.get(buf[i + 16]) if i >= 0 else None
        if st is None:
            self.no_offset += 1
            return
        off = st.unpack_from(buf, i + 17)[0]
        if off < 0:
            self.no_offset += 1
            return
        seen = self.seen
        if seen is None:  # called only while offsets are recorded
            return
        if self._redeliv:
            self.redelivered += 1
            seen = self.again if self.again is not None else seen
        idx = off >> 3
        if idx >= len(seen):
            seen.extend(bytes(max(idx + 1 - len(seen), len(seen), 4096)))  # in place: shared by the worker
        bit = 1 << (off & 7)
        if not self._redeliv and seen[idx] & bit:
            self.duplicates += 1
        seen[idx] |= bit
        if off > self.max_offset:  # noqa: PLR1730 - max() is a call per message
            self.max_offset = off
        if self.min_offset < 0 or off < self.min_offset:
            self.min_offset = off

    # -- the rare methods, through pamqp --------------------------------------------------------------------
    def send(self, method: base.Frame, channel: int = 1) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(pframe.marshal(method, channel))

    def _on_method(self, raw: bytes) -> None:
        try:
            _n, channel, m = pframe.unmarshal(raw)
        except Exception as exc:  # noqa: BLE001 - a frame we cannot decode ends the connection
            self._fail(f"undecodable frame: {exc}")
            return
        if isinstance(m, commands.Connection.Start):
            props: FieldTable = {"product": "leveret-perf", "connection_name": self.name,
                     "capabilities": {"publisher_confirms": True, "basic.nack": True,
                                      "connection.blocked": True, "consumer_cancel_notify": True}}
            self.send(commands.Connection.StartOk(
                client_properties=props, mechanism="PLAIN",
                response=f"\0{self.user}\0{self.password}", locale="en_US"), 0)
        elif isinstance(m, commands.Connection.Tune):
            fm = m.frame_max or CLIENT_FRAME_MAX
            self.frame_max = min(fm, CLIENT_FRAME_MAX)
            self.send(commands.Connection.TuneOk(channel_max=m.channel_max or 2047, frame_max=self.frame_max,
                                                 heartbeat=0), 0)
            self.send(commands.Connection.Open(virtual_host=self.vhost), 0)
        elif isinstance(m, commands.Connection.OpenOk):
            if not self.opened.done():
                self.opened.set_result(None)
        elif isinstance(m, commands.Connection.Close):
            self.send(commands.Connection.CloseOk(), 0)
            self._fail(f"connection.close {m.reply_code} {m.reply_text}")
            if self.transport is not None:
                self.transport.close()
        elif isinstance(m, commands.Connection.CloseOk):
            if self.transport is not None:
                self.transport.close()
        elif isinstance(m, commands.Connection.Blocked):
            self.blocked = True
        elif isinstance(m, commands.Connection.Unblocked):
            self.blocked = False
            self._wake()
        elif isinstance(m, commands.Channel.Close):
            self.send(commands.Channel.CloseOk(), channel)
            self._fail(f"channel.close {m.reply_code} {m.reply_text} (class {m.class_id} method {m.method_id})")
        elif isinstance(m, commands.Basic.Cancel):
            self.cancelled = True
        elif isinstance(m, commands.Basic.Return):
            self.returned += 1
        else:
            w = self._rpc_waiter
            if w is not None and not w.done():
                w.set_result(m)

    def _fail(self, text: str) -> None:
        if self.error is None:
            self.error = text
        for fut in (self.opened, self._rpc_waiter):
            if fut is not None and not fut.done():
                fut.set_exception(AMQPError(text))
        self._wake()

    async def rpc(self, method: base.Frame, timeout: float = 30.0) -> Any:
        """Send ``method`` on channel 1 and return the reply: the next method not handled here, a pamqp method
        whose class the request implies (Any, so that callers read its fields, e.g. ``message_count``)."""
        if self.error:
            raise AMQPError(self.error)
        self._rpc_waiter = fut = self.loop.create_future()
        self.send(method)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._rpc_waiter = None

    async def close(self, timeout: float = 2.0) -> None:
        if self.transport is None or self.closed.done():
            return
        self.send(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        except (TimeoutError, Exception):  # noqa: BLE001
            self.transport.abort()

    def start_consuming_state(self, manual_ack: bool, record_latency: bool) -> None:
        self.manual_ack = manual_ack
        if record_latency and self.hist is None:
            self.hist = new_hist()


async def connect(url: str, name: str = "leveret-perf", timeout: float = 60.0,
                  local_host: str | None = None) -> Connection:
    """``local_host``: the source address to connect from (a loopback address of 127/8 other than the server's
    gives another 28,000 ephemeral ports, for the 50,000-connection cost curve)."""
    host, port, user, password, vhost = parse_url(url)
    loop = asyncio.get_running_loop()
    _t, conn = await asyncio.wait_for(
        loop.create_connection(lambda: Connection(user, password, vhost, name), host, port,
                               ssl=ssl_context(url), local_addr=(local_host, 0) if local_host else None), timeout)
    try:
        await asyncio.wait_for(asyncio.shield(conn.opened), timeout)
        await conn.rpc(commands.Channel.Open(), timeout)
    except BaseException:
        if conn.transport is not None:
            conn.transport.abort()
        raise
    return conn
