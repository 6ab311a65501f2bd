"""``python -m bench.cluster_forward``: what forwarding to a node-local queue of another cluster member costs
(issue 15; broker/cluster_forwarding.py).

Two Leveret members on one PostgreSQL (a throwaway server from tests/pg_server.py unless ``--dsn``). A classic
durable queue lives on member A, one consumer on A (manual acks, prefetch 200). The same load runs twice with
bench.perf's generator (1 KiB persistent messages, publisher confirms with ``--confirm`` outstanding):

- *remote*: the producer connected to member B: every message is forwarded through ``leveret.forward``;
- *local*: the producer connected to member A itself.

Prints one JSON object: published and consumed msg/s of each run, latency percentiles, and the ratio.

    python -m bench.cluster_forward [--time 10] [--size 1024] [--confirm 200] [--rate 2000] [--dsn postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "fwd-bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Member:
    def __init__(self, name: str, dsn: str, root: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.log = root / f"{name}.log"
        cmd = [sys.executable, "-m", "broker", "serve", "--bind", "127.0.0.1", "--port", str(self.port),
               "--data-dir", str(root / name), "--management-port", str(_free_port()),
               "--prometheus-port", str(_free_port()),
               "--set", f"cluster.postgres.dsn={dsn}", "--set", f"leveret.nodename={name}@bench"]
        env = dict(os.environ, PYTHONUNBUFFERED="1", LEVERET_LOG_FORMAT="json")
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"member {name} exited:\n{self.log.read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"member {name} did not listen")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _declare(a: Member, b: Member) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    conn.channel().queue_declare(QUEUE, durable=True)
    conn.close()
    deadline = time.monotonic() + 10
    while True:  # b knows the queue (the directory's doorbell)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        try:
            conn.channel().queue_declare(QUEUE, passive=True)
            return
        except pika.exceptions.ChannelClosedByBroker:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        finally:
            if conn.is_open:
                conn.close()


def _perf(consumer_url: str, producer_url: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.perf", "-H", f"{consumer_url},{producer_url}", "-x", "1", "-y", "1",
           "-u", QUEUE, "-p", "-s", str(args.size), "-f", "persistent", "-c", str(args.confirm), "-q", "200",
           "-z", str(args.time), "--warmup", str(args.warmup), "--json-out", str(out),
           *(["-r", str(args.rate)] if args.rate else [])]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dict(json.loads(out.read_text()))


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("publish_rate", "consume_rate", "published", "confirmed", "nacked", "latency_us", "errors")
    return {k: r[k] for k in keep if k in r}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--confirm", type=int, default=200)
    p.add_argument("--rate", type=float, default=0.0, help="producer rate limit, msg/s (0: as fast as it goes)")
    p.add_argument("--dsn", default="")
    args = p.parse_args(argv)
    server = None
    if not args.dsn:
        sys.path.insert(0, str(ROOT / "tests"))
        from pg_server import PgServer

        server = PgServer()
        server.start()
        args.dsn = server.dsn()
    members: list[Member] = []
    try:
        with tempfile.TemporaryDirectory(prefix="leveret-fwd-bench-") as tmp:
            root = Path(tmp)
            a = Member("a", args.dsn, root)
            members.append(a)
            b = Member("b", args.dsn, root)
            members.append(b)
            _declare(a, b)
            remote = _perf(a.url, b.url, args, root / "remote.json")
            local = _perf(a.url, a.url, args, root / "local.json")
            result = {"size": args.size, "confirm": args.confirm, "seconds": args.time, "rate": args.rate,
                      "postgres": "fsync=off (tests/pg_server.py)" if server is not None else "given --dsn",
                      "remote_b_to_a": _summary(remote), "local_a": _summary(local)}
            for k in ("publish_rate", "consume_rate"):
                if k in remote and k in local and local[k]:
                    result[f"{k}_ratio_remote_to_local"] = round(remote[k] / local[k], 3)
            print(json.dumps(result, indent=2))
            return result
    finally:
        for m in members:
            m.stop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
