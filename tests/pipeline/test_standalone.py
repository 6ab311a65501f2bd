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
from dataclasses import dataclass
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


START_SECONDS = 300.0  # spark-submit to a SparkContext with its executors: 40-80 s on 2 busy cores
PHASE_SECONDS = 240.0  # a phase reaching the point where the kill is due, the kill's retry done


def _count(path: Path) -> int:
    return len([f for f in os.listdir(path) if not f.startswith(".")]) if path.exists() else 0


def kill_executor_in(cluster: StandaloneCluster, sub: Submission, phase: str, ready: Any,
                     choose: Any = None) -> str:
    """SIGKILL the JVM of an executor while it runs a task of ``phase`` (the job group the job script gives the
    phase's jobs, or the streaming query named after it), once ``ready()`` says the phase is mid-way; returns
    the killed executor's id.

    The conditions are the application's own: its id and REST API from the job (not a UI port guessed), only
    jobs of ``phase`` running, and among their active stages' running task attempts the one launched last whose
    executor is a JVM of *this* application (found among the workers' children by ``--app-id``). That task
    must then be reported FAILED (lost with its executor): the kill landed mid-task. A phase that ends before
    fails the test (with the REST API's state) rather than letting a kill land elsewhere."""
    wait_for(f"{sub.log_path.name}: the SparkContext up", sub.started, START_SECONDS, step=0.2)
    app = sub.app_id()

    def busy() -> tuple[dict[str, Any], int] | None:
        if sub.process.poll() is not None or phase in sub.report():
            raise AssertionError(f"phase {phase} ended before an executor could be killed in it")
        running = sub.jobs("running")
        if not running or not all(of_phase(j, phase) for j in running) or not ready():
            return None
        pids = cluster.executor_pids(app)
        tasks = [t for t in sub.running_tasks({s for j in running for s in j.get("stageIds", [])})
                 if t.get("executorId") in pids]
        if choose is not None:
            tasks = choose(tasks)
        if not tasks:
            return None
        youngest = max(tasks, key=lambda t: str(t.get("launchTime", "")))  # the most of its run still ahead
        return youngest, pids[youngest["executorId"]]

    try:
        task, pid = wait_for(f"a task of phase {phase} running on an executor", busy, PHASE_SECONDS, step=0.05)
        os.kill(pid, signal.SIGKILL)
        wait_for(f"task {task['taskId']} of phase {phase} lost with executor {task['executorId']}",
                 lambda: sub.task_status(task) not in (None, "RUNNING"), PHASE_SECONDS, step=0.2)
        status = sub.task_status(task)
        assert status == "FAILED", f"task {task['taskId']} ended {status}: the kill did not land mid-task"
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {sub.state()}") from None
    return str(task["executorId"])


def of_phase(job: dict[str, Any], phase: str) -> bool:
    """Whether a job (the REST API's) is one of ``phase``'s: its job group, or for a streaming query (whose
    jobs Spark puts in a group of the query's run id) the query's name, which its description starts with."""
    return job.get("jobGroup") == phase or str(job.get("description") or "").split("\n", 1)[0] == phase


def both_read(sub: Submission, phase: str) -> Any:
    """A ``choose`` that keeps both executors reading: only a running task whose executor has already
    completed a task of ``phase``, and only while the other executors alive have completed one or are running
    one (which, not killed, completes). Such a moment always comes while tasks are left: the first executor to
    complete a task takes the next at once while the other runs its first."""
    def choose(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        done = sub.successful_tasks_by_executor(phase)
        running = {t["executorId"] for t in tasks}
        alive = {e["id"] for e in sub.executors() if e.get("isActive")}
        if len(alive) < 2 or not all(done.get(e, 0) >= 1 or e in running for e in alive):
            return []
        return [t for t in tasks if done.get(t["executorId"], 0) >= 1]
    return choose


def task_done(sub: Submission, phase: str) -> Any:
    """A ``ready``: a running job of ``phase`` has completed a task (some of its output is there, some not)."""
    return lambda: any(of_phase(j, phase) and j.get("numCompletedTasks", 0) >= 1
                       for j in sub.jobs("running"))


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


@dataclass
class Sizes:
    rows: int  # offsets in the source stream (read and stream) and rows written into the de-duplicating one
    queued: int  # messages in the classic queue (the queue source)
    per_trigger: int  # the stream's micro-batch (at least 3 batches: one committed before each kill)
    queue_per_trigger: int


DEFAULT = Sizes(rows=4_000, queued=3_000, per_trigger=1_000, queue_per_trigger=1_000)
LONG = Sizes(rows=12_000, queued=30_000, per_trigger=2_500, queue_per_trigger=3_000)  # the sizes


def cluster_round(cluster: StandaloneCluster, broker: Any, name: str, tmp: Path, size: Sizes) -> dict[str, Any]:
    """Two spark-submits. The first application runs four phases, an executor JVM killed -9 mid-phase in each:
    (a) ``read``, a batch read of a stream into parquet; (c) ``write``, a batch write into a de-duplicating
    stream; ``queue``, the queue source off a classic queue into parquet; (b) ``stream``, a streaming query
    from the stream into parquet with a checkpoint, whose driver is then killed -9 between a batch's offsets
    and its commit. The second application (submitted while the first runs, started after its driver's kill)
    runs (b) again from its checkpoint to the end. Returns what the
    REST API said and the reports."""
    src = declare_stream(broker, f"{name}-src")
    dedup = declare_stream(broker, f"{name}-dedup", **{"x-message-deduplication": True,
                                                       "x-cache-size": size.rows * 2})
    fill(broker, src, size.rows, size=100)
    classic = f"{name}-q"
    fill_queue(broker, classic, size.queued)
    out = tmp / "out"
    stream_offsets, stream_commits = out / "stream-checkpoint" / "offsets", out / "stream-checkpoint" / "commits"
    queue_commits = out / "queue-checkpoint" / "commits"
    common = ["--stream", src, "--dedup", dedup, "--queue", classic, "--rows", str(size.rows), "--partitions", "8"]
    t0 = time.monotonic()
    first = cluster.submit(job_args(broker, "read,write,queue,stream", out, *common, "--per-trigger",
                                    str(size.per_trigger), "--queue-per-trigger", str(size.queue_per_trigger),
                                    "--stream-trigger", "processing"), f"{name}-1")
    killed = [kill_executor_in(cluster, first, "read", task_done(first, "read"), both_read(first, "read"))]
    # The driver that restarts (b) from its checkpoint: submitted now, so that its start-up overlaps the
    # first application's phases (it gets executors only when the first's are gone: the master serves
    # applications in order); its query starts only after the first driver is dead (--start-after).
    go = tmp / "restart.go"
    second = cluster.submit(job_args(broker, "stream", out, "--stream", src, "--per-trigger", str(size.per_trigger),
                                     "--partitions", "8", "--start-after", str(go)), f"{name}-2")
    killed += [kill_executor_in(cluster, first, "write", task_done(first, "write")),
               kill_executor_in(cluster, first, "queue", lambda: _count(queue_commits) >= 1),
               kill_executor_in(cluster, first, "stream", lambda: _count(stream_commits) >= 1)]
    # The first three phases are over (the stream phase runs): the read's tasks per executor, while the
    # driver's REST API is up.
    report = first.report()
    read_tasks = first.successful_tasks_by_executor("read")

    # The driver, mid-batch: a batch after the executor's kill planned (its offsets written) and not committed.
    def mid_batch() -> bool:
        if first.process.poll() is not None:
            raise AssertionError(f"the query's driver exited before it was killed: {first.state()}")
        done = _count(stream_commits)
        if done * size.per_trigger >= size.rows:
            raise AssertionError(f"the query read everything before its driver was killed: {first.state()}")
        return done >= 2 and _count(stream_offsets) > done

    def lost() -> list[dict[str, Any]] | None:
        rows = first.executors()
        return rows if sum(1 for e in rows if not e.get("isActive")) >= len(killed) else None

    executors = wait_for("the killed executors seen lost", lost, PHASE_SECONDS)
    wait_for("a stream batch planned and not committed", mid_batch, PHASE_SECONDS, step=0.02)
    first.kill(signal.SIGKILL)
    at_kill = (_count(stream_offsets), _count(stream_commits))
    go.write_text("go")  # the second driver (up, its executors to come once the first's are gone) starts
    restarted = second.wait(START_SECONDS + PHASE_SECONDS)["stream"]

    for phase, got in (("read", report["read"]), ("stream", restarted)):  # every offset once in each sink
        assert (got["rows"], got["distinct"], got["min"], got["max"]) == (size.rows, size.rows, 0, size.rows - 1), \
            (phase, got)
    assert stream_info(broker, dedup)["next_offset"] == size.rows, "the de-duplicating stream kept a repeat"
    bodies = stream_bodies(broker, dedup)
    assert len(bodies) == size.rows and set(bodies) == {f"r{i}".encode() for i in range(size.rows)}
    q = report["queue"]  # the queue source: every message once (distinct message ids), the queue empty
    assert (q["rows"], q["distinct"]) == (size.queued, size.queued), q
    assert queue_depth(broker, classic) == 0
    return {"killed": killed, "read_tasks": read_tasks, "executors": executors, "report": report,
            "restarted": restarted, "at_driver_kill": at_kill, "seconds": time.monotonic() - t0}


def check_round(got: dict[str, Any]) -> None:
    # Both executors read: the read's tasks succeeded on both original executors (0 and 1).
    assert {"0", "1"} <= set(got["read_tasks"]), got["read_tasks"]
    assert sum(got["read_tasks"].values()) >= 8
    assert {e["hostPort"].split(":")[0] for e in got["executors"]} == {"127.0.0.1"}
    assert sum(1 for e in got["executors"] if not e["isActive"]) == len(got["killed"])  # the killed JVMs
    offsets, commits = got["at_driver_kill"]
    assert offsets > commits >= 2, got["at_driver_kill"]  # the driver died mid-batch
    assert got["restarted"]["batches"] > commits


def test_executors_killed_in_four_phases_and_driver_restarted(standalone, broker, uid, tmp_path):
    got = cluster_round(standalone, broker, uid, tmp_path, DEFAULT)
    print(f"cluster round: {got['seconds']:.1f} s from the first submit; killed executors {got['killed']}; "
          f"read tasks by executor {got['read_tasks']}; offsets/commits at the driver's kill "
          f"{got['at_driver_kill']}; first {got['report']}; restarted {got['restarted']}")
    check_round(got)


@pytest.mark.long
@pytest.mark.parametrize("round_", range(LONG_ROUNDS))
def test_long_rounds(standalone, broker, uid, tmp_path, round_):
    check_round(cluster_round(standalone, broker, uid, tmp_path, LONG))
