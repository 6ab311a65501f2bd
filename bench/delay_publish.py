"""Issue 14, target 3: delayed publish with confirms vs plain persistent publish with confirms, side by side.

What is measured: the confirmed publish rate (msg/s) of one publisher connection with a confirm window of 1000
(1 KiB bodies, delivery-mode 2), into

* ``delayed``: a durable ``x-delayed-message`` exchange (``x-delayed-type: direct``) with a durable queue bound,
  every message carrying ``x-delay`` drawn uniformly from 1 h .. 1 day (nothing comes due during the run);
* ``plain``: a durable classic queue through the default exchange, no headers.

How: one Leveret (this tree, ``python -m broker serve`` on a free port with a fresh data dir, like
bench/run_bench.py) serves both; the phases alternate ABBA (delayed, plain, plain, delayed by default:
``--reps 2``), each ``--seconds`` long after a 1 s warm-up that is not counted; the plain queue is purged after
each plain phase so that neither side carries the other's backlog in RAM. The rate of a phase = confirms
received inside the measured window / window length. The client is broker/tools/amqp_client.py's raw asyncio connection
(uvloop); publish frames are encoded by hand (the x-delay header differs per message). The machine's load
average is printed at the start and end.

    .venv/bin/python -m bench.delay_publish [--seconds 8] [--reps 2] [--window 1000] [--size 1024]

This module also holds the pieces the other delay benchmarks import (broker start/stop on a kept data dir,
the hand-encoded publish, the windowed confirm publisher).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pamqp import commands

from bench.run_bench import ROOT, wait_port
from broker.tools.amqp_client import Connection, connect

_SHORT = struct.Struct(">BHIHH")      # frame type, channel, size, class, method
_CHDR = struct.Struct(">BHIHHQH")     # frame type, channel, size, class, weight, body size, property flags
_BODYH = struct.Struct(">BHI")
_LONG = struct.Struct(">q")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


# ----------------------------------------------------------------------------------------------------------
# Broker process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """Leveret on a given data dir, which is kept across stop/start (for restart timing)."""

    def __init__(self, data_dir: str | None = None, port: int | None = None, root: Path = ROOT) -> None:
        self.root = root  # the tree it runs from (another commit's worktree: bench/delay_loop_stall.py --baseline)
        self.port = port or free_port()
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="leveret-delay-bench-")
        self.log_path = Path(tempfile.gettempdir()) / f"leveret-delay-bench-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def spawn(self) -> None:
        py = ROOT / ".venv" / "bin" / "python"
        cmd = [str(py if py.exists() else sys.executable), "-m", "broker", "serve", "--port", str(self.port),
               "--data-dir", self.data_dir, "--management-port", "0", "--prometheus-port", "0",
               "--log-level", "warning"]
        logf = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(cmd, cwd=self.root, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()

    def start(self, timeout: float = 60.0) -> None:
        self.spawn()
        assert self.proc is not None
        if not wait_port(self.port, timeout) or self.proc.poll() is not None:
            raise RuntimeError(f"Leveret did not start (see {self.log_path})")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 120.0) -> float:
        """SIGTERM and wait; returns the seconds it took to exit."""
        t0 = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        return time.monotonic() - t0

    def rss_kb(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def loadavg() -> str:
    return open("/proc/loadavg").read().split(" ", 3)[:3].__repr__()


def du_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


# ----------------------------------------------------------------------------------------------------------
# Hand-encoded basic.publish
def _shortstr(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


class Encoder:
    """basic.publish + content header (optional headers table of int64 fields, delivery-mode 2) + body."""

    def __init__(self, exchange: str, routing_key: str, body_size: int, channel: int = 1) -> None:
        args = b"\x00\x00" + _shortstr(exchange) + _shortstr(routing_key) + b"\x00"
        self.method = _SHORT.pack(1, channel, len(args) + 4, 60, 40) + args + b"\xce"
        self.body_size = body_size
        self.channel = channel
        self.body_head = _BODYH.pack(3, channel, body_size)
        self.pad = b"\x00" * (body_size - 8) + b"\xce"

    def encode(self, headers: tuple[tuple[bytes, int], ...], stamp: int = 0) -> bytes:
        """``headers``: pre-encoded shortstr names with their int64 ('l') values; ``stamp``: the body's first
        8 bytes (big-endian unsigned)."""
        if headers:
            table = b"".join(name + b"l" + _LONG.pack(v) for name, v in headers)
            props = _U32.pack(len(table)) + table + b"\x02"
            flags = 0x3000
        else:
            props = b"\x02"
            flags = 0x1000
        hdr = _CHDR.pack(2, self.channel, 14 + len(props), 60, 0, self.body_size, flags) + props + b"\xce"
        return self.method + hdr + self.body_head + _U64.pack(stamp) + self.pad


X_DELAY = _shortstr("x-delay")
X_DELIVER_AT = _shortstr("x-deliver-at")


# ----------------------------------------------------------------------------------------------------------
# Windowed confirm publisher
class ConfirmPublisher:
    """Publishes what ``make(i)`` returns, keeping at most ``window`` unconfirmed; counts confirms."""

    def __init__(self, conn: Connection, make: Callable[[int], bytes], window: int = 1000,
                 batch: int = 64) -> None:
        self.conn = conn
        self.make = make
        self.window = window
        self.batch = batch
        self.sent = 0
        self.confirmed = 0
        self.nacked = 0
        self._floor = 0
        self._singles: set[int] = set()
        self._waiter: asyncio.Future | None = None
        self.stopping = False
        conn.confirm_listener = self

    async def enable(self) -> None:
        await self.conn.rpc(commands.Confirm.Select())

    def on_confirm(self, tag: int, multiple: int, nack: bool) -> None:
        n = 0
        if multiple:
            if tag > self._floor:
                n = tag - self._floor
                if self._singles:
                    below = {t for t in self._singles if t <= tag}
                    n -= len(below)
                    self._singles -= below
                self._floor = tag
        elif tag > self._floor and tag not in self._singles:
            n = 1
            self._singles.add(tag)
            while self._floor + 1 in self._singles:
                self._floor += 1
                self._singles.discard(self._floor)
        self.confirmed += n
        if nack:
            self.nacked += n
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self.conn.loop.create_future()
        try:
            await asyncio.wait_for(self._waiter, 1.0)
        except TimeoutError:
            pass
        self._waiter = None

    async def run(self, total: int = 0, deadline: float = 0.0) -> None:
        """Until ``total`` messages are confirmed (0: no limit) or time.monotonic() passes ``deadline``."""
        conn = self.conn
        make = self.make
        while not self.stopping and conn.error is None:
            if deadline and time.monotonic() >= deadline:
                break
            if conn.paused or conn.blocked:
                await conn.wait_writable()
                continue
            n = self.batch
            if total:
                n = min(n, total - self.sent)
                if n <= 0:
                    break
            room = self.window - (self.sent - self.confirmed)
            if room <= 0:
                await self._wait()
                continue
            n = min(n, room)
            start = self.sent
            conn.wire.write(b"".join([make(start + i) for i in range(n)]))
            self.sent += n
            await asyncio.sleep(0)
        while self.confirmed < self.sent and conn.error is None and not self.stopping:
            if deadline and time.monotonic() >= deadline + 30:
                break
            await self._wait()
        if conn.error:
            raise RuntimeError(conn.error)


async def declare_delayed(conn: Connection, exchange: str, queue: str, key: str) -> None:
    await conn.rpc(commands.Exchange.Declare(exchange=exchange, exchange_type="x-delayed-message", durable=True,
                                             arguments={"x-delayed-type": "direct"}))
    await conn.rpc(commands.Queue.Declare(queue=queue, durable=True))
    await conn.rpc(commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=key))


# ----------------------------------------------------------------------------------------------------------
# The benchmark
EXCHANGE, DQUEUE, KEY, PQUEUE = "bench.delayed", "bench.delayed.q", "k", "bench.plain"


def _cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    from broker.tools.procstat import read_cpu_s
    return read_cpu_s(pid)


async def phase(url: str, kind: str, seconds: float, window: int, size: int, rng: random.Random,
                pid: int | None = None) -> dict:
    conn = await connect(url, name=f"delay-publish-{kind}")
    if kind == "delayed":
        enc = Encoder(EXCHANGE, KEY, size)
        lo, hi = 3_600_000, 86_400_000
        rand = rng.randint

        def make(_i: int) -> bytes:
            return enc.encode(((X_DELAY, rand(lo, hi)),))
    else:
        enc = Encoder("", PQUEUE, size)
        frame = enc.encode(())

        def make(_i: int) -> bytes:
            return frame
    pub = ConfirmPublisher(conn, make, window)
    await pub.enable()
    task = asyncio.ensure_future(pub.run())
    await asyncio.sleep(1.0)  # warm-up
    c0, t0, b0, p0 = pub.confirmed, time.monotonic(), _cpu_s(pid), time.process_time()
    await asyncio.sleep(seconds)
    c1, t1, b1, p1 = pub.confirmed, time.monotonic(), _cpu_s(pid), time.process_time()
    pub.stopping = True
    pub.on_confirm(0, 0, False)  # wake the waiter
    await task
    await conn.close()
    return {"kind": kind, "rate": round((c1 - c0) / (t1 - t0), 1), "confirmed_in_window": c1 - c0,
            "nacked": pub.nacked, "broker_cpu_pct": round(100 * (b1 - b0) / (t1 - t0)),
            "client_cpu_pct": round(100 * (p1 - p0) / (t1 - t0))}


async def bench(url: str, seconds: float, reps: int, window: int, size: int, pid: int | None) -> list[dict]:
    ctl = await connect(url, name="delay-publish-control")
    await declare_delayed(ctl, EXCHANGE, DQUEUE, KEY)
    await ctl.rpc(commands.Queue.Declare(queue=PQUEUE, durable=True))
    rng = random.Random(14)
    order: list[str] = []
    for r in range(reps):
        order += ["delayed", "plain"] if r % 2 == 0 else ["plain", "delayed"]
    out = []
    for kind in order:
        res = await phase(url, kind, seconds, window, size, rng, pid)
        res["loadavg"] = loadavg()
        print(json.dumps(res), flush=True)
        out.append(res)
        if kind == "plain":
            await ctl.rpc(commands.Queue.Purge(queue=PQUEUE))
    ok = await ctl.rpc(commands.Queue.Declare(queue=DQUEUE, durable=True, passive=True))
    print(json.dumps({"delayed_queue_depth_after (must be 0: nothing due yet)": ok.message_count}), flush=True)
    await ctl.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--url", help="an already running broker (default: start this tree's Leveret)")
    a = ap.parse_args(argv)
    print(f"loadavg at start {loadavg()}, cpus {os.cpu_count()}", flush=True)
    broker = None
    url = a.url
    if not url:
        broker = Broker()
        broker.start()
        url = broker.url
    try:
        import uvloop
        res = uvloop.run(bench(url, a.seconds, a.reps, a.window, a.size, broker.pid if broker else None))
    finally:
        if broker is not None:
            broker.stop()
            import shutil
            shutil.rmtree(broker.data_dir, ignore_errors=True)
    d = [r["rate"] for r in res if r["kind"] == "delayed"]
    p = [r["rate"] for r in res if r["kind"] == "plain"]
    md, mp = sum(d) / len(d), sum(p) / len(p)
    print(json.dumps({"delayed_mean": round(md, 1), "plain_mean": round(mp, 1), "ratio": round(md / mp, 3),
                      "target": ">= 0.8", "met": md / mp >= 0.8, "loadavg_end": loadavg()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
