"""A fake broker that measures the load generator's own ceiling.

It answers the handshake and the setup methods minimally, then:

* on a connection that publishes, it stops parsing at the first basic.publish and discards every byte after it
  (so its cost per message is a read syscall per 256 KiB, not a parse);
* on basic.consume it streams pre-encoded basic.deliver + header + body frames as fast as the socket takes them
  (ignoring prefetch and acks), so the client's delivery parser is the only thing measured.

Confirms are not answered (a sink cannot confirm without parsing); run the ceiling test without --confirm.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from pamqp import base, commands
from pamqp import frame as pframe

from broker.tools.amqp_client import _U64, PublishTemplate

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

_HEAD = struct.Struct(">BHI")


def _delivery_batch(body_size: int, n: int = 512) -> bytes:
    tag = b"perf"
    parts = []
    for i in range(n):
        args = b"\x00\x3c\x00\x3c" + bytes([len(tag)]) + tag + _U64.pack(i + 1) + b"\x00" + b"\x00" + b"\x04perf"
        parts.append(_HEAD.pack(1, 1, len(args)) + args + b"\xce")
        t = PublishTemplate("", "perf", body_size, False)
        # reuse the publish template's header + body frames (skip its method frame)
        full = t.head + (_U64.pack(0) if t.timestamped else b"") + t.tail
        mlen = 7 + _HEAD.unpack_from(full, 0)[2] + 1
        parts.append(full[mlen:])
    return b"".join(parts)


class SinkProtocol(asyncio.Protocol):
    def __init__(self, body_size: int) -> None:
        self.body_size = body_size
        self.buf = bytearray()
        self.header_seen = False
        self.discard = False
        self.streaming = False
        self.paused = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # a TCP connection's is one
        transport.set_write_buffer_limits(high=1 << 20, low=256 << 10)

    def _send(self, m: base.Frame, ch: int) -> None:
        assert self.transport is not None  # set by connection_made before any frame arrives
        self.transport.write(pframe.marshal(m, ch))

    def data_received(self, data: bytes) -> None:
        if self.discard:
            return
        buf = self.buf
        buf += data
        pos = 0
        if not self.header_seen:
            if len(buf) < 8:
                return
            self.header_seen = True
            pos = 8
            self._send(commands.Connection.Start(server_properties={"product": "leveret-perf-sink"},
                                                 mechanisms="PLAIN", locales="en_US"), 0)
        end = len(buf)
        while end - pos >= 8:
            ftype, ch, size = _HEAD.unpack_from(buf, pos)
            stop = pos + 7 + size
            if stop >= end:
                break
            if ftype == 1:
                cls, meth = struct.unpack_from(">HH", buf, pos + 7)
                if cls == 60 and meth == 40:  # basic.publish: from here on, only discard
                    self.discard = True
                    self.buf = bytearray()
                    return
                if not (cls == 60 and meth == 80):  # acks from a consumer are ignored
                    self._method(pframe.unmarshal(bytes(buf[pos:stop + 1]))[2], ch)
            pos = stop + 1
        del buf[:pos]

    def _method(self, m: Any, ch: int) -> None:
        """Answer a client method. ``m`` is Any: a decoded pamqp method, whose fields the reply to it reads."""
        C = commands
        replies: dict[type[base.Frame], Callable[[], base.Frame]] = {
            C.Connection.StartOk: lambda: C.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=0),
            C.Connection.Open: lambda: C.Connection.OpenOk(),
            C.Channel.Open: lambda: C.Channel.OpenOk(),
            C.Queue.Declare: lambda: C.Queue.DeclareOk(queue=m.queue or "q", message_count=0, consumer_count=0),
            C.Queue.Bind: lambda: C.Queue.BindOk(),
            C.Queue.Delete: lambda: C.Queue.DeleteOk(message_count=0),
            C.Queue.Purge: lambda: C.Queue.PurgeOk(message_count=0),
            C.Exchange.Declare: lambda: C.Exchange.DeclareOk(),
            C.Exchange.Delete: lambda: C.Exchange.DeleteOk(),
            C.Basic.Qos: lambda: C.Basic.QosOk(),
            C.Confirm.Select: lambda: C.Confirm.SelectOk(),
            C.Channel.Close: lambda: C.Channel.CloseOk(),
            C.Basic.Consume: lambda: C.Basic.ConsumeOk(consumer_tag=m.consumer_tag or "perf"),
        }
        if isinstance(m, C.Connection.Close):
            self._send(C.Connection.CloseOk(), 0)
            assert self.transport is not None
            self.transport.close()
            return
        make = replies.get(type(m))
        if make is not None:
            self._send(make(), ch)
        if isinstance(m, C.Basic.Consume):
            self.streaming = True
            self.batch = _delivery_batch(self.body_size)
            self._stream()

    def _stream(self) -> None:
        t = self.transport
        assert t is not None
        while self.streaming and not self.paused and not t.is_closing():
            t.write(self.batch)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        asyncio.get_running_loop().call_soon(self._stream)

    def connection_lost(self, exc: Exception | None) -> None:
        self.streaming = False


def serve(port: int, body_size: int, ready: Event) -> None:
    """Process entry point: run the sink on 127.0.0.1:port until killed; set ``ready`` when listening."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: SinkProtocol(body_size), "127.0.0.1", port, backlog=4096)
        ready.set()
        async with server:
            await server.serve_forever()

    uvloop.run(main())
