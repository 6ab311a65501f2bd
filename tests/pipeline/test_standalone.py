"""The connector on a real Spark standalone cluster (a master and two one-core workers, tests/pipeline/
standalone.py, started once per run), jobs submitted with ``spark-submit --master spark://...``
(tests/pipeline/jobs/leveret_job.py), executors' JVMs killed with SIGKILL mid-task and a driver mid-query.

What each case must end with: every offset of the stream exactly once in the parquet sink (as Spark reads it
back, through the sink's commit log: 0 lost, 0 duplicated), and exactly one message per row in a
de-duplicating stream. One round of each in the default run (the cluster lane's time is the suite's); 20
rounds behind ``-m long``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pika
import pytest
from pyspark_leveret.reader import LeveretBatchReader
from pyspark_leveret.schema import READ_STRUCT
from read_helpers import declare_stream, fill, read_options, read_partitions, stream_info
from standalone import StandaloneCluster, Submission, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.leveret_only, pytest.mark.timeout(900)]

LONG_ROUNDS = 20


def job_args(broker: Any, phases: str, out: Path, *extra: str) -> list[str]:
    return [phases, "--uri", broker.url, "--management-uri", f"http://{broker.host}:{broker.management_port}",
            "--out", str(out), *extra]


def kill_busy_executor(cluster: StandaloneCluster, sub: Submission, ready: Any = None,
                       timeout: float = 120.0) -> str:
    """SIGKILL the JVM of one of the application's executors while it runs a task, once ``ready()`` says the
    job is mid-way (some output done, some not); returns the killed executor's id."""
    def busy() -> tuple[str, int] | None:
        if sub.process.poll() is not None:
            raise AssertionError(f"the job ended before an executor could be killed:\n{sub.log_text()[-3000:]}")
        app = sub.app_id()
        if app is None or (ready is not None and not ready()):
            return None
        pids = cluster.executor_pids(app)
        for row in sub.executors():
            if row.get("isActive") and row.get("activeTasks", 0) > 0 and row["id"] in pids:
                return row["id"], pids[row["id"]]
        return None

    executor, pid = wait_for("an executor running a task", busy, timeout, step=0.05)
    os.kill(pid, signal.SIGKILL)
    return executor


def phase_half_done(sub: Submission, group: str, on_each: bool = False) -> Any:
    """A ``ready`` for kill_busy_executor: a job of ``group`` is running and has completed a task (with
    ``on_each``: every executor alive has completed one, which for the first phase means of this phase)."""
    def ready() -> bool:
        if not any(j.get("jobGroup") == group and j.get("numCompletedTasks", 0) >= 1 for j in sub.jobs("running")):
            return False
        return not on_each or all(e.get("completedTasks", 0) >= 1 for e in sub.executors() if e.get("isActive"))
    return ready


def stream_bodies(broker: Any, queue: str) -> list[bytes]:
    """Every message of a stream, read with the connector's own reader outside Spark."""
    reader = LeveretBatchReader(read_options(broker, queue=queue), READ_STRUCT)
    table = read_partitions(reader, reader.partitions())
    return table.column("body").to_pylist() if table.num_rows else []


def fill_queue(broker: Any, queue: str, n: int, queue_type: str = "classic") -> None:
    """``n`` messages with message ids ``0..n-1`` in a classic or quorum queue (waits until all are there)."""
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        for i in range(n):
            ch.basic_publish("", queue, f"q{i}".encode(), pika.BasicProperties(message_id=str(i)))
        wait_for(f"{n} messages in {queue}",
                 lambda: ch.queue_declare(queue, passive=True).method.message_count >= n, 60, step=0.2)
    finally:
        conn.close()


def queue_depth(broker: Any, queue: str) -> int:
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ok = conn.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count) + int(ok.method.consumer_count)
    finally:
        conn.close()


def read_and_write_round(cluster: StandaloneCluster, broker: Any, name: str, tmp: Path,
                         rows: int = 12_000, queued: int = 30_000) -> dict[str, Any]:
    """One application: (a) a batch read of a stream into parquet, (c) a batch write of ``rows`` rows into a
    de-duplicating stream, (3) a streaming read of ``queued`` messages off a classic queue (the queue source)
    into parquet, an executor killed mid-phase in each. Returns what the REST API said."""
    src = declare_stream(broker, f"{name}-src")
    dedup = declare_stream(broker, f"{name}-dedup", **{"x-message-deduplication": True,
                                                       "x-cache-size": rows * 2})
    fill(broker, src, rows, size=100)
    classic = f"{name}-q"
    fill_queue(broker, classic, queued)
    commits = tmp / "out" / "queue-checkpoint" / "commits"
    t0 = time.monotonic()
    sub = cluster.submit(job_args(broker, "read,write,queue", tmp / "out", "--stream", src, "--dedup", dedup,
                                  "--queue", classic, "--rows", str(rows), "--partitions", "8",
                                  "--per-trigger", "3000"), name, hold=True)
    killed = [kill_busy_executor(cluster, sub, phase_half_done(sub, "read", on_each=True)),
              kill_busy_executor(cluster, sub, phase_half_done(sub, "write")),
              kill_busy_executor(cluster, sub, lambda: commits.exists() and len(os.listdir(commits)) >= 1)]
    try:
        wait_for("the job's report", lambda: sub.report_path.exists() or sub.process.poll() is not None, 300,
                 step=0.2)
        read_tasks = sub.successful_tasks_by_executor("read")
        executors = sub.executors()
    finally:
        sub.release()
    report = sub.wait(60)
    read = report["read"]
    assert (read["rows"], read["distinct"], read["min"], read["max"]) == (rows, rows, 0, rows - 1), read
    assert stream_info(broker, dedup)["next_offset"] == rows, "the de-duplicating stream kept a repeat"
    bodies = stream_bodies(broker, dedup)
    assert len(bodies) == rows and set(bodies) == {f"r{i}".encode() for i in range(rows)}
    # The queue source: every message once (rows = distinct ids = 30,000; ids 0..29,999), the queue empty.
    q = report["queue"]
    assert (q["rows"], q["distinct"]) == (queued, queued), q
    assert queue_depth(broker, classic) == 0
    return {"killed": killed, "read_tasks": read_tasks, "executors": executors, "report": report,
            "seconds": time.monotonic() - t0}


def test_read_write_and_queue_source_on_two_executors_with_executors_killed(standalone, broker, uid, tmp_path):
    got = read_and_write_round(standalone, broker, uid, tmp_path)
    print(f"read+write round: {got['seconds']:.1f} s from submit; killed executors {got['killed']}; "
          f"read tasks by executor {got['read_tasks']}; job {got['report']}")
    # Both executors read: the read's tasks succeeded on both original executors (0 and 1), and on the
    # executor the worker started in place of the killed one.
    assert {"0", "1"} <= set(got["read_tasks"]), got["read_tasks"]
    assert sum(got["read_tasks"].values()) >= 8
    assert {e["hostPort"].split(":")[0] for e in got["executors"]} == {"127.0.0.1"}
    assert sum(1 for e in got["executors"] if not e["isActive"]) == len(got["killed"])  # the killed JVMs


def stream_round(cluster: StandaloneCluster, broker: Any, name: str, tmp: Path, rows: int = 12_000,
                 per_trigger: int = 2500) -> dict[str, Any]:
    """(b) A streaming query from a stream to parquet with a checkpoint: an executor killed mid-batch, then
    the driver (spark-submit) killed mid-query, then the query submitted again from its checkpoint."""
    src = declare_stream(broker, f"{name}-s")
    fill(broker, src, rows, size=100)
    args = job_args(broker, "stream", tmp / "out", "--stream", src, "--per-trigger", str(per_trigger),
                    "--partitions", "2")
    commits = tmp / "out" / "stream-checkpoint" / "commits"

    def committed() -> int:
        return len([f for f in os.listdir(commits) if not f.startswith(".")]) if commits.exists() else 0

    t0 = time.monotonic()
    first = cluster.submit(args, f"{name}-1")
    killed = kill_busy_executor(cluster, first, lambda: committed() >= 1)
    # The driver, mid-query: a later batch running (an executor busy) and the query not done.
    wait_for("a later batch running", lambda: committed() >= 2 and any(
        e.get("activeTasks", 0) > 0 for e in first.executors()) or first.process.poll() is not None, 180,
        step=0.05)
    assert first.process.poll() is None, f"the query ended before its driver was killed:\n{first.log_text()[-3000:]}"
    at_kill = committed()
    first.kill(signal.SIGKILL)
    second = cluster.submit(args, f"{name}-2")
    report = second.wait(300)["stream"]
    assert (report["rows"], report["distinct"], report["min"], report["max"]) == (rows, rows, 0, rows - 1), \
        report
    return {"killed": killed, "commits_at_driver_kill": at_kill, "report": report,
            "seconds": time.monotonic() - t0}


def test_stream_to_parquet_with_executor_and_driver_killed(standalone, broker, uid, tmp_path):
    got = stream_round(standalone, broker, uid, tmp_path)
    print(f"stream round: {got['seconds']:.1f} s; {got}")
    assert got["commits_at_driver_kill"] < got["report"]["batches"]


@pytest.mark.long
@pytest.mark.parametrize("round_", range(LONG_ROUNDS))
def test_long_read_and_write_rounds(standalone, broker, uid, tmp_path, round_):
    read_and_write_round(standalone, broker, uid, tmp_path)


@pytest.mark.long
@pytest.mark.parametrize("round_", range(LONG_ROUNDS))
def test_long_stream_rounds(standalone, broker, uid, tmp_path, round_):
    stream_round(standalone, broker, uid, tmp_path)
