"""A small user-space TCP proxy on 127.0.0.1 for network-fault tests (issue 17; Toxiproxy is not in Debian).

The proxy runs its own asyncio loop in a thread. Each accepted client gets an upstream connection to the
target; the faults apply to every link the proxy holds (or the newest):

* ``cut_after(n)``: forward ``n`` more octets from the client, then reset both sockets (a connection cut in
  the middle of a frame when ``n`` falls inside one);
* ``stall()``: stop forwarding in both directions and stop reading, with every socket left open (a peer that
  hangs: the broker's writes back up and it hears nothing, heartbeats included);
* ``rate(bytes_per_second)``: forward server-to-client octets no faster than that (a slow reader).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable


class _Link:
    def __init__(self, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.client = client
        self.upstream = upstream
        self.cut_budget: int | None = None
        self.stalled = asyncio.Event()
        self.rate: float | None = None
        self.closed = False
        self.up_bytes = 0
        self.down_bytes = 0

    def abort(self) -> None:
        self.closed = True
        for _, writer in (self.client, self.upstream):
            transport = writer.transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:  # RST rather than FIN: the connection is cut, not closed
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            transport.abort()


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; see the module docstring for the faults."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.links: list[_Link] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._call(self._start)

    # -- control, from the test's thread -----------------------------------------------------------------
    def _call(self, coro_fn: Callable, *args):
        return asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop).result(10)

    def wait_links(self, n: int, timeout: float = 10.0) -> _Link:
        """The newest link, once ``n`` clients have connected."""
        deadline = time.monotonic() + timeout
        while len(self.links) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.links)} of {n} clients connected through the proxy")
            time.sleep(0.01)
        return self.links[-1]

    def cut_after(self, n: int, link: _Link | None = None) -> None:
        async def set_() -> None:
            (link or self.links[-1]).cut_budget = n
        self._call(set_)

    def stall(self, link: _Link | None = None) -> None:
        async def set_() -> None:
            target = link or self.links[-1]
            target.stalled.set()
            for _, writer in (target.client, target.upstream):
                writer.transport.pause_reading()
        self._call(set_)

    def rate(self, bytes_per_second: float, link: _Link | None = None) -> None:
        async def set_() -> None:
            (link or self.links[-1]).rate = bytes_per_second
        self._call(set_)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for link in self.links:
                link.abort()
        try:
            self._call(stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    # -- the loop's side ------------------------------------------------------------------------------------
    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link((reader, writer), upstream)
        self.links.append(link)
        await asyncio.gather(self._pump(link, reader, upstream[1], up=True),
                             self._pump(link, upstream[0], writer, up=False), return_exceptions=True)

    async def _pump(self, link: _Link, src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
        try:
            while not link.closed:
                if link.stalled.is_set():
                    await asyncio.sleep(3600)
                data = await src.read(4096 if not up and link.rate else 65536)
                if not data or link.stalled.is_set():
                    if not data:
                        dst.transport.write_eof() if dst.transport.can_write_eof() else None
                        return
                    await asyncio.sleep(3600)
                if up and link.cut_budget is not None:
                    if len(data) >= link.cut_budget:
                        dst.write(data[: link.cut_budget])
                        await dst.drain()
                        await asyncio.sleep(0.05)  # let the partial frame reach the broker before the cut
                        link.abort()
                        return
                    link.cut_budget -= len(data)
                if not up and link.rate:
                    await asyncio.sleep(len(data) / link.rate)
                dst.write(data)
                if up:
                    link.up_bytes += len(data)
                else:
                    link.down_bytes += len(data)
                await dst.drain()
        except (ConnectionError, OSError):
            link.abort()
