"""``python -m bench.shovel_throughput``: how fast Leveret's dynamic shovel moves a backlog, beside RabbitMQ's
own shovel moving the same backlog, measured in one run (issue 37).

Four scenarios, each a dynamic shovel with ``ack-mode: on-confirm`` and the same ``src-prefetch-count``:

- ``leveret_r2l``: RabbitMQ → Leveret, Leveret's shovel (PUT on Leveret's HTTP API; src-uri RabbitMQ node A,
  dest-uri ``amqp://``, the local Leveret);
- ``leveret_l2r``: Leveret → RabbitMQ, Leveret's shovel (src-uri ``amqp://``, dest-uri node A);
- ``rabbit_a2b``: RabbitMQ node A → node B, RabbitMQ's shovel (the ``rabbitmq_shovel`` plugin on A, the
  parameter PUT on A's HTTP API; src-uri ``amqp://``, node A itself, dest-uri node B): the reference;
- ``rabbit_r2l``: RabbitMQ → Leveret, RabbitMQ's shovel on A (the endpoints of ``leveret_r2l``, the other
  implementation).

Each round of a scenario: N persistent messages (``--size`` bytes) are published into a fresh durable source
queue with publisher confirms (broker.tools.amqp_client's pre-encoded batches, at most 2,000 unconfirmed), an
empty durable destination queue is declared, then the clock starts and the shovel parameter is PUT; the time is
taken when a passive ``queue.declare`` on the destination (polled every 20 ms over one AMQP connection) reports N
messages; rate = N / time. The source must be empty at the end (on-confirm acks follow the destination's
confirms, so this is waited for, with a deadline), then the shovel and both queues are deleted. Broker CPU
seconds (``/proc/PID/stat`` utime + stime of the Leveret process and each node's beam.smp) are taken over the
same window. The scenarios alternate round by round (the order rotates each round), so that whatever else runs
on the machine falls on every scenario alike; the report gives each scenario's median and the ratios of
Leveret's shovel to RabbitMQ's.

The RabbitMQ nodes are Debian's rabbitmq-server started by tests/integration/shovel/rabbit_node.py (the shovel
lane's helper: its own node names, ports and data directories owned by ``rabbitmq``); Leveret is
bench/run_bench.py's, with its HTTP API on a free port. Every process shares the machine's cores with the load
generator and the poller: read the ratios, not the absolute rates.

    python -m bench.shovel_throughput [--messages 50000] [--size 1024] [--repeat 2] [--prefetch 1000]
                                      [--only leveret_r2l,rabbit_a2b] [--json-out F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
from pamqp import commands

from bench.run_bench import Leveret, log, machine_info
from broker.tools.amqp_client import PublishTemplate, connect
from broker.tools.procstat import read_cpu_s
from tests.integration.shovel.rabbit_node import RabbitNode
from tests.worker_resources import free_port

ACK_MODE = "on-confirm"
CONFIRM_WINDOW = 2000
POLL_S = 0.02
SCENARIOS = ("leveret_r2l", "leveret_l2r", "rabbit_a2b", "rabbit_r2l")
AUTH = "Basic " + b64encode(b"guest:guest").decode()


@dataclass(frozen=True)
class Endpoint:
    """One broker as a shovel end: its AMQP port (the URL a shovel on another broker uses) and its pid."""

    name: str
    host_port: int
    pid: int

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.host_port}/%2F"


@dataclass(frozen=True)
class Scenario:
    """Which implementation runs the shovel (on whose HTTP API the parameter goes) and between which brokers."""

    key: str
    implementation: str  # "leveret" or "rabbitmq"
    api_port: int        # the HTTP API that gets the parameter: the broker the shovel runs on
    src: Endpoint
    dest: Endpoint
    runs_on_src: bool    # the shovel runs on the source broker (else on the destination)

    def value(self, src_queue: str, dest_queue: str, prefetch: int) -> dict[str, Any]:
        """The shovel parameter: the side the shovel runs on is ``amqp://`` (the local broker), as users write it."""
        runs_on_src = self.runs_on_src
        return {"src-protocol": "amqp091", "dest-protocol": "amqp091",
                "src-uri": "amqp://" if runs_on_src else self.src.url, "src-queue": src_queue,
                "dest-uri": "amqp://" if not runs_on_src else self.dest.url, "dest-queue": dest_queue,
                "ack-mode": ACK_MODE, "src-prefetch-count": prefetch, "src-delete-after": "never"}


# -- HTTP and AMQP helpers ----------------------------------------------------------------------------------

def http(port: int, method: str, path: str, body: object | None = None) -> int:
    """One request to a broker's HTTP API (guest); the status code (an error body is raised with it)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": AUTH, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{method} {path} on :{port}: {exc.code} {exc.read()[:300]!r}") from exc


def wait_http(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            http(port, "GET", "/api/overview")
            return
        except (OSError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Confirms:
    """Publisher confirms of one channel: the highest tag below which every publish is confirmed."""

    def __init__(self) -> None:
        self.floor = 0
        self.singles: set[int] = set()
        self.nacked = 0

    def on_confirm(self, tag: int, multiple: int, nack: bool) -> None:
        self.nacked += nack
        if multiple:
            if tag > self.floor:
                self.floor = tag
                self.singles = {t for t in self.singles if t > tag}
        else:
            self.singles.add(tag)
        while self.floor + 1 in self.singles:  # single confirms that close the gap above the floor
            self.floor += 1
            self.singles.discard(self.floor)


async def fill(url: str, queue: str, n: int, size: int) -> None:
    """``n`` persistent messages into durable ``queue``, every one confirmed."""
    conn = await connect(url, name="shovel-bench-fill")
    await conn.rpc(commands.Queue.Declare(queue=queue, durable=True))
    await conn.rpc(commands.Confirm.Select())
    confirms = Confirms()
    conn.confirm_listener = confirms
    template = PublishTemplate("", queue, size, True)
    sent = 0
    while confirms.floor < n:
        k = min(500, n - sent, CONFIRM_WINDOW - (sent - confirms.floor))
        if k > 0:
            conn.wire.write(template.batch(k))
            sent += k
        if conn.paused or conn.blocked:
            await conn.wait_writable()
        else:
            await asyncio.sleep(0 if k > 0 else 0.001)
        if conn.error:
            raise RuntimeError(f"fill {queue}: {conn.error}")
    await conn.close()
    if confirms.nacked:
        raise RuntimeError(f"fill {queue}: {confirms.nacked} publishes nacked")


class Counter:
    """A passive queue.declare over one pika connection: a queue's ready count, cheap enough to poll."""

    def __init__(self, ep: Endpoint) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(ep.url))
        self.ch = self.conn.channel()

    def count(self, queue: str) -> int:
        return int(self.ch.queue_declare(queue, passive=True).method.message_count)

    def declare(self, queue: str) -> None:
        self.ch.queue_declare(queue, durable=True)

    def delete(self, queue: str) -> None:
        self.ch.queue_delete(queue)

    def close(self) -> None:
        self.conn.close()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` every POLL_S until true; the monotonic time it first was. Raises at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(POLL_S)


def cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: read_cpu_s(pid) for name, pid in pids.items()}


# -- one round ------------------------------------------------------------------------------------------------

def run_round(sc: Scenario, rnd: int, args: argparse.Namespace, pids: dict[str, int]) -> dict[str, Any]:
    src_q, dest_q, name = f"sb-{sc.key}-{rnd}-src", f"sb-{sc.key}-{rnd}-dst", f"sb-{sc.key}-{rnd}"
    t_fill = time.monotonic()
    asyncio.run(fill(sc.src.url, src_q, args.messages, args.size))
    fill_s = time.monotonic() - t_fill
    src, dest = Counter(sc.src), Counter(sc.dest)
    try:
        dest.declare(dest_q)
        if src.count(src_q) != args.messages or dest.count(dest_q) != 0:
            raise RuntimeError(f"{sc.key}: source {src.count(src_q)}, destination {dest.count(dest_q)} before")
        path = f"/api/parameters/shovel/%2F/{urllib.parse.quote(name)}"
        cpu0 = cpu(pids)
        t0 = time.monotonic()
        http(sc.api_port, "PUT", path, {"value": sc.value(src_q, dest_q, args.prefetch)})
        t1 = wait_until(lambda: dest.count(dest_q) >= args.messages, args.round_timeout,
                        f"{sc.key}: {args.messages} messages at the destination")
        cpu1 = cpu(pids)
        wait_until(lambda: src.count(src_q) == 0, 60, f"{sc.key}: source queue empty")
        http(sc.api_port, "DELETE", path)
        final = dest.count(dest_q)
        src.delete(src_q)
        dest.delete(dest_q)
    finally:
        src.close()
        dest.close()
    seconds = t1 - t0
    result = {"scenario": sc.key, "round": rnd, "seconds": round(seconds, 3),
              "rate_msg_s": round(args.messages / seconds), "fill_s": round(fill_s, 2),
              "destination_final": final,
              "cpu_s": {k: round(cpu1[k] - cpu0[k], 2) for k in pids}}
    log(f"{sc.key} round {rnd}: {result['rate_msg_s']} msg/s ({seconds:.2f} s), cpu {result['cpu_s']}")
    return result


# -- summary ----------------------------------------------------------------------------------------------------

def summarize(rounds: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for key in keys:
        mine = [r for r in rounds if r["scenario"] == key]
        if not mine:
            continue
        medians[key] = {"rate_msg_s": round(statistics.median(r["rate_msg_s"] for r in mine)),
                        "seconds": round(statistics.median(r["seconds"] for r in mine), 3),
                        "cpu_s": {p: round(statistics.median(r["cpu_s"][p] for r in mine), 2)
                                  for p in mine[0]["cpu_s"]},
                        "rounds": len(mine)}
    ratios = {}
    for num, den in (("leveret_r2l", "rabbit_a2b"), ("leveret_l2r", "rabbit_a2b"), ("leveret_r2l", "rabbit_r2l"),
                     ("rabbit_r2l", "rabbit_a2b")):
        if num in medians and den in medians:
            ratios[f"{num}/{den}"] = round(medians[num]["rate_msg_s"] / medians[den]["rate_msg_s"], 3)
    return {"medians": medians, "rate_ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shovel_throughput", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000, help="messages moved per round")
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--repeat", type=int, default=2, help="rounds of each scenario (alternating)")
    ap.add_argument("--prefetch", type=int, default=1000,
                    help="src-prefetch-count of every shovel (1000: both implementations' default)")
    ap.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    ap.add_argument("--round-timeout", type=float, default=600)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    keys = [k for k in args.only.split(",") if k]
    if unknown := set(keys) - set(SCENARIOS):
        ap.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    # a TERM (or the lead's Ctrl-C) stops the nodes and Leveret through the finally below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    info = machine_info()
    node_a = RabbitNode(plugins=["rabbitmq_management", "rabbitmq_shovel"])
    node_b = RabbitNode(plugins=[])
    leveret = Leveret(free_port())
    leveret_http = free_port()
    leveret.extra_args = ["--management-port", str(leveret_http)]
    try:
        log("starting RabbitMQ nodes A (management, shovel) and B, and Leveret")
        node_a.start()
        node_b.start()
        leveret.start()
        wait_http(node_a.http_port)
        wait_http(leveret_http)
        pid_a, pid_b = node_a.pid(), node_b.pid()
        if leveret.pid is None or pid_a is None or pid_b is None:
            raise RuntimeError("a broker's pid is unknown")
        lv = Endpoint("leveret", leveret.port, leveret.pid)
        ra = Endpoint("rabbit_a", node_a.port, pid_a)
        rb = Endpoint("rabbit_b", node_b.port, pid_b)
        scenarios = {
            "leveret_r2l": Scenario("leveret_r2l", "leveret", leveret_http, ra, lv, runs_on_src=False),
            "leveret_l2r": Scenario("leveret_l2r", "leveret", leveret_http, lv, ra, runs_on_src=True),
            "rabbit_a2b": Scenario("rabbit_a2b", "rabbitmq", node_a.http_port, ra, rb, runs_on_src=True),
            "rabbit_r2l": Scenario("rabbit_r2l", "rabbitmq", node_a.http_port, ra, lv, runs_on_src=True),
        }
        pids = {"leveret": lv.pid, "rabbit_a": ra.pid, "rabbit_b": rb.pid}
        rounds: list[dict[str, Any]] = []
        for rnd in range(args.repeat):
            order = keys[rnd % len(keys):] + keys[:rnd % len(keys)]
            for key in order:
                rounds.append(run_round(scenarios[key], rnd, args, pids))
        report = {"benchmark": "shovel_throughput", "machine": info, "messages": args.messages,
                  "size": args.size, "ack_mode": ACK_MODE, "src_prefetch_count": args.prefetch,
                  "repeat": args.repeat, "order": "scenarios alternate round by round, order rotated each round",
                  "scenarios": {k: {"implementation": scenarios[k].implementation,
                                    "src": scenarios[k].src.name, "dest": scenarios[k].dest.name,
                                    "parameter": scenarios[k].value("SRC", "DST", args.prefetch)} for k in keys},
                  "rounds": rounds, **summarize(rounds, keys),
                  "load_avg_at_end": list(os.getloadavg())}
    finally:
        leveret.stop()
        node_a.cleanup()
        node_b.cleanup()
    text = json.dumps(report, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
