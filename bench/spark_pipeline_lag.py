"""End-to-end lag of the traffic pipeline (issue 13): a message published → its row in the traffic parquet.

    .venv/bin/python -m bench.spark_pipeline_lag [--rate 5000] [--seconds 60] [--trigger 10]

Starts a broker of its own (temporary data dir, free ports), turns tracing on, binds a stream ``trace`` to
``amq.rabbitmq.trace``, starts the traffic job (leveret_pipeline.traffic, in this process, a processingTime
trigger), waits for its first micro-batch (so the JVM's start is not measured), then runs ``leveret perf``
(``--rate`` split over two producers, two consumers, manual acks) for ``--warm-up`` + ``--seconds``, and lets
the job catch up; lags and CPU are measured over the last ``--seconds`` (the JIT has warmed on real batches). The lag of a message = when the micro-batch that counted its publish finished replacing that minute's
traffic file (``_batches.jsonl``'s ``done_ms``) − the publish's ``x-leveret-event-time``. It is at least the
wait for the next trigger (0 to ``--trigger`` s) plus the batch's read and processing time; it grows without
bound when a batch takes longer than the trigger interval for the traffic it holds (the job falls behind).

Prints p50 / p99 / max over the publishes of the perf run, the rates the broker and the job reached, and each
micro-batch (events; seconds in all, reading + parsing, pairing + writing the events, recomputing the
minutes) and the CPU used while perf ran (cores: the broker; the job — this process, its JVM and Python
workers), and, once the job is done, the raw drain rate of the
same trace stream by ``leveret perf`` (one consumer from ``first``, manual acks, prefetch 2,000: what a plain
AMQP consumer reads of it on this machine, beside the job's read rate); ``--json-out`` keeps them. Needs Java 17 and ``pip install -e pipeline``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pika


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/{path}", data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def _start_broker(port: int, management: int, data_dir: Path, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--port", str(port), "--management-port", str(management),
         "--prometheus-port", "0", "--data-dir", str(data_dir)],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115 (the child owns it)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _api(management, "GET", "overview")
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the broker did not start: {log.read_text(errors='replace')[-2000:]}")


def _trace_stream(ch: Any) -> None:
    """Declare the durable stream ``trace`` and bind it to the firehose with ``#`` (as the traffic job reads it)."""
    ch.queue_declare("trace", durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_bind("trace", "amq.rabbitmq.trace", "#")


def _trace_into_stream(port: int, management: int) -> None:
    _api(management, "PUT", "vhosts/%2F", {"tracing": True})
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    _trace_stream(ch)
    ch.queue_declare("warm-up")
    ch.basic_publish("", "warm-up", b"first batch")
    conn.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    listing = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], check=True, capture_output=True, text=True).stdout
    for line in listing.splitlines():
        pid, ppid = (int(x) for x in line.split())
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _cpu_by_process_tree(broker: int, perf: int | None) -> dict[str, float]:
    """CPU seconds so far of the broker and of the job (this process and its other descendants: Spark's JVM
    and its Python workers; perf and its children left out)."""
    def total(pids: list[int]) -> float:
        seconds = 0.0
        for pid in pids:
            try:
                seconds += _cpu_seconds(pid)
            except OSError:  # gone meanwhile
                pass
        return seconds

    perf_tree = _descendants(perf) if perf is not None else []
    job = [p for p in _descendants(os.getpid()) if p != broker and p not in perf_tree]
    return {"broker": total([broker]), "job": total(job)}


def _quantile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _raw_drain(uri: str, stream: str, n: int, tmp: Path) -> float | None:
    """``leveret perf`` reading the first ``n`` events of the stream as one plain consumer: events/s."""
    out = tmp / "drain.json"
    subprocess.run([sys.executable, "-m", "broker", "perf", "--url", uri, "-x", "0", "-y", "1", "--queue", stream,
                    "--predeclared", "--stream-offset", "first", "--cmessages", str(n), "--ack", "--prefetch",
                    "2000", "--time", "300", "--json-out", str(out)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=400)
    if not out.exists():
        return None
    rate = json.loads(out.read_text()).get("consume_rate")
    return float(rate) if rate is not None else None


def _lags(spark: Any, uri: str, management: int, out: Path, first_ms: int, last_ms: int) -> list[int]:
    """Lag (ms) of every publish event with its time in [first_ms, last_ms]: the ``done_ms`` of the batch that
    read its offset (the first whose ``top_offset`` reaches it) − its event time. The publishes' offsets and
    times are read from the trace stream itself (a batch read after the job: the job keeps no events)."""
    import bisect

    from leveret_pipeline.traffic import EVENT_TIME
    from pyspark.sql import functions as F

    last: dict[int, tuple[int, int]] = {}
    for line in (out / "_batches.jsonl").read_text().splitlines():
        record = json.loads(line)
        last[record["batch"]] = (record["top_offset"], record["done_ms"])  # a batch run twice: its last run
    tops = [last[b][0] for b in sorted(last)]
    done = [last[b][1] for b in sorted(last)]
    trace = (spark.read.format("leveret").option("uri", uri).option("queue", "trace")
             .option("managementUri", f"http://127.0.0.1:{management}").option("headerKeys", EVENT_TIME).load())
    t = F.col("headers").getItem(EVENT_TIME).cast("bigint")
    table = trace.where(F.col("routing_key").startswith("publish.") & t.between(first_ms, last_ms)).select(
        "offset", t.alias("t")).toArrow()
    lags = []
    for offset, when in zip(table["offset"].to_pylist(), table["t"].to_pylist(), strict=True):
        i = bisect.bisect_left(tops, offset)
        if i < len(tops):
            lags.append(done[i] - when)
    return lags


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_pipeline_lag", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=5000, help="messages/s published (over two producers)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long perf publishes, measured")
    ap.add_argument("--warm-up", type=float, default=30.0,
                    help="seconds of the same traffic before the measured ones (the JVM's JIT warms on real "
                         "batches: the first big batches of a fresh job cost ~3x a warm one's CPU)")
    ap.add_argument("--trigger", type=float, default=10.0, help="the job's micro-batch interval, seconds")
    ap.add_argument("--size", type=int, default=100, help="message body bytes")
    ap.add_argument("--catch-up", type=float, default=300.0, help="longest wait for the job after perf, s")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)

    from leveret_pipeline.cli import _session
    from leveret_pipeline.traffic import TrafficJob, TrafficSink, run

    tmp = Path(tempfile.mkdtemp(prefix="leveret-lag-"))
    port, management = _free_port(), _free_port()
    broker = _start_broker(port, management, tmp / "data", tmp / "broker.log")
    perf: subprocess.Popen | None = None
    try:
        _trace_into_stream(port, management)
        uri = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        spark, _ = _session("local[2]")
        job = TrafficJob(uri=uri, stream="trace", out=tmp / "out", management_uri=f"http://127.0.0.1:{management}",
                         trigger_seconds=args.trigger)
        window: dict[str, int] = {}
        cpu: dict[str, float] = {}
        perf_done = threading.Event()
        batches: list[dict[str, Any]] = []

        def start_perf() -> None:
            nonlocal perf
            window["first"] = int((time.time() + args.warm_up) * 1000)

            def measure_cpu() -> None:
                time.sleep(args.warm_up)
                cpu.update({f"start_{k}": v for k, v in _cpu_by_process_tree(broker.pid, perf.pid if perf else None).items()})

            threading.Thread(target=measure_cpu, daemon=True).start()
            perf = subprocess.Popen(
                [sys.executable, "-m", "broker", "perf", "--url", uri, "--producers", "2", "--consumers", "2",
                 "--rate", str(args.rate // 2), "--size", str(args.size), "--ack", "--time", str(args.warm_up + args.seconds),
                 "--json-out", str(tmp / "perf.json")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            def wait() -> None:
                assert perf is not None
                perf.wait()
                window["last"] = int(time.time() * 1000)
                cpu.update({f"end_{k}": v for k, v in _cpu_by_process_tree(broker.pid, None).items()})
                perf_done.set()

            threading.Thread(target=wait, daemon=True).start()

        def on_batch(record: dict[str, Any]) -> None:
            batches.append(record)
            print(json.dumps(record), file=sys.stderr, flush=True)
            if len(batches) == 1:
                start_perf()  # the job is warm: the first batch (the warm-up message) is done

        started = time.monotonic()

        def caught_up(sink: TrafficSink) -> bool:
            if not perf_done.is_set():
                return False
            if time.monotonic() - started > args.warm_up + args.seconds + args.catch_up + 120:
                print("the job did not catch up within --catch-up", file=sys.stderr)
                return True
            # (the source's offsets, not the sink's events: those are per queue and kind, and a publish that
            # reached no queue has none)
            return sink.read_to.get("trace", 0) >= _api(management, "GET", "queues/%2F/trace")["next_offset"]

        run(spark, job, on_batch=on_batch, until=caught_up)
        lags = _lags(spark, uri, management, job.out, window["first"], window["last"])
        perf_result = json.loads((tmp / "perf.json").read_text()) if (tmp / "perf.json").exists() else {}
        measured = batches[1:]
        events = sum(b["events"] for b in measured)
        span = (measured[-1]["done_ms"] - measured[0]["started_ms"]) / 1000 if measured else 0.0
        result = {
            "rate_asked": args.rate, "trigger_s": args.trigger, "seconds": args.seconds, "warm_up_s": args.warm_up,
            "publishes_measured": len(lags),
            "lag_ms": {"p50": _quantile(lags, 0.5), "p99": _quantile(lags, 0.99), "max": max(lags)} if lags else {},
            "perf": {k: perf_result.get(k) for k in ("publish_rate", "consume_rate") if k in perf_result},
            "job_events": events, "job_events_per_s": round(events / span) if span else None,
            "cores_measured": {k: round((cpu[f"end_{k}"] - cpu[f"start_{k}"]) * 1000
                                        / (window["last"] - window["first"]), 2) for k in ("broker", "job")},
            "batches": [{"batch": b["batch"], "events": b["events"],
                         "seconds": round((b["done_ms"] - b["started_ms"]) / 1000, 2),
                         "read_s": b["read_s"], "events_s": b["events_s"], "minutes_s": b["minutes_s"]}
                        for b in measured],
        }
        spark.stop()
        stream_end = _api(management, "GET", "queues/%2F/trace")["next_offset"]
        result["raw_perf_drain_events_per_s"] = _raw_drain(uri, "trace", stream_end, tmp)
        print(json.dumps(result, indent=2))
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if perf is not None and perf.poll() is None:
            perf.kill()
        broker.terminate()
        try:
            broker.wait(15)
        except subprocess.TimeoutExpired:
            broker.kill()
        if not os.environ.get("LEVERET_BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
