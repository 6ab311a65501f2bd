"""``python -m bench.perf``: a PerfTest-like load generator for any AMQP 0-9-1 broker.

    python -m bench.perf --url amqp://guest:guest@127.0.0.1:5672/%2F -x 1 -y 1 -s 16 --time 10
    python -m bench.perf --url ... -s 1024 --persistent --confirm 100 --ack --prefetch 100
    python -m bench.perf --url ... --fanout --queues 10 -y 10
    python -m bench.perf --url ... --backlog 1000000 -s 1024 --ack --prefetch 100
    python -m bench.perf --url ... --rate 5000 -s 1024 --ack --prefetch 100       # latency at a fixed rate
    python -m bench.perf --sink ...                                              # the generator's own ceiling
    python -m bench.perf --url ... --broker-pid PID --json-out result.json
    python -m bench.perf --url ... --queue-type stream --stream-offset first -s 1024 --confirm 1000 --ack -q 1000
    python -m bench.perf --url ... --queue-type stream --stream-offset first --ack -q 1000 -y 4 \
        --consumer-arg x-stream-group=perf                                       # a consumer group (Leveret)
    python -m bench.perf --url ... --queue-type stream --stream-offset first --confirm 1000 --ack -q 1000 \
        --backlog 1000000 --keep-publishing                      # read a 1 M stream while publishing goes on

Structure: the parent process declares the topology (several control connections in parallel), forks
``--processes`` workers (producers and consumers spread round-robin, one connection each), and then only
watches: it flips a shared phase word (GO → MEASURE → [DRAIN] → STOP), samples the workers' counters
(published in shared memory every 50 ms), the broker's /proc (RSS every 100 ms, CPU time at start and end),
and for the backlog mode polls the queue depth with passive queue.declare. Workers run uvloop and the raw
client in bench/amqp.py. The result is one JSON object (stdout, and --json-out).

Rates are counted over the measurement window only (after --warmup); latency (publish → deliver, from the
monotonic timestamp at the start of each body) is recorded in the same window.

Stream queues (``--queue-type stream``): the queues are declared durable with ``x-queue-type: stream``; the
consumers need ``--ack`` and ``--prefetch`` (RabbitMQ and Leveret refuse a stream consumer without them) and
start at ``--stream-offset`` (consumer argument ``x-stream-offset``: first, last, next, a number);
``--consumer-arg KEY=VALUE`` adds any consumer argument (``x-stream-group=NAME`` for a Leveret consumer
group). Every delivery's ``x-stream-offset`` header is recorded (see bench/amqp.py) and the result gets a
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
import json
import multiprocessing as mp
import resource
import socket
import sys
import time
from dataclasses import asdict, dataclass, field

from pamqp import commands

from bench.amqp import (
    Connection,
    PublishTemplate,
    connect,
    hist_percentiles,
    merge_hists,
    new_hist,
)
from bench.procstat import ProcSampler

INIT, GO, MEASURE, DRAIN, STOP = 0, 1, 2, 3, 4
# Per-worker counter slots in shared memory.
C_PUB, C_CONF, C_NACK, C_CONS, C_ERR, C_READY, C_PDONE = range(7)
NSLOTS = 7


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
    consumer_args: dict = field(default_factory=dict)  # further consumer arguments (x-stream-group, …)
    keep_publishing: bool = False  # backlog mode: producers go on publishing while the consumers drain
    label: str = ""
    extra: dict = field(default_factory=dict)

    def queue_names(self) -> list[str]:
        return [f"{self.queue_prefix}-{i}" for i in range(max(1, self.queues))]

    @property
    def stream(self) -> bool:
        return self.queue_type == "stream"

    def queue_arguments(self) -> dict:
        return {"x-queue-type": self.queue_type} if self.queue_type else {}

    def consume_arguments(self) -> dict:
        args = {"x-stream-offset": _arg_value(self.stream_offset)} if self.stream_offset is not None else {}
        args.update({k: _arg_value(v) for k, v in self.consumer_args.items()})
        return args


def _arg_value(v):
    """A consumer argument from the command line: integers as numbers (a numeric x-stream-offset), else text."""
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return v


def parse_kv(items: list[str] | None) -> dict:
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {it!r}")
        out[k] = v
    return out


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


# ---------------------------------------------------------------------------------------------------------
# Producer
class Publisher:
    def __init__(self, conn: Connection, exchange: str, keys: list[str], cfg: PerfConfig, total: int) -> None:
        self.conn = conn
        self.templates = [PublishTemplate(exchange, k, cfg.size, cfg.persistent) for k in keys]
        self.batch_max = max(1, cfg.batch_bytes // self.templates[0].wire_size)
        self.window = cfg.confirm
        self.rate = cfg.rate
        self.total = total
        self.sent = 0
        self.confirmed = 0
        self.nacked = 0
        self._floor = 0
        self._singles: set[int] = set()
        self._waiter: asyncio.Future | None = None
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
def plan_roles(cfg: PerfConfig) -> list[tuple]:
    qnames = cfg.queue_names()
    q = len(qnames)
    roles: list[tuple] = []
    for i in range(cfg.consumers):
        roles.append(("c", i, qnames[i % q]))
    p = cfg.producers
    for j in range(p):
        if cfg.fanout:
            exchange, keys = cfg.exchange, [""]
        else:
            exchange = ""
            keys = [qnames[k] for k in range(q) if k % p == j] or [qnames[j % q]]
        total = cfg.backlog // p + (1 if j < cfg.backlog % p else 0) if cfg.backlog and not cfg.keep_publishing \
            else 0
        roles.append(("p", j, exchange, keys, total))
    return roles


async def _start_consumer(conn: Connection, queue: str, idx: int, cfg: PerfConfig) -> None:
    conn.manual_ack = cfg.manual_ack
    if cfg.manual_ack and cfg.prefetch:
        await conn.rpc(commands.Basic.Qos(prefetch_count=cfg.prefetch))
    await conn.rpc(commands.Basic.Consume(queue=queue, consumer_tag=f"perf-{idx}", no_ack=not cfg.manual_ack,
                                          arguments=cfg.consume_arguments() or None))


async def worker_main(wid: int, roles: list[tuple], cfg: PerfConfig, counters, phase) -> dict:
    base = wid * NSLOTS
    errors: list[str] = []
    sem = asyncio.Semaphore(cfg.connect_concurrency)
    consumers: list[tuple[Connection, str, int]] = []
    publishers: list[Publisher] = []
    hist = new_hist()
    seen = bytearray() if cfg.stream else None  # offsets delivered, shared by this worker's consumers

    async def open_role(role: tuple) -> None:
        async with sem:
            kind, idx = role[0], role[1]
            conn = await connect(cfg.url, name=f"perf-{kind}{idx}")
            if kind == "c":
                conn.seen = seen
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

            async def start(c, q, i):
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
        conn_errors = sum(1 for c, _q, _i in consumers if c.error) + sum(1 for p in publishers if p.conn.error)
        counters[base + C_ERR] = len(errors) + conn_errors
        if ph >= STOP:
            break
        await asyncio.sleep(0.05)
    t_stop = time.monotonic()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
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
    if seen is not None:
        cs = [c for c, _q, _i in consumers]
        lows = [c.min_offset for c in cs if c.min_offset >= 0]
        stream = {"bitmap": bytes(seen), "duplicates": sum(c.duplicates for c in cs),
                  "redelivered": sum(c.redelivered for c in cs), "no_offset": sum(c.no_offset for c in cs),
                  "min_offset": min(lows) if lows else -1, "max_offset": max(c.max_offset for c in cs) if cs else -1}
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


def _worker_entry(wid: int, roles: list[tuple], cfg: PerfConfig, counters, phase, result_q) -> None:
    raise_nofile()
    try:
        import uvloop
        res = uvloop.run(worker_main(wid, roles, cfg, counters, phase))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        res = {"worker": wid, "fatal": f"{type(exc).__name__}: {exc}"}
        counters[wid * NSLOTS + C_READY] = 1
        counters[wid * NSLOTS + C_ERR] += 1
    result_q.put(res)


# ---------------------------------------------------------------------------------------------------------
# Parent: topology, phases, measurement
async def _parallel_control(cfg: PerfConfig, items: list, action, conns: int = 16) -> None:
    if not items:
        return
    n = max(1, min(conns, len(items)))
    chunks = [items[i::n] for i in range(n)]

    async def run(chunk):
        c = await connect(cfg.url, name="perf-control")
        try:
            for it in chunk:
                await action(c, it)
        finally:
            await c.close()
    await asyncio.gather(*(run(ch) for ch in chunks))


async def setup_topology(cfg: PerfConfig) -> None:
    durable = cfg.durable or cfg.persistent
    if cfg.fanout:
        c = await connect(cfg.url, name="perf-control")
        try:
            await c.rpc(commands.Exchange.Declare(exchange=cfg.exchange, exchange_type="fanout", durable=durable))
        finally:
            await c.close()

    async def declare(c: Connection, q: str) -> None:
        await c.rpc(commands.Queue.Delete(queue=q))
        await c.rpc(commands.Queue.Declare(queue=q, durable=durable or cfg.stream,
                                           arguments=cfg.queue_arguments() or None))
        if cfg.fanout:
            await c.rpc(commands.Queue.Bind(queue=q, exchange=cfg.exchange, routing_key=""))
    await _parallel_control(cfg, cfg.queue_names(), declare)


async def cleanup_topology(cfg: PerfConfig) -> None:
    async def delete(c: Connection, q: str) -> None:
        await c.rpc(commands.Queue.Delete(queue=q))
    await _parallel_control(cfg, cfg.queue_names(), delete)
    if cfg.fanout:
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


def _totals(counters, nw: int) -> list[int]:
    out = [0] * NSLOTS
    for w in range(nw):
        for s in range(NSLOTS):
            out[s] += counters[w * NSLOTS + s]
    return out


async def _monitor(cfg: PerfConfig, nw: int, counters, phase, procs, sampler, out: dict) -> None:
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
    t0 = time.monotonic()
    phase.value = GO
    if cfg.backlog:
        expected_depth = cfg.backlog * (max(1, cfg.queues) if cfg.fanout else 1)
        ctrl = await connect(cfg.url, name="perf-depth")
        try:
            last_progress = (time.monotonic(), -1)
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
        end = tm + cfg.duration
        while True:
            now = time.monotonic()
            tot = _totals(counters, nw)
            series.append((round(now - t0, 2), tot[C_PUB], tot[C_CONS]))
            if now >= end:
                break
            if tot[C_ERR] and not any(p.is_alive() for p in procs):
                break
            await asyncio.sleep(min(1.0, end - now))
        m1 = _totals(counters, nw)
        window = time.monotonic() - tm
        out["publish_rate"] = round((m1[C_PUB] - m0[C_PUB]) / window, 1)
        out["consume_rate"] = round((m1[C_CONS] - m0[C_CONS]) / window, 1)
    if sampler:
        sampler.mark_end()
    phase.value = STOP
    out["window_s"] = round(window, 3)
    out["published"] = m1[C_PUB] - m0[C_PUB]
    out["consumed"] = m1[C_CONS] - m0[C_CONS]
    out["confirmed"] = m1[C_CONF] - m0[C_CONF]
    out["nacked"] = m1[C_NACK] - m0[C_NACK]
    out["series"] = series


def run(cfg: PerfConfig) -> dict:
    """Run one load test; returns the result dict (never raises for broker-side failures: see "errors")."""
    raise_nofile()
    sink_proc = None
    if cfg.sink:
        if cfg.confirm:
            raise SystemExit("--sink cannot answer confirms; run the ceiling test without --confirm")
        sink_proc, cfg.url = _start_sink(cfg.size)
    out: dict = {"config": {k: v for k, v in asdict(cfg).items() if k != "extra"}, "errors": [],
                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out["config"].update(cfg.extra)
    sampler = None
    if cfg.broker_pid:
        sampler = ProcSampler(cfg.broker_pid)
        sampler.start()
    procs: list = []
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
    procs = [ctx.Process(target=_worker_entry, args=(w, per_worker[w], cfg, counters, phase, result_q),
                         daemon=True) for w in range(nw)]
    for p in procs:
        p.start()
    out["_t_setup"] = t_setup
    try:
        asyncio.run(_monitor(cfg, nw, counters, phase, procs, sampler, out))
    except Exception as exc:  # noqa: BLE001
        out["errors"].append(f"run: {type(exc).__name__}: {exc}")
        out["failed"] = True
    finally:
        phase.value = STOP
        out.pop("_t_setup", None)
    worker_results = []
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


def _summarise_workers(out: dict, results: list[dict], nw: int) -> None:
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
    lat = hist_percentiles(merge_hists(hists)) if hists else {}
    out["latency_us"] = lat
    if per_consumer:
        out["consumers"] = {"count": len(per_consumer), "min": min(per_consumer), "max": max(per_consumer),
                            "zero": sum(1 for n in per_consumer if n == 0),
                            "zero_in_window": sum(1 for n in per_window if n == 0)}
    out["client"] = {"processes": nw, "cpu_s": round(cpu, 3), "max_worker_cpu_util": max(util) if util else None}


def _stream_summary(parts: list[dict]) -> dict:
    """Merge the workers' offset bitmaps: an offset two workers both received counts as a duplicate too."""
    union = 0
    unique_sum = 0
    for p in parts:
        bits = int.from_bytes(p["bitmap"], "little")
        unique_sum += bits.bit_count()
        union |= bits
    distinct = union.bit_count()
    lows = [p["min_offset"] for p in parts if p["min_offset"] >= 0]
    lo, hi = (min(lows), max(p["max_offset"] for p in parts)) if lows else (-1, -1)
    dups = sum(p["duplicates"] for p in parts) + (unique_sum - distinct)
    redelivered = sum(p["redelivered"] for p in parts)
    return {"deliveries": distinct + dups + redelivered, "distinct_offsets": distinct, "duplicates": dups,
            "redelivered": redelivered, "no_offset": sum(p["no_offset"] for p in parts),
            "first_offset": lo, "last_offset": hi, "gaps": (hi - lo + 1 - distinct) if lows else 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_sink(size: int):
    from bench import sink
    port = _free_port()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=sink.serve, args=(port, size, ready), daemon=True)
    p.start()
    if not ready.wait(10):
        raise SystemExit("the sink did not start")
    return p, f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def _stop_sink(p) -> None:
    if p is not None:
        p.kill()
        p.join(5)


def summary_line(r: dict) -> str:
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.perf", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", "-H", default=PerfConfig.url)
    ap.add_argument("--producers", "-x", type=int, default=1)
    ap.add_argument("--consumers", "-y", type=int, default=1)
    ap.add_argument("--queues", "-u", type=int, default=1, help="number of queues (perf-0 … perf-N-1)")
    ap.add_argument("--queue-prefix", default="perf")
    ap.add_argument("--size", "-s", type=int, default=16, help="body size in bytes (≥ 8 carries a timestamp)")
    ap.add_argument("--rate", "-r", type=float, default=0, help="publish rate limit per producer, msg/s")
    ap.add_argument("--persistent", "-f", action="store_true", help="delivery-mode 2, durable queues")
    ap.add_argument("--durable", action="store_true", help="durable queues")
    ap.add_argument("--confirm", "-c", type=int, default=0, help="publisher confirms, at most N outstanding")
    ap.add_argument("--ack", dest="manual_ack", action="store_true", help="manual acks (multiple=true, one per socket read)")
    ap.add_argument("--prefetch", "-q", type=int, default=0, help="basic.qos prefetch (with --ack)")
    ap.add_argument("--fanout", action="store_true", help="publish to a fanout exchange bound to all queues")
    ap.add_argument("--backlog", type=int, default=0, help="publish N with no consumer, then drain")
    ap.add_argument("--time", "-z", dest="duration", type=float, default=10.0, help="seconds to measure")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds before measuring")
    ap.add_argument("--processes", "-P", type=int, default=1, help="worker processes")
    ap.add_argument("--broker-pid", type=int, help="PID whose RSS and CPU time are reported")
    ap.add_argument("--connect-concurrency", type=int, default=100)
    ap.add_argument("--no-cleanup", dest="cleanup", action="store_false")
    ap.add_argument("--queue-type", default="", help="x-queue-type of the queues: stream, quorum, classic")
    ap.add_argument("--stream-offset", help="consumer argument x-stream-offset: first, last, next or a number")
    ap.add_argument("--consumer-arg", dest="consumer_args", action="append", metavar="KEY=VALUE",
                    help="a consumer argument (repeatable), e.g. x-stream-group=perf; numbers are sent as numbers")
    ap.add_argument("--keep-publishing", action="store_true",
                    help="backlog mode: producers go on publishing while the consumers drain the first N")
    ap.add_argument("--sink", action="store_true",
                    help="run against a local sink (discards publishes, streams deliveries): the ceiling")
    ap.add_argument("--json-out", help="also write the JSON result to this file")
    ap.add_argument("--series", action="store_true", help="keep the per-second series in the JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kw = {k: v for k, v in vars(args).items() if k not in ("json_out", "series")}
    try:
        kw["consumer_args"] = parse_kv(kw["consumer_args"])
    except argparse.ArgumentTypeError as exc:
        build_parser().error(str(exc))
    cfg = PerfConfig(**kw)
    r = run(cfg)
    if not args.series:
        r.pop("series", None)
    text = json.dumps(r, indent=2)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    print(summary_line(r), file=sys.stderr)
    return 1 if r.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
