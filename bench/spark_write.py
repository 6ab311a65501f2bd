"""Spark → Leveret write throughput: ``df.write.format("leveret")`` publishing N rows with publisher confirms
into a stream queue, next to ``leveret perf`` publishing with confirms into the same kind of stream on the
same broker in the same run (the connector's target: at least half of perf's rate).

    .venv/bin/python -m bench.spark_write [--rows 1000000] [--size 100] [--partitions 2] [--url URL]

Without ``--url`` a fresh Leveret is started on a free port with a temporary data directory and stopped at
the end. perf runs first (``--producers`` = Spark partitions, no consumer, ``--confirm`` = the connector's
``maxInFlight``, ``--queue-type stream``), then Spark: one warm-up write of 10,000 rows (the first use of a
Python data source in a session costs ~10 s of planner start-up that a long-running job pays once), then the
timed write. The rate is rows / wall time of ``save()``, which returns only when every task has all its
publishes confirmed; the stream's last offset is read back afterwards to check that N messages landed.
Needs the pipeline distribution (``pip install -e pipeline``) and Java 17.
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

WARMUP_ROWS = 10_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_broker(data_dir: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "broker", "serve", "--bind", "127.0.0.1", "--port", str(port),
                             "--data-dir", data_dir, "--management-port", "0", "--prometheus-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the broker did not start listening within 30 s")


def run_perf(url: str, producers: int, size: int, confirm: int, seconds: int, pid: int | None) -> dict[str, Any]:
    """``leveret perf`` (broker/tools/perf.py) publishing with confirms into a stream, nobody consuming."""
    leveret = Path(sys.executable).with_name("leveret")
    cmd = [str(leveret), "perf"] if leveret.exists() else [sys.executable, "-m", "broker.tools.perf"]
    cmd += ["--url", url, "--producers", str(producers), "--consumers", "0", "--queue-type", "stream",
            "--queue-prefix", "perf-stream", "--size", str(size), "--confirm", str(confirm), "--persistent",
            "--time", str(seconds), "--warmup", "3"]
    if pid is not None:
        cmd += ["--broker-pid", str(pid)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _spark_session(tmp: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("leveret-spark-write-bench")
               .config("spark.driver.memory", "1g")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.warehouse.dir", os.path.join(tmp, "warehouse"))
               .config("spark.driver.extraJavaOptions", f"-XX:+UseSerialGC -Djava.io.tmpdir={tmp}")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    from pyspark_leveret import DefaultSource

    session.dataSource.register(DefaultSource)  # Spark's own discovery misses editable installs
    return session


def _declare_stream(url: str, name: str) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    finally:
        conn.close()


def _last_offset(url: str, name: str) -> int:
    """The highest offset in the stream: consume from ``last`` (the last chunk) until it goes quiet."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        last = -1
        for method, props, _body in ch.consume(name, arguments={"x-stream-offset": "last"}, inactivity_timeout=1.0):
            if method is None:
                break
            last = max(last, int(props.headers["x-stream-offset"]))
            ch.basic_ack(method.delivery_tag)
        ch.cancel()
        return last
    finally:
        conn.close()


def run_spark(url: str, rows: int, size: int, partitions: int, max_in_flight: int, tmp: str) -> dict[str, Any]:
    t0 = time.monotonic()
    spark = _spark_session(tmp)
    started = time.monotonic() - t0
    try:
        def write(n: int, queue: str) -> float:
            _declare_stream(url, queue)
            df = spark.range(0, n, numPartitions=partitions).selectExpr(
                f"lpad(CAST(id AS STRING), {size}, '0') AS body")
            t = time.monotonic()
            (df.write.format("leveret").option("uri", url).option("routingKey", queue)
             .option("maxInFlight", str(max_in_flight)).mode("append").save())
            return time.monotonic() - t

        warm = write(WARMUP_ROWS, "spark-write-warmup")
        seconds = write(rows, "spark-write")
        last = _last_offset(url, "spark-write")
    finally:
        spark.stop()
    return {"rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds, 1),
            "last_offset": last, "landed": last + 1 == rows, "session_start_s": round(started, 1),
            "warmup_write_s": round(warm, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_write", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="body bytes")
    ap.add_argument("--partitions", type=int, default=2, help="Spark tasks (and perf producers)")
    ap.add_argument("--max-in-flight", type=int, default=1000)
    ap.add_argument("--perf-time", type=int, default=15, help="seconds perf measures")
    ap.add_argument("--url", help="an existing broker (default: start a Leveret)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="leveret-spark-bench-")
    broker = None
    try:
        if args.url:
            url = args.url
        else:
            broker, url = _start_broker(os.path.join(tmp, "data"))
        perf = run_perf(url, args.partitions, args.size, args.max_in_flight, args.perf_time,
                        broker.pid if broker else None)
        spark = run_spark(url, args.rows, args.size, args.partitions, args.max_in_flight, tmp)
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = spark["rows_per_s"] / perf["publish_rate"] if perf.get("publish_rate") else 0.0
    result = {"spark": spark, "perf_publish_rate": perf.get("publish_rate"), "ratio": round(ratio, 2),
              "target": 0.5, "met": ratio >= 0.5 and spark["landed"],
              "setup": {"rows": args.rows, "size": args.size, "partitions": args.partitions,
                        "max_in_flight": args.max_in_flight}}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print(f"spark write {spark['rows_per_s']:,.0f} rows/s ({args.rows:,} rows in {spark['seconds']} s), "
          f"perf {perf.get('publish_rate', 0):,.0f} msg/s, ratio {ratio:.2f} (target 0.5)"
          f"{'' if spark['landed'] else ', NOT ALL ROWS LANDED'}", file=sys.stderr)
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
