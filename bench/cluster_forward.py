"""``python -m bench.cluster_forward``: what forwarding to a node-local queue of another cluster member costs
(issue 15; broker/clustering/cluster_forwarding.py).

Two Leveret members on one PostgreSQL (bench/cluster_quorum.py's: a throwaway server with fsync on, unless
``--dsn``). A classic
durable queue lives on member A, one consumer on A (manual acks, prefetch 200). The same load runs twice with
broker.tools.perf's generator (1 KiB persistent messages, publisher confirms with ``--confirm`` outstanding):

- *remote*: the producer connected to member B: every message is forwarded through ``leveret.forward``;
- *local*: the producer connected to member A itself.

Prints one JSON object: published and consumed msg/s of each run, latency percentiles, and the ratio.

    python -m bench.cluster_forward [--time 10] [--size 1024] [--confirm 200] [--rate 2000] [--dsn postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.cluster_quorum import Node, declare_everywhere, start_postgres
from bench.run_bench import ROOT

QUEUE = "fwd-bench"


def _perf(consumer_url: str, producer_url: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "broker.tools.perf", "-H", f"{consumer_url},{producer_url}", "-x", "1", "-y", "1",
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
        server = start_postgres()
        args.dsn = server.dsn()
    members: list[Node] = []
    try:
        with tempfile.TemporaryDirectory(prefix="leveret-fwd-bench-") as tmp:
            root = Path(tmp)
            for name in ("a", "b"):
                members.append(Node(name, args.dsn))
                members[-1].start()
            a, b = members
            declare_everywhere([a.url, b.url], QUEUE, arguments={})
            remote = _perf(a.url, b.url, args, root / "remote.json")
            local = _perf(a.url, a.url, args, root / "local.json")
            result = {"size": args.size, "confirm": args.confirm, "seconds": args.time, "rate": args.rate,
                      "postgres": "fsync=on (bench/cluster_quorum.py)" if server is not None else "given --dsn",
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
