"""``python -m bench.cluster_quorum``: quorum queues on a Leveret cluster against RabbitMQ's (issue 15).

Two measurements, side by side in one run:

1. **S3-like throughput** (persistent, publisher confirms ≤ 100 outstanding, 1 KiB, manual acks with prefetch
   100) into one quorum queue, with one publisher and one consumer per node, on 1, 2 and 3 Leveret nodes
   sharing one PostgreSQL; RabbitMQ 3.10's quorum queue on its one node gets the same numbers of clients, or
   with ``--rabbitmq-cluster`` a RabbitMQ cluster of three nodes on this machine (:class:`RabbitCluster`): on
   n nodes the queue has n replicas (``x-quorum-initial-group-size``) and the clients are spread over them.
   PostgreSQL runs with ``fsync = on`` and ``synchronous_commit = on`` (what a confirm means; the test
   suite's throwaway servers run with fsync off), its other settings from tests/pg_server.py.
2. **Fail-over time**: a consumer on node A holds every message of a quorum queue unacked (prefetch =
   the message count) while a consumer on node B waits; node A is killed with SIGKILL, and the time from the
   kill to B's first and last redelivery is taken, over ``--rounds`` rounds (p50, p99). With
   ``--rabbitmq-cluster``, the same on the RabbitMQ cluster (its killed node started again after each round).

``--only definitions`` measures instead a definitions import (10,000 durable queues, each with a binding)
posted to one member of a two-member cluster; with ``--rabbitmq-cluster``, the same into a two-node RabbitMQ
cluster's management API.

It starts its own PostgreSQL (tests/pg_server.py: run it from a source checkout with PostgreSQL installed,
as ``make test`` leaves the machine) and RabbitMQ (bench/run_bench.py's, on its own ports). Load generator,
brokers and PostgreSQL share the machine's CPUs: read the ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
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


def perf(urls: list[str], pairs: int, seconds: int, queue: str,
         arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """broker/tools/perf.py's S3 load against ``queue`` (a quorum queue unless ``arguments`` say otherwise,
    declared first on every node), ``pairs`` publishers and consumers whose connections are spread over ``urls``."""
    declare_everywhere(urls, queue, arguments)
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


class RabbitCluster:
    """Three RabbitMQ nodes on this machine, each with its own name, ports and data directory (bench/run_bench.py's
    RabbitMQ, run as the ``rabbitmq`` user sharing its Erlang cookie), joined into one cluster with
    ``rabbitmqctl join_cluster`` as RabbitMQ's clustering guide does it."""

    def __init__(self, base_port: int, size: int = 3, management_port: int | None = None) -> None:
        """``management_port``: the first node's HTTP API (the management plugin, on every node)."""
        self.nodes = [RabbitMQ(base_port + 100 * i, None if management_port is None else management_port + i)
                      for i in range(size)]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        first = self.nodes[0].node
        for node in self.nodes[1:]:
            ctl = "/usr/lib/rabbitmq/bin/rabbitmqctl -n $RABBITMQ_NODENAME"
            node._su(f"{ctl} stop_app && {ctl} join_cluster {first} && {ctl} start_app", check=True,
                     capture_output=True)

    def urls(self, n: int) -> list[str]:
        return [node.url for node in self.nodes[:n]]

    def kill9(self, i: int) -> None:
        node = self.nodes[i]
        if node.pid is not None:
            os.kill(node.pid, signal.SIGKILL)
            while Path(f"/proc/{node.pid}").exists():
                time.sleep(0.05)
            node.pid = None

    def restart(self, i: int) -> None:
        """Start a killed node again on its data directory: it rejoins the cluster it was in."""
        node = self.nodes[i]
        node.launch()
        node.pid = node._find_pid()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


def throughput(pg: PgServer, rabbit: RabbitMQ | None, seconds: int,
               rabbit_cluster: RabbitCluster | None = None) -> list[dict[str, Any]]:
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
        if rabbit_cluster is not None:
            rres = perf(rabbit_cluster.urls(n), n, seconds, f"cq-{n}",
                        {"x-queue-type": "quorum", "x-quorum-initial-group-size": n})
            row["rabbitmq_cluster_publish"] = rres.get("publish_rate")
            row["rabbitmq_cluster_consume"] = rres.get("consume_rate")
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
        try:
            conn.close()
        except pika.exceptions.AMQPError:  # its node is being stopped (the run is over)
            pass


def hold_into(held: list[int]):
    """A consumer callback that keeps every delivery unacked (its tag noted in ``held``)."""
    return lambda _ch, method, _props, _body: held.append(method.delivery_tag)


def failover_round(a_url: str, b_url: str, queue: str, messages: int, kill_a: Callable[[], None],
                   arguments: dict[str, Any] | None = None) -> tuple[float, float]:
    """One round: ``messages`` confirmed into ``queue`` through A, all held unacked by a consumer on A while a
    consumer on B waits; ``kill_a()``; the ms from the kill to B's first and last redelivery."""
    conn = pika.BlockingConnection(pika.URLParameters(a_url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=arguments or {"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for _ in range(messages):
        ch.basic_publish("", queue, b"x" * 1024, pika.BasicProperties(delivery_mode=2))
    ch.basic_qos(prefetch_count=messages)
    held: list[int] = []
    ch.basic_consume(queue, hold_into(held))
    deadline = time.monotonic() + 30
    while len(held) < messages and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    if len(held) < messages:
        raise RuntimeError(f"{queue}: node A delivered {len(held)} of {messages}")
    waiter = Waiter(b_url, queue, messages)
    waiter.ready.wait(10)
    time.sleep(0.3)  # B's consumer is registered and its fetcher idle: nothing is ready
    if waiter.times:
        raise RuntimeError(f"{queue}: B received messages A held")
    killed = time.monotonic()
    kill_a()
    if not waiter.done.wait(60):
        raise RuntimeError(f"{queue}: B got {len(waiter.times)} of {messages} after the kill")
    return (waiter.times[0] - killed) * 1000, (waiter.times[-1] - killed) * 1000


def _summary(rounds: int, messages: int, first: list[float], last: list[float]) -> dict[str, Any]:
    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"rounds": rounds, "messages": messages,
            "first_p50_ms": round(statistics.median(first), 1), "first_p99_ms": round(pct(first, 0.99), 1),
            "last_p50_ms": round(statistics.median(last), 1), "last_p99_ms": round(pct(last, 0.99), 1)}


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
            f, la = failover_round(a.url, b.url, f"failover-{r}", messages, a.kill9)
            first.append(f)
            last.append(la)
            print(json.dumps({"round": r, "first_ms": round(f, 1), "last_ms": round(la, 1)}), flush=True)
    finally:
        b.stop()
    return _summary(rounds, messages, first, last)


def failover_rabbitmq(cluster: RabbitCluster, rounds: int, messages: int) -> dict[str, Any]:
    """The same rounds on the RabbitMQ cluster: A is its second node, B its third (the queue's three replicas
    keep a quorum without A); A is started again after each round."""
    first: list[float] = []
    last: list[float] = []
    a_url, b_url = cluster.urls(3)[1:]
    for r in range(rounds):
        f, la = failover_round(a_url, b_url, f"failover-{r}", messages, lambda: cluster.kill9(1),
                               {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3})
        first.append(f)
        last.append(la)
        print(json.dumps({"rabbitmq_round": r, "first_ms": round(f, 1), "last_ms": round(la, 1)}), flush=True)
        cluster.restart(1)
    return _summary(rounds, messages, first, last)


def _http(method: str, url: str, body: bytes | None = None, timeout: float = 600) -> Any:
    request = urllib.request.Request(url, data=body, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        data = response.read()
    return json.loads(data) if data else None


def _definitions(queues: int) -> bytes:
    """The document both brokers import: ``queues`` durable classic queues, each bound to amq.topic."""
    return json.dumps({
        "queues": [{"name": f"imported-{i}", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
                   for i in range(queues)],
        "bindings": [{"source": "amq.topic", "vhost": "/", "destination": f"imported-{i}",
                      "destination_type": "queue", "routing_key": f"key.{i}.#", "arguments": {}}
                     for i in range(queues)],
    }).encode()


def _timed_import(post_to: str, count_from: str, body: bytes, queues: int) -> dict[str, Any]:
    """POST ``body`` to ``post_to`` (one member's /api/definitions), timed until the answer; then the queues
    the other member's /api/overview counts (``count_from``)."""
    started = time.monotonic()
    _http("POST", post_to + "/api/definitions", body)
    took = time.monotonic() - started
    totals = _http("GET", count_from + "/api/overview")["object_totals"]
    return {"queues": queues, "bindings": queues, "seconds": round(took, 2),
            "bindings_per_s": round(queues / took), "queues_per_s": round(queues / took),
            "b_object_totals_queues": totals.get("queues")}


def definitions_import(pg: PgServer, queues: int) -> dict[str, Any]:
    """A definitions import on a two-member cluster (issue 35: >= 2,000 bindings/s): ``queues`` durable classic
    queues, each bound to amq.topic, posted to member A's POST /api/definitions (what ``rabbitmqadmin import`` and
    the UI send); the time until the HTTP answer, when every queue and binding is in A's directory in PostgreSQL
    for B to route to. Checked after: B's GET /api/overview counts them (its listing includes A's queues)."""
    db = "defs"
    psql(pg, f"CREATE DATABASE {db}")
    members = [Node(name, pg.dsn(db)) for name in ("defs-a", "defs-b")]
    http_ports = [free_port(), free_port()]
    for node, port in zip(members, http_ports, strict=True):
        node.extra_args += ["--management-port", str(port)]
    body = _definitions(queues)
    try:
        for node in members:
            node.start()
        return _timed_import(f"http://127.0.0.1:{http_ports[0]}", f"http://127.0.0.1:{http_ports[1]}", body,
                             queues)
    finally:
        for node in members:
            node.stop()


def definitions_import_rabbitmq(base_port: int, queues: int) -> dict[str, Any]:
    """The same import into a two-node RabbitMQ cluster (its management plugin's POST /api/definitions on the
    first node; the second node's overview counted after)."""
    management = free_port()
    cluster = RabbitCluster(base_port, size=2, management_port=management)
    try:
        cluster.start()
        return _timed_import(f"http://127.0.0.1:{management}", f"http://127.0.0.1:{management + 1}",
                             _definitions(queues), queues)
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_quorum", description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=10, help="length of each throughput run")
    ap.add_argument("--rounds", type=int, default=20, help="fail-over rounds")
    ap.add_argument("--messages", type=int, default=100, help="messages held by the killed node per round")
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--only", choices=("throughput", "failover", "definitions"))
    ap.add_argument("--definitions-queues", type=int, default=10_000,
                    help="queues (each with one binding) in the definitions import")
    ap.add_argument("--rabbitmq-port", type=int, default=5692)
    ap.add_argument("--rabbitmq-cluster", action="store_true",
                    help="compare with a three-node RabbitMQ cluster on this machine instead of one node")
    args = ap.parse_args(argv)
    pg = start_postgres()
    rabbit = None
    cluster = None
    try:
        result: dict[str, Any] = {"machine": machine_info(), "postgresql": pg_settings(pg)}
        if args.only == "definitions":
            result["definitions_import"] = definitions_import(pg, args.definitions_queues)
            if args.rabbitmq_cluster:
                result["definitions_import_rabbitmq"] = definitions_import_rabbitmq(args.rabbitmq_port,
                                                                                    args.definitions_queues)
            print(json.dumps(result, indent=1))
            return 0
        if not args.no_rabbitmq:
            if not port_free(args.rabbitmq_port):
                raise SystemExit(f"port {args.rabbitmq_port} is taken")
            if args.rabbitmq_cluster:
                cluster = RabbitCluster(args.rabbitmq_port)
                cluster.start()
            elif args.only != "failover":
                rabbit = RabbitMQ(args.rabbitmq_port)
                rabbit.start()
        if args.only != "failover":
            result["throughput"] = throughput(pg, rabbit, args.seconds, cluster)
        if args.only != "throughput":
            result["failover"] = failover(pg, args.rounds, args.messages)
            if cluster is not None:
                result["failover_rabbitmq"] = failover_rabbitmq(cluster, args.rounds, args.messages)
        print(json.dumps(result, indent=1))
    finally:
        if rabbit is not None:
            rabbit.stop()
        if cluster is not None:
            cluster.stop()
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
