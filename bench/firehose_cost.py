"""What the firehose costs the broker (issue 36's traffic pipeline reads it): CPU per message at a fixed rate,
tracing off and on, Leveret beside RabbitMQ in one run.

    .venv/bin/python -m bench.firehose_cost [--rate 5000] [--seconds 20] [--rounds 2] [--brokers leveret,rabbitmq]
    .venv/bin/python -m bench.firehose_cost --brokers leveret --baseline REF   # this tree against a commit

The traffic is the lag bench's (bench/spark_pipeline_lag.py): ``leveret perf`` with two producers and two
consumers, 100-byte bodies, manual acks, at ``--rate`` messages a second in all. With tracing on, the vhost's
firehose (``amq.rabbitmq.trace``) goes to a durable stream queue bound with ``#``, as the traffic job reads it;
nothing consumes the stream, so the figure is the firehose's own cost (serving a reader comes on top).
RabbitMQ traces a publish and a delivery; Leveret also an ack (its traffic job pairs deliveries with acks), so
the events a message are 2 and 3. Each round runs every (broker, tracing) case on a fresh broker, alternating;
``--baseline REF`` adds Leveret at commit REF (a git worktree, as run_bench's) to the brokers.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika

from bench.run_bench import BaselineLeveret, Leveret, RabbitMQ, machine_info
from bench.spark_pipeline_lag import _api, _cpu_seconds, _free_port, _trace_stream


def _trace_on_rabbitmq(broker: RabbitMQ) -> None:
    broker._su("/usr/lib/rabbitmq/bin/rabbitmqctl -n $RABBITMQ_NODENAME trace_on -p /", check=True,
               capture_output=True)


def _stream_bound_to_firehose(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    _trace_stream(conn.channel())
    conn.close()


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one_case(name: str, tracing: bool, rate: int, seconds: int, baseline: str | None = None) -> dict[str, Any]:
    port = _free_port()
    if name.startswith("leveret"):
        management = _free_port()
        broker: Any = BaselineLeveret(port, baseline) if name != "leveret" and baseline else Leveret(port)
        broker.extra_args = ["--management-port", str(management)]
    else:
        broker = RabbitMQ(port)
    broker.start()
    try:
        if tracing:
            _stream_bound_to_firehose(port)
            if name.startswith("leveret"):
                _api(management, "PUT", "vhosts/%2F", {"tracing": True})
            else:
                _trace_on_rabbitmq(broker)
        pid = broker.pid
        perf_before = _children_cpu()
        cpu_before, t0 = _cpu_seconds(pid), time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "broker", "perf", "--url", broker.url, "--producers", "2", "--consumers", "2",
             "--rate", str(rate // 2), "--size", "100", "--ack", "--time", str(seconds), "--json"],
            check=True, capture_output=True, text=True).stdout
        cpu, wall = _cpu_seconds(pid) - cpu_before, time.monotonic() - t0
        report = json.loads(out)
        consumed = report.get("consume_rate") or 0.0
        return {"broker": name, "tracing": tracing, "asked_rate": rate, "consume_rate": round(consumed),
                "broker_cores": round(cpu / wall, 3),
                "broker_us_per_msg": round(cpu / (consumed * wall) * 1e6, 1) if consumed else None,
                "perf_cores": round((_children_cpu() - perf_before) / wall, 3)}
    finally:
        broker.stop()
        if isinstance(broker, BaselineLeveret):
            broker.remove_worktree()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.firehose_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=5000, help="messages a second in all (default 5000)")
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--brokers", default="leveret,rabbitmq")
    ap.add_argument("--baseline", metavar="REF", help="also run Leveret at this git commit")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    names = args.brokers.split(",") + ([f"leveret@{args.baseline}"] if args.baseline else [])
    rows = []
    for rnd in range(args.rounds):
        for name in names:
            for tracing in (False, True):
                row = one_case(name, tracing, args.rate, args.seconds, args.baseline)
                row["round"] = rnd
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| broker | tracing | consumed msg/s | broker cores | broker µs a message | perf cores |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['broker']} | {'on' if r['tracing'] else 'off'} | {r['consume_rate']:,} | {r['broker_cores']} "
              f"| {r['broker_us_per_msg']} | {r['perf_cores']} |")
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine_info(), "args": vars(args) | {"json_out": None},
                                             "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
