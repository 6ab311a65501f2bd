"""``python -m broker.tools.perf``: a PerfTest-like load generator for any AMQP 0-9-1 broker.

    python -m broker.tools.perf --url amqp://guest:guest@127.0.0.1:5672/%2F -x 1 -y 1 -s 16 --time 10
    python -m broker.tools.perf --url ... -s 1024 --persistent --confirm 100 --ack --prefetch 100
    python -m broker.tools.perf --url ... --fanout --queues 10 -y 10
    python -m broker.tools.perf --url ... --backlog 1000000 -s 1024 --ack --prefetch 100
    python -m broker.tools.perf --url ... --rate 5000 -s 1024 --ack --prefetch 100       # latency at a fixed rate
    python -m broker.tools.perf --sink ...                                              # the generator's own ceiling
    python -m broker.tools.perf --url ... --broker-pid PID --json-out result.json
    python -m broker.tools.perf --url amqps://guest:guest@localhost:5671/%2F --cacert ca.pem ...   # over TLS
    python -m broker.tools.perf --url ... --queue-type stream --stream-offset first -s 1024 --confirm 1000 --ack -q 1000
    python -m broker.tools.perf --url ... --queue-type stream --stream-offset first --ack -q 1000 -y 4 \
        --consumer-arg x-stream-group=perf                                       # a consumer group (Leveret)
    python -m broker.tools.perf --url ... --queue-type stream --stream-offset first --confirm 1000 --ack -q 1000 \
        --backlog 1000000 --keep-publishing                      # read a 1 M stream while publishing goes on

Structure: the parent process declares the topology (several control connections in parallel), forks
``--processes`` workers (producers and consumers spread round-robin, one connection each), and then only
watches: it flips a shared phase word (GO → MEASURE → [DRAIN] → STOP), samples the workers' counters
(published in shared memory every 50 ms), the broker's /proc (RSS every 100 ms, CPU time at start and end),
and for the backlog mode polls the queue depth with passive queue.declare. Workers run uvloop and the raw
client in broker/tools/amqp_client.py. The result is one JSON object (stdout, and --json-out).

Rates are counted over the measurement window only (after --warmup); latency (publish → deliver, from the
monotonic timestamp at the start of each body) is recorded in the same window.

Stream queues (``--queue-type stream``): the queues are declared durable with ``x-queue-type: stream``; the
consumers need ``--ack`` and ``--prefetch`` (RabbitMQ and Leveret refuse a stream consumer without them) and
start at ``--stream-offset`` (consumer argument ``x-stream-offset``: first, last, next, a number);
``--consumer-arg KEY=VALUE`` adds any consumer argument (``x-stream-group=NAME`` for a Leveret consumer
group). Every delivery's ``x-stream-offset`` header is recorded (see broker/tools/amqp_client.py) and the result gets a
``stream`` object: deliveries with an offset, distinct offsets, ``duplicates`` (an offset delivered again
without redelivered=true: must be 0 for a consumer group, whose members each get distinct offsets),
``redelivered``, ``no_offset`` (deliveries without the header) and ``gaps`` (offsets between the lowest and
the highest delivered that nobody received; a timed run stops with some deliveries in flight, so a few are
normal). In backlog mode the queue depth of a stream is not asked of the broker (RabbitMQ's declare-ok
reports 0 messages for a stream): the publish phase ends when N are confirmed (with --confirm) or written.
``--keep-publishing`` (backlog mode) lets the producers go on publishing while the consumers drain the first
N: the drain rate is then the rate of reading a backlog under a live publisher.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any
from urllib.parse import quote

from pamqp import commands

from broker.tools.amqp_client import (
    HIST_SIZE,
    Connection,
    PublishTemplate,
    connect,
    hist_percentiles,
    hist_value,
    merge_hists,
    new_hist,
)
from broker.tools.procstat import ProcSampler

INIT, GO, MEASURE, DRAIN, STOP = 0, 1, 2, 3, 4
# Per-worker counter slots in shared memory.
C_PUB, C_CONF, C_NACK, C_CONS, C_ERR, C_READY, C_PDONE, C_CDONE, C_RET = range(9)
NSLOTS = 9
STOP_ON_SIGTERM = False  # the CLI sets it: SIGTERM (like Ctrl-C) ends a timed run early, with its summary
LATENCY_COPY_S = 0.2  # with progress lines: how often a worker copies its latency histogram to shared memory


# A worker's role: ("c", index, queue) for a consumer, ("p", index, exchange, routing keys, total) for a producer.
Role = tuple[Any, ...]
# The memory the workers share with the parent: multiprocessing's lock-free ctypes arrays (int64 counters and
# latency histograms) and value (the phase word), which typeshed types as Any.
SharedArray = Any
SharedValue = Any


@dataclass
class PerfConfig:
    url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    producers: int = 1
    consumers: int = 1
    queues: int = 1
    queue_prefix: str = "perf"
    exchange: str = "perf.fanout"
    size: int = 16
    rate: float = 0.0            # per producer, msg/s; 0 = as fast as possible
    persistent: bool = False
    durable: bool = False        # implied by persistent
    confirm: int = 0             # max outstanding confirms per producer; 0 = no confirms
    manual_ack: bool = False
    prefetch: int = 0
    fanout: bool = False
    backlog: int = 0             # publish this many with no consumer, then drain
    duration: float = 10.0
    warmup: float = 0.0
    processes: int = 1
    broker_pid: int | None = None
    connect_concurrency: int = 100
    setup_timeout: float = 600.0
    stall_timeout: float = 60.0  # backlog: give up when no progress for this long
    batch_bytes: int = 65536
    cleanup: bool = True
    sink: bool = False
    queue_type: str = ""         # "" (the broker's default, classic) or "stream", "quorum", …
    stream_offset: str | None = None  # consumer argument x-stream-offset ("first", "last", "next", "123")
    consumer_args: dict[str, Any] = field(default_factory=dict)  # further consumer arguments (x-stream-group, …)
    keep_publishing: bool = False  # backlog mode: producers go on publishing while the consumers drain
    # PerfTest's options (the CLI maps its letters onto these; every default leaves the behaviour above as is).
    queue: str = ""              # -u: the queue's exact name (with queues > 1: NAME-0 … NAME-N-1)
    pmessages: int = 0           # -C: each producer publishes this many (confirmed, with confirm), then stops
    cmessages: int = 0           # -D: each consumer stops after this many
    consumer_rate: float = 0.0   # -R: per consumer, msg/s; 0 = unlimited
    mandatory: bool = False      # -f mandatory: basic.publish mandatory=true (returns are counted)
    exchange_type: str = ""      # -t: publish through `exchange` of this type ("" = default exchange / fanout)
    routing_key: str = ""        # -k: routing key (and binding key); "" = the queue's name
    queue_args: dict[str, Any] = field(default_factory=dict)  # -qa: further queue arguments
    predeclared: bool = False    # -p: use existing queues (and exchange): declare and delete nothing
    uris: list[str] = field(default_factory=list)  # -H: connections spread round-robin over these (else `url`)
    progress: float = 0.0        # -i: print a PerfTest progress line every N s (0 = none)
    run_id: str = ""             # -d: the id on the progress and summary lines
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def queue_names(self) -> list[str]:
        if self.queue:
            return [self.queue] if self.queues <= 1 else [f"{self.queue}-{i}" for i in range(self.queues)]
        return [f"{self.queue_prefix}-{i}" for i in range(max(1, self.queues))]

    @property
    def exchange_kind(self) -> str:
        """The type of the exchange the producers publish to; "" for the default exchange."""
        return "fanout" if self.fanout else self.exchange_type

    def url_for(self, i: int) -> str:
        return self.uris[i % len(self.uris)] if self.uris else self.url

    def fan_out(self) -> int:
        """How many queues one publish reaches."""
        if self.exchange_kind == "fanout" or (self.exchange_kind and self.routing_key):
            return len(self.queue_names())
        return 1

    @property
    def stream(self) -> bool:
        return self.queue_type == "stream"

    def queue_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {"x-queue-type": self.queue_type} if self.queue_type else {}
        args.update({k: _arg_value(v) for k, v in self.queue_args.items()})
        return args

    def consume_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {"x-stream-offset": _arg_value(self.stream_offset)} if self.stream_offset is not None else {}
        args.update({k: _arg_value(v) for k, v in self.consumer_args.items()})
        return args


def _arg_value(v: Any) -> Any:
    """A consumer argument from the command line: integers as numbers (a numeric x-stream-offset), else text."""
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return v


def parse_kv(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {it!r}")
        out[k] = v
    return out


def raise_nofile(want: int = 0) -> int:
    """Raise this process's open-file limit to its hard limit, or to ``want`` when that is more and the process
    may (root); returns the soft limit now. Children started afterwards inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if want > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            pass
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


# ---------------------------------------------------------------------------------------------------------
# Producer
def _template(exchange: str, key: str, cfg: PerfConfig) -> PublishTemplate:
    t = PublishTemplate(exchange, key, cfg.size, cfg.persistent)
    if cfg.mandatory:  # basic.publish's bit field (mandatory = bit 0) follows the exchange and the routing key
        bits = 7 + 4 + 2 + 1 + len(exchange.encode()) + 1 + len(key.encode())
        t.head = t.head[:bits] + b"\x01" + t.head[bits + 1:]
    return t


class Publisher:
    def __init__(self, conn: Connection, exchange: str, keys: list[str], cfg: PerfConfig, total: int) -> None:
        self.conn = conn
        self.templates = [_template(exchange, k, cfg) for k in keys]
        self.batch_max = max(1, cfg.batch_bytes // self.templates[0].wire_size)
        self.window = cfg.confirm
        self.rate = cfg.rate
        self.total = total
        self.sent = 0
        self.confirmed = 0
        self.nacked = 0
        self._floor = 0
        self._singles: set[int] = set()
        self._waiter: asyncio.Future[None] | None = None
        self.stopping = False
        self.done = False
        if self.window:
            conn.confirm_listener = self

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

    async def _wait_confirm(self) -> None:
        self._waiter = self.conn.loop.create_future()
        try:
            await asyncio.wait_for(self._waiter, 1.0)
        except TimeoutError:
            pass
        self._waiter = None

    def stop(self) -> None:
        self.stopping = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        self.conn._wake()

    async def run(self) -> None:
        conn = self.conn
        transport = conn.transport
        assert transport is not None  # connected before any publisher runs
        templates = self.templates
        single = templates[0] if len(templates) == 1 else None
        ntpl = len(templates)
        rr = 0
        rate = self.rate
        window = self.window
        t0 = time.monotonic()
        monotonic_ns = time.monotonic_ns
        sleep = asyncio.sleep
        while not self.stopping and conn.error is None and not conn.closed.done():
            if conn.paused or conn.blocked:
                await conn.wait_writable()
                continue
            n = self.batch_max
            if self.total:
                left = self.total - self.sent
                if left <= 0:
                    break
                n = min(n, left)
            if rate:
                elapsed = time.monotonic() - t0
                due = int(elapsed * rate) + 1 - self.sent
                if due <= 0:
                    # uvloop's timers have millisecond resolution: shorter sleeps would spin.
                    await sleep(max(0.001, (self.sent + 1) / rate - elapsed))
                    continue
                n = min(n, due)
            if window:
                room = window - (self.sent - self.confirmed)
                if room <= 0:
                    await self._wait_confirm()
                    continue
                n = min(n, room)
            if single is not None:
                data = single.batch(n)
            else:
                ts = monotonic_ns().to_bytes(8, "big")
                parts = []
                for _ in range(n):
                    t = templates[rr]
                    rr += 1
                    if rr == ntpl:
                        rr = 0
                    parts.append(t.head)
                    if t.timestamped:
                        parts.append(ts)
                        parts.append(t.tail)
                data = b"".join(parts)
            transport.write(data)
            self.sent += n
            await sleep(0)
        while (window and not self.stopping and self.confirmed < self.sent and conn.error is None
               and not conn.closed.done()):
            await self._wait_confirm()
        self.done = True


# ---------------------------------------------------------------------------------------------------------
# Worker process
def plan_roles(cfg: PerfConfig) -> list[Role]:
    qnames = cfg.queue_names()
    q = len(qnames)
    roles: list[Role] = []
    for i in range(cfg.consumers):
        roles.append(("c", i, qnames[i % q]))
    p = cfg.producers
    for j in range(p):
        own = [qnames[k] for k in range(q) if k % p == j] or [qnames[j % q]]
        if cfg.exchange_kind == "fanout":
            exchange, keys = cfg.exchange, [cfg.routing_key]
        elif cfg.exchange_kind:
            exchange, keys = cfg.exchange, [cfg.routing_key] if cfg.routing_key else own
        else:
            exchange = ""
            keys = [cfg.routing_key] if cfg.routing_key else own
        total = cfg.backlog // p + (1 if j < cfg.backlog % p else 0) if cfg.backlog and not cfg.keep_publishing \
            else cfg.pmessages
        roles.append(("p", j, exchange, keys, total))
    return roles


async def _start_consumer(conn: Connection, queue: str, idx: int, cfg: PerfConfig) -> None:
    conn.manual_ack = cfg.manual_ack
    if cfg.manual_ack and cfg.prefetch:
        await conn.rpc(commands.Basic.Qos(prefetch_count=cfg.prefetch))
    await conn.rpc(commands.Basic.Consume(queue=queue, consumer_tag=f"perf-{idx}", no_ack=not cfg.manual_ack,
                                          arguments=cfg.consume_arguments() or None))


async def _govern_consumers(consumers: list[tuple[Connection, str, int]], cfg: PerfConfig, stopped: set[int]) -> None:
    """-D and -R: stop reading a consumer's socket once it has its count, or while it is ahead of its rate.

    Deliveries are counted per socket read (broker/tools/amqp_client.py), so a consumer stops within one read of -D."""
    started: dict[int, float] = {}
    burst = max(1.0, cfg.consumer_rate * 0.01)
    while True:
        now = time.monotonic()
        for c, _q, i in consumers:
            if i in stopped or c.transport is None:
                continue
            n = c.consumed
            if cfg.cmessages and n >= cfg.cmessages:
                c.transport.pause_reading()
                stopped.add(i)
            elif cfg.consumer_rate:
                if n and i not in started:
                    started[i] = now - 1 / cfg.consumer_rate
                if i in started:
                    if n >= cfg.consumer_rate * (now - started[i]) + burst:
                        c.transport.pause_reading()
                    else:
                        c.transport.resume_reading()
        await asyncio.sleep(0.005)


async def worker_main(wid: int, roles: list[Role], cfg: PerfConfig, counters: SharedArray, phase: SharedValue,
                      lat: SharedArray | None = None) -> dict[str, Any]:
    base = wid * NSLOTS
    errors: list[str] = []
    sem = asyncio.Semaphore(cfg.connect_concurrency)
    consumers: list[tuple[Connection, str, int]] = []
    publishers: list[Publisher] = []
    hist = new_hist()
    seen = bytearray() if cfg.stream else None  # offsets delivered, shared by this worker's consumers
    again = bytearray() if cfg.stream else None  # offsets redelivered (amqp_client's Connection.again)

    async def open_role(role: Role) -> None:
        async with sem:
            kind, idx = role[0], role[1]
            conn = await connect(cfg.url_for(idx if kind == "c" else cfg.consumers + idx),
                                 name=f"perf-{kind}{idx}")
            if kind == "c":
                conn.seen, conn.again = seen, again
                consumers.append((conn, role[2], idx))
                if not cfg.backlog:
                    await _start_consumer(conn, role[2], idx, cfg)
            else:
                if cfg.confirm:
                    await conn.rpc(commands.Confirm.Select())
                publishers.append(Publisher(conn, role[2], role[3], cfg, role[4]))

    results = await asyncio.gather(*(open_role(r) for r in roles), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            errors.append(f"setup: {type(r).__name__}: {r}")
    counters[base + C_ERR] = len(errors)
    counters[base + C_READY] = 1
    while phase.value < GO:
        await asyncio.sleep(0.002)
    t_go = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    tasks = [asyncio.ensure_future(p.run()) for p in publishers]
    stopped: set[int] = set()  # consumers that have their -D count
    governor = asyncio.ensure_future(_govern_consumers(consumers, cfg, stopped)) \
        if consumers and (cfg.cmessages or cfg.consumer_rate) else None
    lat_off = wid * HIST_SIZE
    lat_copied = 0.0
    measuring = False
    draining = False
    measure_base: list[int] = []
    while True:
        ph = phase.value
        if ph >= MEASURE and not measuring:
            measuring = True
            measure_base = [c.consumed for c, _q, _i in consumers]
            for c, _q, _i in consumers:
                c.hist = hist
        if ph >= DRAIN and cfg.backlog and not draining:
            draining = True

            async def start(c: Connection, q: str, i: int) -> None:
                async with sem:
                    await _start_consumer(c, q, i, cfg)
            for r in await asyncio.gather(*(start(*x) for x in consumers), return_exceptions=True):
                if isinstance(r, BaseException):
                    errors.append(f"consume: {type(r).__name__}: {r}")
        pub = conf = nack = 0
        pdone = 0
        for p in publishers:
            pub += p.sent
            conf += p.confirmed
            nack += p.nacked
            pdone += p.done
        counters[base + C_PUB] = pub
        counters[base + C_CONF] = conf
        counters[base + C_NACK] = nack
        counters[base + C_CONS] = sum(c.consumed for c, _q, _i in consumers)
        counters[base + C_PDONE] = pdone
        counters[base + C_CDONE] = len(stopped)
        counters[base + C_RET] = sum(p.conn.returned for p in publishers)
        if lat is not None and measuring and time.monotonic() - lat_copied >= LATENCY_COPY_S:
            lat[lat_off:lat_off + HIST_SIZE] = hist
            lat_copied = time.monotonic()
        conn_errors = sum(1 for c, _q, _i in consumers if c.error) + sum(1 for p in publishers if p.conn.error)
        counters[base + C_ERR] = len(errors) + conn_errors
        if ph >= STOP:
            break
        await asyncio.sleep(0.05)
    t_stop = time.monotonic()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    if governor is not None:
        governor.cancel()
    for p in publishers:
        p.stop()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if t.cancelled():
            continue
        if t.exception() is not None:
            errors.append(f"producer: {type(t.exception()).__name__}: {t.exception()}")
    per_consumer = [c.consumed for c, _q, _i in consumers]
    in_window = ([c.consumed - b for (c, _q, _i), b in zip(consumers, measure_base)]
                 if measure_base else per_consumer)
    for c, _q, _i in consumers:
        if c.error:
            errors.append(f"consumer {c.name}: {c.error}")
        if c.cancelled:
            errors.append(f"consumer {c.name}: cancelled by the broker")
    for p in publishers:
        if p.conn.error:
            errors.append(f"producer {p.conn.name}: {p.conn.error}")

    async def close(c: Connection) -> None:
        async with sem:
            await c.close(2.0)
    await asyncio.gather(*(close(c) for c in [x[0] for x in consumers] + [p.conn for p in publishers]),
                         return_exceptions=True)
    stream = None
    if seen is not None and again is not None:
        stream = _stream_part(seen, again, [c for c, _q, _i in consumers])
    return {
        "stream": stream,
        "worker": wid,
        "hist": hist,
        "per_consumer": per_consumer,
        "per_consumer_window": in_window,
        "published": sum(p.sent for p in publishers),
        "confirmed": sum(p.confirmed for p in publishers),
        "nacked": sum(p.nacked for p in publishers),
        "returned": sum(p.conn.returned for p in publishers),
        "errors": errors[:50],
        "error_count": len(errors),
        "cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
        "wall_s": t_stop - t_go,
    }


def _worker_entry(wid: int, roles: list[Role], cfg: PerfConfig, counters: SharedArray, phase: SharedValue,
                  result_q: mp.queues.Queue[dict[str, Any]], lat: SharedArray | None = None) -> None:
    raise_nofile()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the run and summarises
    try:
        import uvloop
        res = uvloop.run(worker_main(wid, roles, cfg, counters, phase, lat))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        res = {"worker": wid, "fatal": f"{type(exc).__name__}: {exc}"}
        counters[wid * NSLOTS + C_READY] = 1
        counters[wid * NSLOTS + C_ERR] += 1
    result_q.put(res)


# ---------------------------------------------------------------------------------------------------------
# Parent: topology, phases, measurement
async def _parallel_control(cfg: PerfConfig, items: list[str], action: Callable[[Connection, str], Awaitable[None]],
                            conns: int = 16) -> None:
    if not items:
        return
    n = max(1, min(conns, len(items)))
    chunks = [items[i::n] for i in range(n)]

    async def run(chunk: list[str]) -> None:
        c = await connect(cfg.url, name="perf-control")
        try:
            for it in chunk:
                await action(c, it)
        finally:
            await c.close()
    await asyncio.gather(*(run(ch) for ch in chunks))


async def setup_topology(cfg: PerfConfig) -> None:
    if cfg.predeclared:  # -p: the queues (and exchange) are there already; only check that the queues are
        async def check(c: Connection, q: str) -> None:
            await c.rpc(commands.Queue.Declare(queue=q, passive=True))
        await _parallel_control(cfg, cfg.queue_names(), check)
        return
    durable = cfg.durable or cfg.persistent
    kind = cfg.exchange_kind
    if kind:
        c = await connect(cfg.url, name="perf-control")
        try:
            await c.rpc(commands.Exchange.Declare(exchange=cfg.exchange, exchange_type=kind, durable=durable))
        finally:
            await c.close()

    async def declare(c: Connection, q: str) -> None:
        await c.rpc(commands.Queue.Delete(queue=q))
        await c.rpc(commands.Queue.Declare(queue=q, durable=durable or cfg.stream,
                                           arguments=cfg.queue_arguments() or None))
        if kind:
            key = cfg.routing_key if cfg.routing_key or kind == "fanout" else q
            await c.rpc(commands.Queue.Bind(queue=q, exchange=cfg.exchange, routing_key=key))
    await _parallel_control(cfg, cfg.queue_names(), declare)


async def cleanup_topology(cfg: PerfConfig) -> None:
    if cfg.predeclared:
        return

    async def delete(c: Connection, q: str) -> None:
        await c.rpc(commands.Queue.Delete(queue=q))
    await _parallel_control(cfg, cfg.queue_names(), delete)
    if cfg.exchange_kind:
        c = await connect(cfg.url, name="perf-control")
        try:
            await c.rpc(commands.Exchange.Delete(exchange=cfg.exchange))
        finally:
            await c.close()


async def queue_depth(conn: Connection, names: list[str]) -> int:
    total = 0
    for q in names:
        ok = await conn.rpc(commands.Queue.Declare(queue=q, passive=True))
        total += ok.message_count or 0
    return total


def _totals(counters: SharedArray, nw: int) -> list[int]:
    out = [0] * NSLOTS
    for w in range(nw):
        for s in range(NSLOTS):
            out[s] += counters[w * NSLOTS + s]
    return out


LATENCY_QUANTILES = (0.5, 0.75, 0.95, 0.99)


def latency_stats(hist: Sequence[int]) -> list[float] | None:
    """PerfTest's min/median/75th/95th/99th (µs) of a histogram (broker/tools/amqp_client.py's buckets); None if empty."""
    total = sum(hist)
    if not total:
        return None
    targets = [max(1, int(q * total + 0.999999)) for q in LATENCY_QUANTILES]
    out: list[float] = []
    acc = 0
    for idx, n in enumerate(hist):
        if not n:
            continue
        if not out:
            out.append(hist_value(idx))
        acc += n
        while len(out) <= len(targets) and acc >= targets[len(out) - 1]:
            out.append(hist_value(idx))
        if len(out) > len(targets):
            break
    return out


def _rate(n: float) -> str:
    return f"{n:.0f}" if n >= 10 or n == 0 else f"{n:.2f}"


def progress_line(cfg: PerfConfig, elapsed: float, rates: dict[str, float], lat: list[float] | None) -> str:
    """One line in PerfTest's shape: id, time, sent (confirmed, nacked, returned), received, consumer latency."""
    parts = [f"id: {cfg.run_id}", f"time {elapsed:.3f} s"]
    if cfg.producers:
        parts.append(f"sent: {_rate(rates['sent'])} msg/s")
        if cfg.mandatory:
            parts.append(f"returned: {_rate(rates['returned'])} msg/s")
        if cfg.confirm:
            parts.append(f"confirmed: {_rate(rates['confirmed'])} msg/s")
            parts.append(f"nacked: {_rate(rates['nacked'])} msg/s")
    if cfg.consumers:
        parts.append(f"received: {_rate(rates['received'])} msg/s")
        if cfg.size >= 8:
            parts.append("min/median/75th/95th/99th consumer latency: "
                         + "/".join(f"{v:.0f}" for v in (lat or [0] * 5)) + " µs")
    return ", ".join(parts)


async def _progress(cfg: PerfConfig, nw: int, counters: SharedArray, lat: SharedArray | None, t0: float) -> None:
    """Every cfg.progress seconds: the rates since the last line and the latency of the deliveries in between
    (the workers copy their histograms to `lat` every LATENCY_COPY_S)."""
    prev = _totals(counters, nw)
    prev_t = t0
    prev_hist = [0] * HIST_SIZE
    tick = t0
    while True:
        tick += cfg.progress
        await asyncio.sleep(max(0.0, tick - time.monotonic()))
        now = time.monotonic()
        tot = _totals(counters, nw)
        dt = max(1e-9, now - prev_t)
        rates = {"sent": (tot[C_PUB] - prev[C_PUB]) / dt, "confirmed": (tot[C_CONF] - prev[C_CONF]) / dt,
                 "nacked": (tot[C_NACK] - prev[C_NACK]) / dt, "received": (tot[C_CONS] - prev[C_CONS]) / dt,
                 "returned": (tot[C_RET] - prev[C_RET]) / dt}
        stats = None
        if lat is not None:
            merged = list(lat[0:HIST_SIZE])
            for w in range(1, nw):
                merged = [a + b for a, b in zip(merged, lat[w * HIST_SIZE:(w + 1) * HIST_SIZE], strict=True)]
            stats = latency_stats([a - b for a, b in zip(merged, prev_hist, strict=True)])
            prev_hist = merged
        try:
            print(progress_line(cfg, now - t0, rates, stats), flush=True)
        except OSError:  # stdout closed (| head): the run goes on, silently
            return
        prev, prev_t = tot, now


async def _monitor(cfg: PerfConfig, nw: int, counters: SharedArray, phase: SharedValue, procs: list[BaseProcess],
                   sampler: ProcSampler | None, out: dict[str, Any], lat: SharedArray | None = None) -> None:
    deadline = time.monotonic() + cfg.setup_timeout
    while _totals(counters, nw)[C_READY] < nw:
        if time.monotonic() > deadline:
            raise TimeoutError("workers did not connect in time")
        if not all(p.is_alive() for p in procs) and _totals(counters, nw)[C_READY] < nw:
            raise RuntimeError("a worker died during setup")
        await asyncio.sleep(0.02)
    out["setup_s"] = round(time.monotonic() - out.pop("_t_setup"), 3)
    out["setup_errors"] = _totals(counters, nw)[C_ERR]
    if sampler:
        out["broker_rss_ready_kb"] = sampler.sample()
        sampler.mark_start()
    series = []
    task = asyncio.current_task()
    if STOP_ON_SIGTERM and task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    t0 = time.monotonic()
    phase.value = GO
    progress = asyncio.ensure_future(_progress(cfg, nw, counters, lat, t0)) if cfg.progress > 0 else None
    if cfg.backlog:
        expected_depth = cfg.backlog * cfg.fan_out()
        ctrl = await connect(cfg.url, name="perf-depth")
        try:
            last_progress: tuple[float, object] = (time.monotonic(), -1)
            depth = 0
            while True:
                tot = _totals(counters, nw)
                if cfg.stream or cfg.keep_publishing:
                    # No depth from the broker (a stream's declare-ok says 0; live producers never finish):
                    # the backlog is there once N are confirmed (or written, without confirms).
                    if (tot[C_CONF] if cfg.confirm else tot[C_PUB]) >= cfg.backlog:
                        depth = tot[C_CONF] if cfg.confirm else tot[C_PUB]
                        break
                else:
                    published_all = tot[C_PUB] >= cfg.backlog and \
                        (not cfg.confirm or tot[C_PDONE] >= cfg.producers)
                    if published_all:
                        depth = await queue_depth(ctrl, cfg.queue_names())
                        if depth >= expected_depth:
                            break
                key = (tot[C_PUB], tot[C_CONF], depth)
                now = time.monotonic()
                if key != last_progress[1]:
                    last_progress = (now, key)
                elif now - last_progress[0] > cfg.stall_timeout:
                    out["errors"].append(f"backlog: publishing stalled at {tot[C_PUB]} published, depth {depth}")
                    break
                series.append((round(now - t0, 2), tot[C_PUB], tot[C_CONS]))
                await asyncio.sleep(0.1)
            t_pub = time.monotonic()
            out["backlog_depth"] = depth
            out["publish_s"] = round(t_pub - t0, 3)
            tot = _totals(counters, nw)
            out["publish_rate"] = round(tot[C_PUB] / (t_pub - t0), 1)
            if sampler:
                out["broker_rss_after_publish_kb"] = sampler.sample()
        finally:
            await ctrl.close()
        before = _totals(counters, nw)
        c_before = before[C_CONS]
        t_d = time.monotonic()
        phase.value = DRAIN
        last_progress = (t_d, -1)
        while True:
            tot = _totals(counters, nw)
            consumed = tot[C_CONS] - c_before
            now = time.monotonic()
            if consumed >= expected_depth:
                break
            if consumed != last_progress[1]:
                last_progress = (now, consumed)
            elif now - last_progress[0] > cfg.stall_timeout:
                out["errors"].append(f"backlog: drain stalled at {consumed} of {expected_depth}")
                break
            if not cfg.consumers:
                break
            series.append((round(now - t0, 2), tot[C_PUB], tot[C_CONS]))
            await asyncio.sleep(0.05)
        t_end = time.monotonic()
        out["drain_s"] = round(t_end - t_d, 3)
        out["drain_rate"] = round(consumed / (t_end - t_d), 1) if consumed else 0.0
        if cfg.keep_publishing:
            out["drain_publish_rate"] = round((_totals(counters, nw)[C_PUB] - before[C_PUB]) / (t_end - t_d), 1)
        out["consume_rate"] = out["drain_rate"]
        m0 = [0] * NSLOTS
        m1 = _totals(counters, nw)
        window = t_end - t0
    else:
        if cfg.warmup:
            await asyncio.sleep(cfg.warmup)
        phase.value = MEASURE
        m0 = _totals(counters, nw)
        tm = time.monotonic()
        end = tm + cfg.duration if cfg.duration > 0 else float("inf")  # -z 0: until the counts or Ctrl-C
        counted = bool(cfg.pmessages or cfg.cmessages)
        last_sample = 0.0
        caught_up = (0, tm)  # -C without -D: (consumed, since when) once the producers are done
        while True:
            now = time.monotonic()
            tot = _totals(counters, nw)
            if now - last_sample >= 1.0 or now >= end:
                series.append((round(now - t0, 2), tot[C_PUB], tot[C_CONS]))
                last_sample = now
            if now >= end:
                break
            if tot[C_ERR] and not any(p.is_alive() for p in procs):
                break
            if counted:
                producers_done = tot[C_PDONE] >= cfg.producers if cfg.pmessages else True
                if cfg.cmessages:
                    consumers_done = tot[C_CDONE] >= cfg.consumers
                elif cfg.consumers and producers_done:
                    # -C alone: the consumers are done once they have what was published (or stop getting any)
                    if tot[C_CONS] != caught_up[0]:
                        caught_up = (tot[C_CONS], now)
                    consumers_done = (tot[C_CONS] >= (tot[C_PUB] - tot[C_RET]) * cfg.fan_out()
                                      or now - caught_up[1] > 3.0)
                else:
                    consumers_done = True
                if producers_done and consumers_done:
                    break
            try:
                await asyncio.sleep(min(0.05 if counted else 1.0, end - now))
            except asyncio.CancelledError:  # Ctrl-C: stop here and report what was measured
                out["interrupted"] = True
                break
        m1 = _totals(counters, nw)
        window = time.monotonic() - tm
        out["publish_rate"] = round((m1[C_PUB] - m0[C_PUB]) / window, 1)
        out["consume_rate"] = round((m1[C_CONS] - m0[C_CONS]) / window, 1)
    if sampler:
        sampler.mark_end()
    phase.value = STOP
    if progress is not None:
        progress.cancel()
    out["window_s"] = round(window, 3)
    out["published"] = m1[C_PUB] - m0[C_PUB]
    out["consumed"] = m1[C_CONS] - m0[C_CONS]
    out["confirmed"] = m1[C_CONF] - m0[C_CONF]
    out["nacked"] = m1[C_NACK] - m0[C_NACK]
    out["series"] = series


def run(cfg: PerfConfig) -> dict[str, Any]:
    """Run one load test; returns the result dict (never raises for broker-side failures: see "errors")."""
    raise_nofile()
    sink_proc = None
    if cfg.sink:
        if cfg.confirm:
            raise SystemExit("--sink cannot answer confirms; run the ceiling test without --confirm")
        sink_proc, cfg.url = _start_sink(cfg.size)
    out: dict[str, Any] = {"config": {k: v for k, v in asdict(cfg).items() if k != "extra"}, "errors": [],
                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out["config"].update(cfg.extra)
    sampler = None
    if cfg.broker_pid:
        sampler = ProcSampler(cfg.broker_pid)
        sampler.start()
    procs: list[BaseProcess] = []
    t_setup = time.monotonic()
    try:
        asyncio.run(setup_topology(cfg))
    except Exception as exc:  # noqa: BLE001
        out["errors"].append(f"topology: {type(exc).__name__}: {exc}")
        out["failed"] = True
        if sampler:
            out["broker"] = sampler.stop()
        _stop_sink(sink_proc)
        return out
    roles = plan_roles(cfg)
    nw = max(1, min(cfg.processes, len(roles)))
    per_worker = [roles[i::nw] for i in range(nw)]
    ctx = mp.get_context("fork")
    counters = ctx.Array("q", nw * NSLOTS, lock=False)
    phase = ctx.Value("i", INIT, lock=False)
    result_q = ctx.Queue()
    lat = ctx.Array("q", nw * HIST_SIZE, lock=False) if cfg.progress > 0 else None
    procs = [ctx.Process(target=_worker_entry, args=(w, per_worker[w], cfg, counters, phase, result_q, lat),
                         daemon=True) for w in range(nw)]
    for p in procs:
        p.start()
    out["_t_setup"] = t_setup
    try:
        asyncio.run(_monitor(cfg, nw, counters, phase, procs, sampler, out, lat))
    except KeyboardInterrupt:  # Ctrl-C: the timed loop has recorded what was measured; go on and summarise
        out["interrupted"] = True
        if "window_s" not in out:
            out["failed"] = True
    except Exception as exc:  # noqa: BLE001
        out["errors"].append(f"run: {type(exc).__name__}: {exc}")
        out["failed"] = True
    finally:
        phase.value = STOP
        out.pop("_t_setup", None)
    worker_results: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(worker_results) < nw and time.monotonic() < deadline:
        try:
            worker_results.append(result_q.get(timeout=1.0))
        except Exception:  # noqa: BLE001 - queue.Empty
            if not any(p.is_alive() for p in procs) and result_q.empty():
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    if sampler:
        out["broker"] = b = sampler.stop()
        msgs = max(out.get("published", 0), out.get("consumed", 0))
        if b.get("cpu_s") is not None and msgs:
            b["cpu_us_per_msg"] = round(b["cpu_s"] * 1e6 / msgs, 2)
        if b.get("disk_write_bytes") is not None and out.get("published"):
            b["disk_write_bytes_per_published_msg"] = round(b["disk_write_bytes"] / out["published"], 1)
    _summarise_workers(out, worker_results, nw)
    if cfg.cleanup and not cfg.sink:
        try:
            asyncio.run(asyncio.wait_for(cleanup_topology(cfg), 120))
        except Exception as exc:  # noqa: BLE001
            out["errors"].append(f"cleanup: {type(exc).__name__}: {exc}")
    _stop_sink(sink_proc)
    return out


def _summarise_workers(out: dict[str, Any], results: list[dict[str, Any]], nw: int) -> None:
    hists, per_consumer, per_window = [], [], []
    streams = [r["stream"] for r in results if "fatal" not in r and r.get("stream") is not None]
    if streams:
        out["stream"] = _stream_summary(streams)
    cpu = 0.0
    util = []
    for r in results:
        if "fatal" in r:
            out["errors"].append(f"worker {r['worker']}: {r['fatal']}")
            continue
        hists.append(r["hist"])
        per_consumer += r["per_consumer"]
        per_window += r["per_consumer_window"]
        out["errors"] += r["errors"]
        cpu += r["cpu_s"]
        if r["wall_s"] > 0:
            util.append(round(r["cpu_s"] / r["wall_s"], 3))
        out["returned"] = out.get("returned", 0) + r["returned"]
    if len(results) < nw:
        out["errors"].append(f"only {len(results)} of {nw} workers reported")
    merged = merge_hists(hists) if hists else None
    lat = hist_percentiles(merged, (0.5, 0.75, 0.95, 0.99, 0.999)) if merged else {}
    if merged:
        stats = latency_stats(merged)
        lat["min"] = stats[0] if stats else None
    out["latency_us"] = lat
    if per_consumer:
        out["consumers"] = {"count": len(per_consumer), "min": min(per_consumer), "max": max(per_consumer),
                            "zero": sum(1 for n in per_consumer if n == 0),
                            "zero_in_window": sum(1 for n in per_window if n == 0)}
    out["client"] = {"processes": nw, "cpu_s": round(cpu, 3), "max_worker_cpu_util": max(util) if util else None}


def _stream_part(seen: bytearray, again: bytearray, consumers: list[Connection]) -> dict[str, Any]:
    """One worker's stream offsets, for :func:`_stream_summary`: its consumers' bitmaps and counts."""
    lows = [c.min_offset for c in consumers if c.min_offset >= 0]
    return {"bitmap": bytes(seen), "again": bytes(again), "duplicates": sum(c.duplicates for c in consumers),
            "redelivered": sum(c.redelivered for c in consumers), "no_offset": sum(c.no_offset for c in consumers),
            "min_offset": min(lows) if lows else -1,
            "max_offset": max(c.max_offset for c in consumers) if consumers else -1}


def _stream_summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the workers' offset bitmaps: an offset two workers both received without redelivered=true counts
    as a duplicate too; one a worker received again, redelivered (a group member's unsettled offsets handed to
    another member when it closed), is no duplicate, and counts among the distinct offsets."""
    union = 0
    unique_sum = 0
    redelivered_union = 0
    for p in parts:
        bits = int.from_bytes(p["bitmap"], "little")
        unique_sum += bits.bit_count()
        union |= bits
        redelivered_union |= int.from_bytes(p["again"], "little")
    first_deliveries = union.bit_count()
    distinct = (union | redelivered_union).bit_count()
    lows = [p["min_offset"] for p in parts if p["min_offset"] >= 0]
    lo, hi = (min(lows), max(p["max_offset"] for p in parts)) if lows else (-1, -1)
    dups = sum(p["duplicates"] for p in parts) + (unique_sum - first_deliveries)
    redelivered = sum(p["redelivered"] for p in parts)
    return {"deliveries": first_deliveries + dups + redelivered, "distinct_offsets": distinct, "duplicates": dups,
            "redelivered": redelivered, "no_offset": sum(p["no_offset"] for p in parts),
            "first_offset": lo, "last_offset": hi, "gaps": (hi - lo + 1 - distinct) if lows else 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_sink(size: int) -> tuple[BaseProcess, str]:
    from broker.tools import perf_sink as sink
    port = _free_port()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=sink.serve, args=(port, size, ready), daemon=True)
    p.start()
    if not ready.wait(10):
        raise SystemExit("the sink did not start")
    return p, f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def _stop_sink(p: BaseProcess | None) -> None:
    if p is not None:
        p.kill()
        p.join(5)


def summary_line(r: dict[str, Any]) -> str:
    lat = r.get("latency_us") or {}
    b = r.get("broker") or {}
    parts = [f"publish {r.get('publish_rate', 0):,.0f} msg/s", f"consume {r.get('consume_rate', 0):,.0f} msg/s"]
    if r.get("drain_rate") is not None:
        parts.append(f"drain {r['drain_rate']:,.0f} msg/s")
    if r.get("drain_publish_rate") is not None:
        parts.append(f"publish while draining {r['drain_publish_rate']:,.0f} msg/s")
    st = r.get("stream")
    if st:
        parts.append(f"stream offsets: {st['distinct_offsets']:,} distinct, {st['duplicates']} duplicate(s), "
                     f"{st['redelivered']} redelivered, {st['no_offset']} without offset, {st['gaps']} gap(s)")
    if lat.get("p50") is not None:
        parts.append(f"latency p50 {lat['p50']:.0f} µs p99 {lat['p99']:.0f} µs p99.9 {lat['p999']:.0f} µs")
    if b:
        parts.append(f"broker RSS peak {b.get('rss_peak_kb', 0) / 1024:.0f} MiB")
        if b.get("cpu_us_per_msg") is not None:
            parts.append(f"{b['cpu_us_per_msg']} µs CPU/msg")
    c = r.get("client") or {}
    if c.get("max_worker_cpu_util") is not None:
        parts.append(f"generator busiest worker {c['max_worker_cpu_util'] * 100:.0f}% CPU")
    if r.get("errors"):
        parts.append(f"{len(r['errors'])} error(s): {r['errors'][0]}")
    return "; ".join(parts)


_PERFTEST_EPILOG = """\
Output: a line every -i seconds in PerfTest's shape (rates since the previous line, latency of the deliveries
in between; publish → deliver, from a timestamp in the body, so -s must be ≥ 8), then the summary:

  id: test-114243-453, time 1.000 s, sent: 26390 msg/s, received: 25848 msg/s, min/median/75th/95th/99th consumer latency: 310/1203/1560/2210/2900 µs
  id: test-114243-453, sending rate avg: 26012 msg/s
  id: test-114243-453, receiving rate avg: 25990 msg/s
  id: test-114243-453, consumer latency min/median/75th/95th/99th 280/1190/1530/2190/2870 µs

and a last line with Leveret's extras (broker RSS and CPU with --broker-pid, errors). These lines go to stdout
on a terminal (--text: always); when stdout is a pipe or a file (--json: always) it gets the full result as
JSON, as scripts read it, and the lines go to stderr. --json-out FILE writes the JSON to FILE as well.

Where they differ from PerfTest: without -u the queues are perf-0 … (deleted and declared again at start,
deleted at the end; -ad false or --no-cleanup keeps them); without -z a run lasts 10 s, or until the -C/-D
counts are reached when one is given (-z 0: until the counts or Ctrl-C); with -C alone, the run ends once
the consumers have received what was published; -D counts per socket read, so a consumer stops within one
read of its count; -R is enforced by pausing the consumer's socket; -t takes direct, fanout or topic.
"""


def _kv_list(text: str) -> dict[str, str]:
    """PerfTest's KEY=VALUE,KEY=VALUE (-qa, -ca)."""
    return parse_kv([p for p in text.split(",") if p])


def _bool(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="leveret perf", description=__doc__.split("\n\n")[0], add_help=False,
                                 allow_abbrev=False, epilog=_PERFTEST_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-?", "--help", action="help", help="show this help and exit (-h is the URI, as in PerfTest)")
    pt = ap.add_argument_group("PerfTest's options (same letters, same meanings)")
    pt.add_argument("-h", "--uri", "--url", dest="url", default=PerfConfig.url,
                    help="connection URI, amqp://user:pass@host:port/vhost, or amqps://… for TLS "
                         "(default %(default)s)")
    pt.add_argument("-H", "--uris", help="connection URIs separated by commas; connections spread over them")
    pt.add_argument("-x", "--producers", type=int, default=1, help="producer count (one connection each)")
    pt.add_argument("-y", "--consumers", type=int, default=1, help="consumer count (one connection each)")
    pt.add_argument("-s", "--size", type=int, default=16,
                    help="message size in bytes (≥ 8 carries the timestamp for latency)")
    pt.add_argument("-u", "--queue", default="", help="queue name (default perf-0 … perf-N-1, see --queues)")
    pt.add_argument("-a", "--autoack", action="store_true", help="auto ack (default: manual acks, as PerfTest)")
    pt.add_argument("-q", "--qos", "--prefetch", dest="prefetch", type=int, default=0,
                    help="consumer prefetch count (basic.qos, with manual acks)")
    pt.add_argument("-c", "--confirm", type=int, default=0, help="publisher confirms: max unconfirmed publishes")
    pt.add_argument("-f", "--flag", dest="flags", action="append", choices=("persistent", "mandatory"),
                    help="message flag, repeatable: persistent (delivery-mode 2, durable queues), mandatory")
    pt.add_argument("-r", "--rate", type=float, default=0, help="producer rate limit, msg/s per producer")
    pt.add_argument("-R", "--consumer-rate", type=float, default=0, help="consumer rate limit, msg/s per consumer")
    pt.add_argument("-z", "--time", dest="duration", type=float, default=None,
                    help="run duration in seconds (default 10, or unlimited with -C/-D)")
    pt.add_argument("-C", "--pmessages", type=int, default=0, help="producer message count (each producer)")
    pt.add_argument("-D", "--cmessages", type=int, default=0, help="consumer message count (each consumer)")
    pt.add_argument("-e", "--exchange", help="exchange name (default: the default exchange; with -t: perf.TYPE)")
    pt.add_argument("-t", "--type", dest="exchange_type", choices=("direct", "fanout", "topic"),
                    help="exchange type (the queues are bound with -k, else their names; direct if only -e)")
    pt.add_argument("-k", "--routing-key", default="", help="routing key (default: the queue's name)")
    pt.add_argument("-p", "--predeclared", action="store_true",
                    help="use existing queues (and exchange): declare and delete nothing")
    pt.add_argument("-ad", "--auto-delete", type=_bool, default=True, metavar="true|false",
                    help="delete the queues at the end (default true)")
    pt.add_argument("-qa", "--queue-args", type=_kv_list, metavar="K=V,K=V", help="queue arguments")
    pt.add_argument("-ca", "--consumer-args", type=_kv_list, metavar="K=V,K=V", help="consumer arguments")
    pt.add_argument("-qq", "--quorum-queue", action="store_true", help="quorum queues (x-queue-type quorum)")
    pt.add_argument("-sq", "--stream-queue", action="store_true", help="stream queues (x-queue-type stream)")
    pt.add_argument("-i", "--interval", type=float, default=1.0, help="seconds between progress lines (0: none)")
    pt.add_argument("-d", "--id", default="", help="test ID (default test-HHMMSS-mmm)")
    lv = ap.add_argument_group("Leveret's own options (no PerfTest letter)")
    lv.add_argument("--queues", type=int, default=1, help="number of queues (perf-0 … perf-N-1, or -u NAME-i)")
    lv.add_argument("--queue-prefix", default="perf")
    lv.add_argument("--persistent", action="store_true", help="same as -f persistent")
    lv.add_argument("--durable", action="store_true", help="durable queues")
    lv.add_argument("--ack", action="store_true", help="manual acks (the default; multiple=true, one per socket read)")
    lv.add_argument("--fanout", action="store_true", help="same as -t fanout: one exchange bound to all queues")
    lv.add_argument("--backlog", type=int, default=0, help="publish N with no consumer, then drain")
    lv.add_argument("--warmup", type=float, default=0.0, help="seconds before measuring")
    lv.add_argument("--processes", type=int, default=1, help="worker processes")
    lv.add_argument("--broker-pid", type=int, help="PID whose RSS and CPU time are reported")
    lv.add_argument("--connect-concurrency", type=int, default=100)
    lv.add_argument("--no-cleanup", dest="cleanup", action="store_false", help="keep the queues (as -ad false)")
    lv.add_argument("--queue-type", default="", help="x-queue-type of the queues: stream, quorum, classic")
    lv.add_argument("--stream-offset", help="consumer argument x-stream-offset: first, last, next or a number")
    lv.add_argument("--consumer-arg", dest="consumer_arg", action="append", metavar="KEY=VALUE",
                    help="a consumer argument (repeatable), e.g. x-stream-group=perf; numbers are sent as numbers")
    lv.add_argument("--keep-publishing", action="store_true",
                    help="backlog mode: producers go on publishing while the consumers drain the first N")
    lv.add_argument("--cacert", metavar="FILE",
                    help="amqps:// URLs: check the server's certificate against this CA (PEM); the same as "
                         "?cacertfile=FILE in the URL")
    lv.add_argument("--sink", action="store_true",
                    help="run against a local sink (discards publishes, streams deliveries): the ceiling")
    out = lv.add_mutually_exclusive_group()
    out.add_argument("--json", dest="output", action="store_const", const="json",
                     help="the JSON result on stdout, the PerfTest lines on stderr (the default when stdout is "
                          "not a terminal, as scripts read it)")
    out.add_argument("--text", dest="output", action="store_const", const="text",
                     help="the PerfTest lines on stdout and no JSON there (the default on a terminal)")
    lv.add_argument("--json-out", help="also write the JSON result to this file")
    lv.add_argument("--series", action="store_true", help="keep the per-second series in the JSON")
    return ap


def with_cacert(url: str, cacert: str | None) -> str:
    """``--cacert FILE`` as the URL's ``cacertfile`` query parameter (amqps:// only), for broker/tools/amqp_client.py."""
    if not cacert or not url.startswith("amqps://") or "cacertfile=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}cacertfile={quote(os.path.abspath(cacert), safe='/')}"


def config_from_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> PerfConfig:
    flags = args.flags or []
    if args.quorum_queue and args.stream_queue:
        ap.error("-qq and -sq exclude each other")
    queue_type = "quorum" if args.quorum_queue else "stream" if args.stream_queue else args.queue_type
    if args.fanout and args.exchange_type not in (None, "fanout"):
        ap.error(f"--fanout and -t {args.exchange_type} exclude each other")
    exchange_type = "" if args.fanout else args.exchange_type or ("direct" if args.exchange else "")
    if args.exchange == "" and args.exchange_type:
        ap.error("-t needs a named exchange (-e NAME)")
    try:
        consumer_args = parse_kv(args.consumer_arg)
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    consumer_args.update(args.consumer_args or {})
    uris = [with_cacert(u, args.cacert) for u in (args.uris or "").split(",") if u]
    args.url = with_cacert(args.url, args.cacert)
    duration = args.duration if args.duration is not None else 0.0 if args.pmessages or args.cmessages else 10.0
    ms = int(time.time() * 1000) % 1000
    return PerfConfig(
        url=uris[0] if uris else args.url, uris=uris, producers=args.producers, consumers=args.consumers,
        queues=args.queues, queue_prefix=args.queue_prefix, queue=args.queue,
        exchange=args.exchange or f"perf.{exchange_type or 'fanout'}", exchange_type=exchange_type,
        fanout=args.fanout, routing_key=args.routing_key, size=args.size, rate=args.rate,
        consumer_rate=args.consumer_rate, persistent=args.persistent or "persistent" in flags,
        mandatory="mandatory" in flags, durable=args.durable, confirm=args.confirm, manual_ack=not args.autoack,
        prefetch=args.prefetch, backlog=args.backlog, duration=duration, warmup=args.warmup,
        pmessages=args.pmessages, cmessages=args.cmessages, processes=args.processes, broker_pid=args.broker_pid,
        connect_concurrency=args.connect_concurrency, cleanup=args.cleanup and args.auto_delete, sink=args.sink,
        queue_type=queue_type, queue_args=args.queue_args or {}, stream_offset=args.stream_offset,
        consumer_args=consumer_args, keep_publishing=args.keep_publishing, predeclared=args.predeclared,
        progress=args.interval, run_id=args.id or time.strftime("test-%H%M%S-") + f"{ms:03d}")


def summary_lines(cfg: PerfConfig, r: dict[str, Any]) -> list[str]:
    """PerfTest's end-of-run summary, then one line of Leveret's extras (summary_line)."""
    head = f"id: {cfg.run_id}"
    lines = [f"{head}, sending rate avg: {_rate(r.get('publish_rate', 0))} msg/s",
             f"{head}, receiving rate avg: {_rate(r.get('consume_rate', 0))} msg/s"]
    lat = r.get("latency_us") or {}
    if lat.get("p50") is not None:
        vals = [lat.get(k) or 0 for k in ("min", "p50", "p75", "p95", "p99")]
        lines.append(f"{head}, consumer latency min/median/75th/95th/99th "
                     + "/".join(f"{v:.0f}" for v in vals) + " µs")
    lines.append(f"{head}, {summary_line(r)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    global STOP_ON_SIGTERM
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.ack and args.autoack:
        ap.error("-a (auto ack) and --ack (manual acks) exclude each other")
    cfg = config_from_args(ap, args)
    as_json = args.output == "json" or (args.output is None and not sys.stdout.isatty())
    lines = sys.stderr if as_json else sys.stdout
    STOP_ON_SIGTERM = True
    with contextlib.redirect_stdout(lines):
        r = run(cfg)
    if not args.series:
        r.pop("series", None)
    text = json.dumps(r, indent=2)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    try:
        for line in summary_lines(cfg, r):
            print(line, file=lines, flush=True)
        for err in r.get("errors", [])[:10]:
            print(f"id: {cfg.run_id}, error: {err}", file=sys.stderr)
        if as_json:
            print(text, flush=True)
    except BrokenPipeError:  # | head: stop writing, and let the interpreter's final flush find nothing to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if r.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
