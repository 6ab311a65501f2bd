"""A Spark standalone cluster on loopback, started from the installed pyspark package: one master and two
workers of one core and 1 GiB each (``spark-class org.apache.spark.deploy.master.Master`` / ``...Worker``),
and jobs submitted to it with ``spark-submit --master spark://...`` as users submit them.

What the tests need from it besides starting and stopping: each application's REST API (the driver's UI, on a
port of the test's own) to see tasks per executor, and the executors' JVMs (``CoarseGrainedExecutorBackend``,
children of *these* workers) to kill -9 one of them mid-task.

Every process gets the small JVM settings of tests/pipeline/conftest.py (serial GC, C1 only) and
``SPARK_LOCAL_IP=127.0.0.1``; all ports come from tests/worker_resources.py's block for this pytest worker.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyspark
from worker_resources import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SMALL_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto -XX:-UsePerfData -Xss512k"
JOBS = Path(__file__).resolve().parent / "jobs"


def _get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def epoch(timestamp: str) -> float:
    """Seconds since the epoch of a REST API time (``2026-11-29T09:57:29.791GMT``: the driver's clock, which is
    this machine's)."""
    return datetime.strptime(timestamp.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def wait_for(what: str, predicate: Callable[[], Any], timeout: float, step: float = 0.1) -> Any:
    """``predicate()``'s first truthy value within ``timeout`` seconds, else an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(step)


@dataclass
class Submission:
    """One ``spark-submit`` (client mode: the driver is this process), its log and its report.

    The application's id and REST API come from what the job itself wrote when its SparkContext was up
    (``<report>.started``: ``sc.applicationId`` and ``sc.uiWebUrl``), not from the UI port asked for: Spark
    binds the next port when that one is taken, and its REST API would then be another application's or none."""

    process: subprocess.Popen[bytes]
    log_path: Path
    report_path: Path
    app: str | None = None
    ui_url: str | None = None

    @property
    def ui(self) -> str:
        return f"{self.ui_url}/api/v1"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def started(self) -> bool:
        """Whether the driver's SparkContext is up (and its id and UI known); an AssertionError if the driver
        exited before."""
        if self.app is None:
            path = Path(f"{self.report_path}.started")
            if not path.exists():
                if self.process.poll() is not None:
                    raise AssertionError(f"spark-submit exited {self.process.returncode} before its SparkContext "
                                         f"was up:\n{self.log_text()[-4000:]}")
                return False
            info = json.loads(path.read_text())
            self.app, self.ui_url = info["app_id"], str(info["ui"]).rstrip("/")
        return True

    def app_id(self) -> str | None:
        return self.app if self.started() else None

    def report(self) -> dict[str, Any]:
        """The report so far (the job rewrites it after every phase), ``{}`` before the first phase ends."""
        return dict(json.loads(self.report_path.read_text())) if self.report_path.exists() else {}

    def state(self) -> str:
        """What the REST API says now (running jobs, executors) and the log's tail: for a failure's message."""
        running = [{k: j.get(k) for k in ("jobId", "jobGroup", "status", "numActiveTasks", "numCompletedTasks",
                                          "numFailedTasks")} for j in self.jobs("running")]
        execs = [{k: e.get(k) for k in ("id", "isActive", "activeTasks", "completedTasks", "failedTasks")}
                 for e in self.executors()]
        return (f"app {self.app}, exit {self.process.poll()}, running jobs {running}, executors {execs}, "
                f"report {self.report()}\n{self.log_text()[-3000:]}")

    def jobs(self, status: str | None = None) -> list[dict[str, Any]]:
        app = self.app_id()
        if app is None:
            return []
        try:
            return list(_get_json(f"{self.ui}/applications/{app}/jobs" + (f"?status={status}" if status else "")))
        except (OSError, ValueError):
            return []

    def stages(self, status: str | None = None) -> list[dict[str, Any]]:
        """The stage attempts (``status``: ``active``, ``complete``, ... or all), each with its task attempts
        (``tasks``: the REST API's task rows by task id) and its job's description (``description``: the job
        group's description, or a streaming query's name on its first line). One request: a look at the
        running tasks taken just before a kill is this one call."""
        app = self.app_id()
        if app is None:
            return []
        query = "details=true" + (f"&status={status}" if status else "")
        try:
            return list(_get_json(f"{self.ui}/applications/{app}/stages?{query}"))
        except (OSError, ValueError):
            return []

    def successful_tasks_by_executor(self, group: str) -> dict[str, int]:
        """``{executor id: tasks that succeeded}`` over the stages of the jobs of job group ``group``."""
        app = self.app_id()
        counts: dict[str, int] = {}
        for job in self.jobs():
            if job.get("jobGroup") != group:
                continue
            for stage in job.get("stageIds", []):
                try:
                    attempts = _get_json(f"{self.ui}/applications/{app}/stages/{stage}?details=true")
                except (OSError, ValueError):
                    attempts = []  # not there yet: counted at the next look
                for attempt in attempts:
                    for task in (attempt.get("tasks") or {}).values():
                        if task.get("status") == "SUCCESS":
                            counts[task["executorId"]] = counts.get(task["executorId"], 0) + 1
        return counts

    def executors(self) -> list[dict[str, Any]]:
        """Every executor the application had (dead ones too), the driver left out."""
        app = self.app_id()
        if app is None:
            return []
        try:
            rows = _get_json(f"{self.ui}/applications/{app}/allexecutors")
        except (OSError, ValueError):
            return []
        return [r for r in rows if r.get("id") != "driver"]

    def wait(self, timeout: float) -> dict[str, Any]:
        """Wait for the job to end; it must exit 0. Returns the report it wrote (JSON)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"spark-submit still running after {timeout:g} s:\n{self.log_text()[-4000:]}"
                                 ) from None
        assert code == 0, f"spark-submit exited {code}:\n{self.log_text()[-6000:]}"
        return json.loads(self.report_path.read_text())

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the driver (the spark-submit JVM) and then whatever of its session is left (its Python)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            self.process.wait(30)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the job's Python and Spark's Python runners
        except ProcessLookupError:
            pass


@dataclass
class StandaloneCluster:
    """A master and two workers on 127.0.0.1 (ports of their own), stopped by :meth:`stop`."""

    root: Path
    master_port: int = 0
    master_ui_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    submissions: list[Submission] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def env(self) -> dict[str, str]:
        return dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                    SPARK_LOG_DIR=str(self.root / "logs"), SPARK_DAEMON_MEMORY="256m",
                    SPARK_DAEMON_JAVA_OPTS=f"{SMALL_JVM} -Djava.io.tmpdir={self.root / 'tmp'}",
                    PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                    SPARK_CONF_DIR=str(self.root / "conf"))

    def _spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=log,
                                stderr=subprocess.STDOUT, env=self.env(), cwd=self.root, start_new_session=True)
        self.processes[name] = proc
        return proc

    def start(self, timeout: float = 60.0) -> None:
        for sub in ("logs", "tmp", "conf", "work-1", "work-2"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "conf" / "log4j2.properties").write_text(
            "rootLogger.level = warn\nrootLogger.appenderRef.stdout.ref = console\n"
            "appender.console.type = Console\nappender.console.name = console\n"
            "appender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n\n")
        self.master_port, self.master_ui_port = free_port(), free_port()
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)])
        for i in (1, 2):
            self._spawn(f"worker-{i}", [
                "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
                "--work-dir", str(self.root / f"work-{i}")])
        try:
            wait_for("two alive workers registered with the master",
                     lambda: self._alive_workers() >= 2, timeout, step=0.25)
        except AssertionError:
            self.stop()
            raise

    def _alive_workers(self) -> int:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                log = (self.root / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log}")
        try:
            state = self.master_json()
        except (OSError, ValueError):
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def master_json(self) -> dict[str, Any]:
        return dict(_get_json(f"http://127.0.0.1:{self.master_ui_port}/json/"))

    def worker_pids(self) -> set[int]:
        return {p.pid for name, p in self.processes.items() if name.startswith("worker") and p.poll() is None}

    def executor_pids(self, app_id: str | None = None) -> dict[str, int]:
        """``{executor id: pid}`` of the executor JVMs (CoarseGrainedExecutorBackend) that this cluster's
        workers run, for one application or all."""
        workers = self.worker_pids()
        out: dict[str, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if _ppid(pid) not in workers:
                continue
            cmd = _cmdline(pid)
            if not any("CoarseGrainedExecutorBackend" in part for part in cmd):
                continue
            args = dict(itertools.pairwise(cmd))
            if app_id is not None and args.get("--app-id") != app_id:
                continue
            out[args.get("--executor-id", "?")] = pid
        return out

    def submit(self, job_args: Sequence[str], name: str, conf: dict[str, str] | None = None) -> Submission:
        """``spark-submit --master spark://... tests/pipeline/jobs/leveret_job.py <job_args>``: two executors
        of one core and 512 MiB, the driver's UI on a port of its own (its REST API), the job's report to
        ``<name>.json``."""
        ui_port = free_port()
        report = self.root / f"{name}.json"
        for stale in (report, Path(f"{report}.started")):
            stale.unlink(missing_ok=True)
        settings = {
            "spark.ui.port": str(ui_port), "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "512m", "spark.executor.memory": "512m", "spark.executor.cores": "1",
            "spark.cores.max": "2", "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.extraJavaOptions": f"{SMALL_JVM} -Djava.io.tmpdir={self.root / 'tmp'}",
            "spark.executor.extraJavaOptions": f"{SMALL_JVM} -Djava.io.tmpdir={self.root / 'tmp'}",
            "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
            "spark.task.maxFailures": "8",  # a killed executor's tasks count as failures in standalone mode
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",  # start once both executors are there
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
            "spark.sql.warehouse.dir": str(self.root / "warehouse"),
            "spark.sql.adaptive.enabled": "false",  # plans of a few tasks: nothing for it to coalesce
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            **(conf or {}),
        }
        cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.url, "--name", name]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += [str(JOBS / "leveret_job.py"), *job_args, "--report", str(report)]
        log_path = self.root / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=self.root,
                                start_new_session=True)
        sub = Submission(proc, log_path, report)
        self.submissions.append(sub)
        return sub

    def stop(self) -> None:
        for sub in self.submissions:
            sub.kill()
        for name in sorted(self.processes, reverse=True):  # workers (and their executors) first
            proc = self.processes[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # an executor a worker left behind
            except ProcessLookupError:
                pass
        for pid in self.executor_pids().values():  # pragma: no cover (only if a worker died first)
            os.kill(pid, signal.SIGKILL)


def start_cluster(root: Path) -> StandaloneCluster:
    if shutil.which("java") is None:
        raise RuntimeError("Spark needs Java 17 (make test installs openjdk-17-jre-headless when java is missing)")
    cluster = StandaloneCluster(root)
    cluster.start()
    return cluster
