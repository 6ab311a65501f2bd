"""``python -m bench.spark_read``: how fast Spark reads a Leveret stream through format("leveret"), next to
the raw consume rate of ``leveret perf`` on the same stream in the same run.

    .venv/bin/python -m bench.spark_read                      # 1,000,000 × 1 KiB, own broker
    .venv/bin/python -m bench.spark_read -n 200000 --partitions 2
    .venv/bin/python -m bench.spark_read --url amqp://… --management-url http://…:15672   # an existing broker

Steps, one broker for all of them (a fresh Leveret process on free ports unless ``--url``):

1. ``leveret perf --backlog N`` on a new stream: publishes N × ``--size`` bytes with confirms, then one
   consumer drains them from ``first`` (manual ack, prefetch 1000). Its drain rate is the **raw** rate: an
   optimised asyncio client that counts deliveries and decodes nothing else.
2. The connector's AMQP reader alone (pyspark_leveret.amqp_read, one connection, no Spark, no Arrow): what
   one Spark task's consumer can do.
3. Spark: session start and a first small read (the JVM and Python worker warm-up, reported apart), then
   ``spark.read.format("leveret")`` → ``count()`` and → ``write.parquet`` over all N, rows/s each.

Target of issue 13: Spark's count ≥ 0.5× the raw rate. The machine is shared: run it on a quiet one, and
read the ratio, not the absolute rates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_broker(tmp: Path) -> tuple[subprocess.Popen, str, str]:
    """A Leveret process on free ports: (process, AMQP URL, management URL)."""
    port, mport = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "broker", "serve", "--bind", "127.0.0.1", "--port", str(port),
           "--data-dir", str(tmp / "data"), "--management-port", str(mport), "--prometheus-port", "0"]
    log = open(tmp / "broker.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited: {(tmp / 'broker.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"amqp://guest:guest@127.0.0.1:{port}/%2F", f"http://127.0.0.1:{mport}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("broker did not listen within 30 s")


def raw_perf(url: str, prefix: str, n: int, size: int, tmp: Path) -> dict[str, Any]:
    """Fill the stream with ``leveret perf --backlog`` and take its drain rate (step 1)."""
    out = tmp / "perf.json"
    cmd = [sys.executable, "-m", "broker.tools.perf", "--url", url, "--queue-type", "stream", "--durable",
           "--size", str(size), "--confirm", "1000", "--backlog", str(n), "--ack", "--prefetch", "1000",
           "--stream-offset", "first", "--queue-prefix", prefix, "--no-cleanup", "-x", "1", "-y", "1",
           "--json-out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def connector_consumer(url: str, queue: str, n: int) -> float:
    """Rows/s of the connector's AMQP reader alone over offsets [0, n) (step 2)."""
    from pyspark_leveret.amqp_read import StreamConnection
    from pyspark_leveret.client import parse_uri

    conn = StreamConnection(parse_uri(url), 30.0)
    conn.open()
    conn.consume(queue, 0, 2000)
    t0 = time.perf_counter()
    got = 0
    try:
        for chunk in conn.deliveries():
            got += len(chunk)
            conn.ack(chunk[-1][0])
            if chunk[-1][1][0] >= n - 1:
                break
    finally:
        conn.close()
    return got / (time.perf_counter() - t0)


def spark_session(tmp: Path):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName("leveret-bench")
            .config("spark.driver.memory", "1g")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
            .config("spark.driver.extraJavaOptions", f"-XX:+UseSerialGC -Djava.io.tmpdir={tmp}")
            .getOrCreate())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_read", description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--messages", type=int, default=1_000_000)
    ap.add_argument("-s", "--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=2, help="option minPartitions of the Spark reads")
    ap.add_argument("--url", help="an existing broker (default: start a Leveret on free ports)")
    ap.add_argument("--management-url", help="its HTTP API (default http://<host>:15672)")
    ap.add_argument("--json-out", help="also write the result as JSON here")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="leveret-spark-bench-"))
    proc = None
    result: dict[str, Any] = {"messages": args.messages, "size": args.size, "partitions": args.partitions}
    try:
        if args.url:
            url, murl = args.url, args.management_url
        else:
            proc, url, murl = start_broker(tmp)
        prefix = f"sparkbench{os.getpid()}"
        queue = f"{prefix}-0"  # leveret perf names its queues <prefix>-<i>

        perf = raw_perf(url, prefix, args.messages, args.size, tmp)
        result["publish_rate"] = perf["publish_rate"]
        result["raw_consume_rate"] = perf["drain_rate"]
        print(f"fill: {args.messages:,} × {args.size} B published at {perf['publish_rate']:,.0f} msg/s; "
              f"raw consume (leveret perf drain): {perf['drain_rate']:,.0f} msg/s", flush=True)

        result["connector_consumer_rate"] = round(connector_consumer(url, queue, args.messages), 1)
        print(f"connector AMQP reader alone (1 connection): {result['connector_consumer_rate']:,.0f} msg/s",
              flush=True)

        t0 = time.perf_counter()
        spark = spark_session(tmp)
        spark.sparkContext.setLogLevel("ERROR")
        result["session_start_s"] = round(time.perf_counter() - t0, 2)
        opts = {"uri": url, "queue": queue, "minPartitions": str(args.partitions)}
        if murl:
            opts["managementUri"] = murl
        t0 = time.perf_counter()
        spark.read.format("leveret").options(**opts, endingOffsets="1000").load().count()
        result["first_read_warmup_s"] = round(time.perf_counter() - t0, 2)
        print(f"JVM warm-up: session {result['session_start_s']} s, first small read "
              f"{result['first_read_warmup_s']} s", flush=True)

        t0 = time.perf_counter()
        count = spark.read.format("leveret").options(**opts).load().count()
        elapsed = time.perf_counter() - t0
        assert count == args.messages, f"count {count} != {args.messages}"
        result["spark_count_s"] = round(elapsed, 2)
        result["spark_count_rate"] = round(count / elapsed, 1)

        out = tmp / "parquet"
        t0 = time.perf_counter()
        spark.read.format("leveret").options(**opts).load().write.mode("overwrite").parquet(str(out))
        elapsed = time.perf_counter() - t0
        result["spark_parquet_s"] = round(elapsed, 2)
        result["spark_parquet_rate"] = round(args.messages / elapsed, 1)
        written = spark.read.parquet(str(out)).count()
        assert written == args.messages, f"parquet holds {written} rows"
        spark.stop()

        raw = result["raw_consume_rate"]
        result["count_vs_raw"] = round(result["spark_count_rate"] / raw, 2)
        result["parquet_vs_raw"] = round(result["spark_parquet_rate"] / raw, 2)
        print(f"spark.read count(): {result['spark_count_rate']:,.0f} rows/s ({result['spark_count_s']} s, "
              f"{result['count_vs_raw']}× raw); → parquet: {result['spark_parquet_rate']:,.0f} rows/s "
              f"({result['spark_parquet_s']} s, {result['parquet_vs_raw']}× raw); target ≥ 0.5× raw")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2))
        print(json.dumps(result))
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

