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
from standalone import StandaloneCluster, Submission, epoch, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.leveret_only, pytest.mark.timeout(900)]

LONG_ROUNDS = 20


def job_args(broker: Any, phases: str, out: Path, *extra: str) -> list[str]:
    return [phases, "--uri", broker.url, "--management-uri", f"http://{broker.host}:{broker.management_port}",
            "--out", str(out), *extra]


START_SECONDS = 300.0  # spark-submit to a SparkContext with its executors: 40-80 s on 2 busy cores
PHASE_SECONDS = 240.0  # a phase reaching the point where the kill is due, the kill's retry done


def _count(path: Path) -> int:
    return len([f for f in os.listdir(path) if not f.startswith(".")]) if path.exists() else 0


# Tasks of the stage not launched yet at the look that sends a kill: before its executor can be idle, the stage
# must drain these and the task it runs, which takes both executors longer than the REST API lags the driver.
PENDING_TASKS = 2


KILL_TRIES = 3  # kills per phase until one lands mid-task (each a real executor loss Spark recovers from)


def kill_executor_in(cluster: StandaloneCluster, sub: Submission, phase: str, ready: Any,
                     choose: Any = None, choose_again: Any = None) -> list[str]:
    """SIGKILL the JVM of an executor while it runs a task of ``phase`` (the job group the job script gives the
    phase's jobs, or the streaming query named after it), once ``ready()`` says the phase is mid-way; returns
    the ids of the executors killed, the last one killed mid-task.

    The conditions are the application's own: its id and REST API from the job (not a UI port guessed), only
    stages of ``phase`` active, and among their running task attempts the one launched last whose executor is
    a JVM of *this* application (found among the workers' children by ``--app-id``), in a stage that still
    has ``PENDING_TASKS`` tasks not launched, among the executors ``choose(tasks, alive)`` keeps (all if None).

    Which task the kill landed in is judged afterwards, not picked before it. A task of these phases takes
    0.1-0.5 s on a warm executor, and a RUNNING row of the REST API is the driver's view, behind the executor:
    the task may be done there, its status update on the way or still in the driver's queues (the listener
    bus behind the REST API lags the scheduler, more so under load). So the kill goes to an executor seen
    running a task while its stage has ``PENDING_TASKS`` tasks left to launch (a one-core executor that
    finishes a task is given the next one in the same step of the driver while any is left), and afterwards
    the task attempts the driver had launched on that executor before the kill must include one that ended
    FAILED with ExecutorLostFailure: a task it was running when it died.

    An executor is still idle between finishing a task and the driver handing it the next: its status update
    travels to the driver, which launches the next task only once it has taken it. Under CI load that gap was
    long enough for a kill to land in it (executor 1's tasks 1, 2 and 4 all SUCCESS at its kill). Such a
    kill is an executor lost between tasks, which Spark recovers from like any other; the test then kills
    again (an executor that has completed a task of the stage, ``choose_again``, else any) while the phase
    lasts, up to ``KILL_TRIES`` kills, and fails unless one lands mid-task."""
    wait_for(f"{sub.log_path.name}: the SparkContext up", sub.started, START_SECONDS, step=0.2)
    app = sub.app_id()
    was_ready = False
    killed: list[str] = []
    missed: list[str] = []

    def busy() -> tuple[str, int] | None:
        nonlocal was_ready
        if sub.process.poll() is not None or phase in sub.report():
            raise AssertionError(f"phase {phase} ended before an executor could be killed mid-task in it"
                                 + (f" (killed between tasks: {'; '.join(missed)})" if missed else ""))
        was_ready = was_ready or bool(ready())  # the phase mid-way stays so
        if not was_ready:
            return None
        pids = cluster.executor_pids(app)  # before the look at the tasks: nothing slow between it and the kill
        stages = sub.stages("active")
        if not stages or not all(of_phase(s, phase) for s in stages):
            return None
        pick = choose if not killed else choose_again
        for stage in stages:
            tasks = list(stage.get("tasks", {}).values())
            if stage["numTasks"] - len({t["index"] for t in tasks}) < PENDING_TASKS:
                continue
            eligible = (set(pids) if pick is None else pick(tasks, set(pids))) - set(killed)
            running = [t for t in tasks if t["status"] == "RUNNING" and t["executorId"] in eligible]
            if running:
                youngest = max(running, key=lambda t: epoch(t["launchTime"]))  # the most of its run ahead
                return str(youngest["executorId"]), pids[youngest["executorId"]]
        return None

    def ended(executor: str, killed_at: float) -> list[dict[str, Any]] | None:
        """The tasks of ``phase`` launched on ``executor`` before ``killed_at`` (the REST API's launch time is
        in ms: one launched within the kill's ms is not counted), once none of them is RUNNING and the REST API
        shows a task of the application that ended after the kill. The REST API shows a task's start and end in
        the order the driver's scheduler took them, and a task launched on the executor just before its kill
        (the one the kill then lands in) may not be shown yet when the tasks before it already are: any task
        ended after the kill was taken after that launch."""
        if not any(t["status"] != "RUNNING" and epoch(t["launchTime"]) + t.get("duration", 0) / 1000 > killed_at
                   for s in sub.stages() for t in s.get("tasks", {}).values()):
            return None
        tasks = [t for s in sub.stages() if of_phase(s, phase) for t in s.get("tasks", {}).values()  # a later look
                 if t["executorId"] == executor and epoch(t["launchTime"]) + 0.001 <= killed_at]
        return tasks if tasks and all(t["status"] != "RUNNING" for t in tasks) else None

    try:
        while True:
            executor, pid = wait_for(f"an executor running a task of phase {phase}, {PENDING_TASKS} left to "
                                     "launch", busy, PHASE_SECONDS, step=0.05)
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            killed.append(executor)
            tasks = wait_for(f"the tasks of phase {phase} on executor {executor} at its kill ended",
                             lambda e=executor, at=killed_at: ended(e, at), PHASE_SECONDS, step=0.2)
            if any(t["status"] == "FAILED" and str(t.get("errorMessage") or "").startswith("ExecutorLostFailure")
                   for t in tasks):
                return killed
            missed.append(f"executor {executor}: " + ", ".join(f"task {t['taskId']} {t['status']}" for t in tasks))
            assert len(killed) < KILL_TRIES, (
                f"no kill of {len(killed)} in phase {phase} landed mid-task: " + "; ".join(missed))
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {sub.state()}") from None


def of_phase(job: dict[str, Any], phase: str) -> bool:
    """Whether a job or a stage (the REST API's) is one of ``phase``'s: its job group, or its description (the
    job group's, or for a streaming query, whose jobs Spark puts in a group of the query's run id, the query's
    name on its first line)."""
    return job.get("jobGroup") == phase or str(job.get("description") or "").split("\n", 1)[0] == phase


def both_read(tasks: list[dict[str, Any]], alive: set[str]) -> set[str]:
    """A ``choose`` that keeps both executors reading: of the executors alive (``alive``), those that have
    already completed a task of the stage (``tasks``, its task attempts), and only while every one alive has
    completed one or is running one (which, not killed, completes). Such a moment always comes while tasks are
    left: the first executor to complete a task takes the next at once while the other runs its first."""
    done = {t["executorId"] for t in tasks if t["status"] == "SUCCESS"}
    running = {t["executorId"] for t in tasks if t["status"] == "RUNNING"}
    if len(alive) < 2 or not alive <= done | running:
        return set()
    return done & alive


def has_read(tasks: list[dict[str, Any]], alive: set[str]) -> set[str]:
    """A ``choose_again`` for the read: the executors alive that have completed a task of the stage (killing
    one of them leaves the read's tasks done on both original executors, as ``both_read`` made sure)."""
    return {t["executorId"] for t in tasks if t["status"] == "SUCCESS"} & alive


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
    # The read's stage in 32 tasks, not 8: its kill waits for a moment when both executors have read and
    # PENDING_TASKS are left to launch, and with 8 tasks of 0.1-0.5 s that window (about five task lengths)
    # closed under CI load before a look at the REST API caught it ("phase read ended before an executor
    # could be killed in it", 14 tasks completed); with 32 it stays open about seven times as long.
    t0 = time.monotonic()
    first = cluster.submit(job_args(broker, "read,write,queue,stream", out, *common, "--read-partitions", "32",
                                    "--per-trigger",
                                    str(size.per_trigger), "--queue-per-trigger", str(size.queue_per_trigger),
                                    "--stream-trigger", "processing"), f"{name}-1")
    killed = kill_executor_in(cluster, first, "read", task_done(first, "read"), both_read, has_read)
    # The driver that restarts (b) from its checkpoint: submitted now, so that its start-up overlaps the
    # first application's phases (it gets executors only when the first's are gone: the master serves
    # applications in order); its query starts only after the first driver is dead (--start-after).
    go = tmp / "restart.go"
    second = cluster.submit(job_args(broker, "stream", out, "--stream", src, "--per-trigger", str(size.per_trigger),
                                     "--partitions", "8", "--start-after", str(go)), f"{name}-2")
    killed += kill_executor_in(cluster, first, "write", task_done(first, "write"))
    killed += kill_executor_in(cluster, first, "queue", lambda: _count(queue_commits) >= 1)
    killed += kill_executor_in(cluster, first, "stream", lambda: _count(stream_commits) >= 1)
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
