"""``python -m bench.cluster_quorum``: quorum queues on a Leveret cluster against RabbitMQ's (issue 15).

Two measurements, side by side in one run:

1. **S3-like throughput** (persistent, publisher confirms ≤ 100 outstanding, 1 KiB, manual acks with prefetch
   100) into one quorum queue, with one publisher and one consumer per node, on 1, 2 and 3 Leveret nodes
   sharing one PostgreSQL; RabbitMQ 3.10's quorum queue on its one node gets the same numbers of clients.
   PostgreSQL runs with ``fsync = on`` and ``synchronous_commit = on`` (what a confirm means; the test
   suite's throwaway servers run with fsync off), its other settings from tests/pg_server.py.
2. **Fail-over time**: a consumer on node A holds every message of a quorum queue unacked (prefetch =
   the message count) while a consumer on node B waits; node A is killed with SIGKILL, and the time from the
   kill to B's first and last redelivery is taken, over ``--rounds`` rounds (p50, p99).

It starts its own PostgreSQL (tests/pg_server.py: run it from a source checkout with PostgreSQL installed,
as ``make test`` leaves the machine) and RabbitMQ (bench/run_bench.py's, on its own ports). Load generator,
brokers and PostgreSQL share the machine's CPUs: read the ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

from bench.run_bench import ROOT, Leveret, RabbitMQ, machine_info, port_free

sys.path.insert(0, str(ROOT / "tests"))
from pg_server import PgServer  # tests/ is not a package

PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node(Leveret):
    """One Leveret cluster member (bench/run_bench.py's Leveret, given the cluster's DSN and a node name) on a
    free port."""

    def __init__(self, name: str, dsn: str) -> None:
        super().__init__(free_port())
        self.name = name
        self.extra_args = ["--set", f"cluster.postgres.dsn={dsn}", "--set", f"leveret.nodename={name}"]
        self.log_path = Path(tempfile.gettempdir()) / f"leveret-cluster-bench-{name}-{self.port}.log"

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def psql(pg: PgServer, sql: str) -> str:
    """Runs ``sql``; its rows, unaligned (``-At``)."""
    cmd = ["psql", "-At", "-h", "127.0.0.1", "-p", str(pg.port), "-U", pg.user, "-d", "postgres", "-c", sql]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


# The server settings a reader needs to judge the figures (the rest are PostgreSQL's defaults).
REPORTED_SETTINGS = ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes",
                     "shared_buffers", "wal_buffers", "max_wal_size", "checkpoint_timeout", "commit_delay",
                     "max_connections", "autovacuum")


def pg_settings(pg: PgServer) -> dict[str, str]:
    names = ", ".join(f"'{n}'" for n in REPORTED_SETTINGS)
    rows = psql(pg, f"SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN ({names})")
    return dict(line.split("|", 1) for line in rows.splitlines() if "|" in line)


def start_postgres() -> PgServer:
    """A PostgreSQL that makes commits durable (fsync on), as a production one would."""
    srv = PgServer()
    srv.start()
    psql(srv, "ALTER SYSTEM SET fsync = on")
    psql(srv, "ALTER SYSTEM SET synchronous_commit = on")
    psql(srv, "SELECT pg_reload_conf()")
    return srv


def declare_everywhere(urls: list[str], queue: str, arguments: dict[str, Any] | None = None) -> None:
    """Declare the queue (durable; a quorum queue unless ``arguments`` say otherwise) on the first URL and wait
    until every node knows it, so that a run measures throughput, not how soon the others learn of it."""
    conn = pika.BlockingConnection(pika.URLParameters(urls[0]))
    conn.channel().queue_declare(queue, durable=True,
                                 arguments={"x-queue-type": "quorum"} if arguments is None else arguments)
    conn.close()
    for url in urls[1:]:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        deadline = time.monotonic() + 10
        while True:
            try:
                conn.channel().queue_declare(queue, passive=True)
                break
            except pika.exceptions.ChannelClosedByBroker:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conn.close()


def delete_queue(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_delete(queue)
    conn.close()


def perf(urls: list[str], pairs: int, seconds: int, queue: str) -> dict[str, Any]:
    """broker/tools/perf.py's S3 load against ``queue`` (a quorum queue, declared first on every node), ``pairs``
    publishers and consumers whose connections are spread over ``urls``."""
    declare_everywhere(urls, queue)
    cmd = [PY, "-m", "broker.tools.perf", "-H", ",".join(urls), "-x", str(pairs), "-y", str(pairs), "-s", "1024",
           "-f", "persistent", "-c", "100", "-q", "100", "-p", "-u", queue,
           "-z", str(seconds), "--warmup", "2", "-i", "0", "--json"]
    out = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"perf failed: {out.stderr[-2000:]}")
    delete_queue(urls[0], queue)
    result = json.loads(out.stdout)
    if result.get("errors"):
        raise RuntimeError(f"perf reported errors: {result['errors']}")
    return result


def throughput(pg: PgServer, rabbit: RabbitMQ | None, seconds: int) -> list[dict[str, Any]]:
    rows = []
    for n in (1, 2, 3):
        db = f"tp{n}"
        psql(pg, f"CREATE DATABASE {db}")
        nodes = [Node(f"bench{i}", pg.dsn(db)) for i in range(n)]
        try:
            for node in nodes:
                node.start()
            res = perf([x.url for x in nodes], n, seconds, f"cq-{n}")
        finally:
            for node in nodes:
                node.stop()
        row = {"nodes": n, "pairs": n, "leveret_publish": res.get("publish_rate"),
               "leveret_consume": res.get("consume_rate")}
        if rabbit is not None:
            rres = perf([rabbit.url], n, seconds, f"cq-{n}")
            row["rabbitmq_publish"] = rres.get("publish_rate")
            row["rabbitmq_consume"] = rres.get("consume_rate")
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


class Waiter:
    """A consumer on node B that notes when each redelivered message arrives."""

    def __init__(self, url: str, queue: str, expected: int) -> None:
        self.url = url
        self.queue = queue
        self.expected = expected
        self.times: list[float] = []
        self.ready = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        deadline = time.monotonic() + 10
        while True:  # the queue reaches B's memory with the definitions feed (polled twice a second)
            ch = conn.channel()
            try:
                ch.queue_declare(self.queue, passive=True)
                break
            except pika.exceptions.ChannelClosedByBroker:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        ch.basic_qos(prefetch_count=self.expected)

        def on_message(c, method, props, body) -> None:
            self.times.append(time.monotonic())
            c.basic_ack(method.delivery_tag)
            if len(self.times) >= self.expected:
                self.done.set()

        ch.basic_consume(self.queue, on_message)
        self.ready.set()
        deadline = time.monotonic() + 60
        while not self.done.is_set() and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        conn.close()


def hold_into(held: list[int]):
    """A consumer callback that keeps every delivery unacked (its tag noted in ``held``)."""
    return lambda _ch, method, _props, _body: held.append(method.delivery_tag)


def failover(pg: PgServer, rounds: int, messages: int) -> dict[str, Any]:
    db = "failover"
    psql(pg, f"CREATE DATABASE {db}")
    b = Node("fo-b", pg.dsn(db))
    b.start()
    first: list[float] = []
    last: list[float] = []
    try:
        for r in range(rounds):
            a = Node(f"fo-a{r}", pg.dsn(db))
            a.start()
            queue = f"failover-{r}"
            conn = pika.BlockingConnection(pika.URLParameters(a.url))
            ch = conn.channel()
            ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
            ch.confirm_delivery()
            for i in range(messages):
                ch.basic_publish("", queue, b"x" * 1024, pika.BasicProperties(delivery_mode=2))
            ch.basic_qos(prefetch_count=messages)
            held: list[int] = []
            ch.basic_consume(queue, hold_into(held))
            deadline = time.monotonic() + 30
            while len(held) < messages and time.monotonic() < deadline:
                conn.process_data_events(0.05)
            if len(held) < messages:
                raise RuntimeError(f"round {r}: node A delivered {len(held)} of {messages}")
            waiter = Waiter(b.url, queue, messages)
            waiter.ready.wait(10)
            time.sleep(0.3)  # B's consumer is registered and its fetcher idle: nothing is ready
            if waiter.times:
                raise RuntimeError(f"round {r}: B received messages A held")
            killed = time.monotonic()
            a.kill9()
            if not waiter.done.wait(60):
                raise RuntimeError(f"round {r}: B got {len(waiter.times)} of {messages} after the kill")
            first.append((waiter.times[0] - killed) * 1000)
            last.append((waiter.times[-1] - killed) * 1000)
            print(json.dumps({"round": r, "first_ms": round(first[-1], 1), "last_ms": round(last[-1], 1)}),
                  flush=True)
    finally:
        b.stop()

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"rounds": rounds, "messages": messages,
            "first_p50_ms": round(statistics.median(first), 1), "first_p99_ms": round(pct(first, 0.99), 1),
            "last_p50_ms": round(statistics.median(last), 1), "last_p99_ms": round(pct(last, 0.99), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_quorum", description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=10, help="length of each throughput run")
    ap.add_argument("--rounds", type=int, default=20, help="fail-over rounds")
    ap.add_argument("--messages", type=int, default=100, help="messages held by the killed node per round")
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--only", choices=("throughput", "failover"))
    ap.add_argument("--rabbitmq-port", type=int, default=5692)
    args = ap.parse_args(argv)
    pg = start_postgres()
    rabbit = None
    try:
        result: dict[str, Any] = {"machine": machine_info(), "postgresql": pg_settings(pg)}
        if args.only != "failover":
            if not args.no_rabbitmq:
                if not port_free(args.rabbitmq_port):
                    raise SystemExit(f"port {args.rabbitmq_port} is taken")
                rabbit = RabbitMQ(args.rabbitmq_port)
                rabbit.start()
            result["throughput"] = throughput(pg, rabbit, args.seconds)
        if args.only != "throughput":
            result["failover"] = failover(pg, args.rounds, args.messages)
        print(json.dumps(result, indent=1))
    finally:
        if rabbit is not None:
            rabbit.stop()
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
