"""Idle connections as an operator runs them (issue 38: ≤ 10 KB each, a new connection and /api/overview served
in ms): N idle connections with one channel each, the HTTP API on.

    .venv/bin/python -m bench.idle_connections [--sizes 2000,10000,19000] [--baseline REF] [--json-out F]

cost_curves' ``connections`` curve runs Leveret with the HTTP API off, beside RabbitMQ; an operator's broker has
it on, and its rate sampler keeps state per connection and channel. At each size, once the broker's RSS has
settled (after two samples of the sampler): RSS per connection above the empty broker, idle CPU, a new
connection's open time (connection and channel, median of 5) and ``GET /api/overview`` (median of 5). With
``--baseline REF`` the same run is made on Leveret at REF first (a git worktree), side by side.

Each connection holds a file descriptor in the broker and one here: the sizes that fit under this process's
open-file limit run (raised where allowed), the others are reported as not run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import cost_curves
from bench.run_bench import BaselineLeveret, Leveret, machine_info
from broker.tools import perf
from broker.tools.amqp_client import connect


def _median_ms(samples: list[float]) -> float:
    return round(sorted(samples)[len(samples) // 2], 1)


def _overview_ms(management_port: int) -> float:
    req = urllib.request.Request(f"http://127.0.0.1:{management_port}/api/overview")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
        times.append((time.perf_counter() - t0) * 1000)
    return _median_ms(times)


def measure(broker: Leveret, management_port: int, sizes: list[int], limit: int) -> dict[int, dict[str, Any]]:
    label = f"leveret@{broker.ref}" if isinstance(broker, BaselineLeveret) else "leveret"
    broker.extra_args = ["--management-port", str(management_port)]
    broker.start()
    rows: dict[int, dict[str, Any]] = {}
    try:
        empty = cost_curves.footprint(broker, 0, {}, 2.0)
        conns: list[Any] = []

        async def run() -> None:
            sem = asyncio.Semaphore(100)

            async def one(i: int) -> Any:
                async with sem:
                    return await connect(broker.url, name=f"idle-{i}")

            for n in sizes:
                if n + 100 > limit:
                    rows[n] = {"note": f"not run: RLIMIT_NOFILE {limit} < {n} connections + margin"}
                    continue

                conns.extend(await asyncio.gather(*(one(i) for i in range(len(conns), n))))
                await asyncio.sleep(12)  # two passes of the HTTP API's rate sampler (every 5 s)
                row = await asyncio.to_thread(cost_curves.footprint, broker, n, empty, 10.0)  # two sampler passes
                opens = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    probe = await connect(broker.url, name="probe")
                    opens.append((time.perf_counter() - t0) * 1000)
                    await probe.close()
                row["new connection ms"] = _median_ms(opens)
                row["overview ms"] = await asyncio.to_thread(_overview_ms, management_port)
                rows[n] = row
                print(f"{label} {n}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()), flush=True)
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

        asyncio.run(run())
    finally:
        broker.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.idle_connections", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2000,10000,19000", help="connection counts, comma-separated")
    ap.add_argument("--baseline", metavar="REF", help="also measure Leveret at this git commit, first")
    ap.add_argument("--port", type=int, default=5780, help="AMQP port (the baseline's: the next one)")
    ap.add_argument("--management-port", type=int, default=15780, help="HTTP API port (the baseline's: the next)")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    limit = perf.raise_nofile(cost_curves.NOFILE_WANTED)
    results: dict[str, Any] = {"machine": machine_info(), "sizes": sizes}
    if args.baseline:
        base = BaselineLeveret(args.port + 1, args.baseline)
        try:
            results[f"leveret@{args.baseline}"] = measure(base, args.management_port + 1, sizes, limit)
        finally:
            base.remove_worktree()
    results["leveret"] = measure(Leveret(args.port), args.management_port, sizes, limit)
    print(json.dumps(results, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
