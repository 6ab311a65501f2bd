"""Celery ``countdown=`` / ``eta=`` tasks held by the broker in an ``x-delayed-message`` exchange (issue 14).

Celery's own countdown and eta hold the task in the worker: it is delivered at once, kept unacknowledged
until due, and takes a prefetch slot meanwhile. The recipe tested here lets the broker hold it instead:

- the task queue's exchange is a kombu ``Exchange(type="x-delayed-message",
  arguments={"x-delayed-type": "direct"})``, so the client publishes there (routing key = the queue name);
- a ``before_task_publish`` handler turns the message's ``eta`` header (which Celery sets from ``countdown=``
  or ``eta=``) into an ``x-delay`` header in milliseconds and clears ``eta``: for Celery the task is due at
  once, and the broker routes it to the queue when the delay is over.

A real ``celery worker`` process (tests/integration/celery_app.py, as in test_celery_eta.py) runs the task.
The worker's log gives when it received and ran it: not before the due time (so the broker, not the worker,
held it) and within a bound after it.
"""

from __future__ import annotations

import datetime
import importlib.util
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import kombu
import pytest
from celery.signals import before_task_publish
from kombu import Exchange, Queue

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(180)]

HERE = Path(__file__).resolve().parent.parent  # tests/integration (celery_app.py)
ROOT = HERE.parent.parent

COUNTDOWN = 3.0  # seconds
ETA_IN = 4.0  # seconds from now
LATE_BOUND = 3.0  # seconds a task may run after its due time on a loaded machine (typically < 0.2 s)
LOG_TOLERANCE = 0.005  # the worker log's timestamps are to the millisecond


def broker_side_delay(headers=None, **_kw) -> None:
    """The recipe's publish hook: Celery's eta (from countdown= or eta=) becomes the broker's x-delay."""
    eta = headers.get("eta") if headers else None
    if not eta:
        return
    due = datetime.datetime.fromisoformat(eta) if isinstance(eta, str) else eta
    if due.tzinfo is None:
        due = due.replace(tzinfo=datetime.UTC)
    delay_ms = math.ceil((due - datetime.datetime.now(datetime.UTC)).total_seconds() * 1000)
    headers["x-delay"] = max(0, delay_ms)
    headers["eta"] = None  # due at once for Celery: the worker must not hold it as well


def _load_celery_app():
    spec = importlib.util.spec_from_file_location("leveret_tests_delayed_celery_app", HERE / "celery_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[^\]]*\] Task leveret_tests\.add\[([0-9a-f-]+)\] "
                      r"(received|succeeded)", re.MULTILINE)


def _worker_times(text: str) -> dict[tuple[str, str], float]:
    """(task id, "received" | "succeeded") -> wall-clock time, from the worker's log (local time)."""
    out = {}
    for stamp, task_id, what in LOG_LINE.findall(text):
        out[(task_id, what)] = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


def test_countdown_and_eta_tasks_are_held_by_the_delayed_exchange_and_run_on_time(broker, uid, tmp_path):
    queue = f"{uid}-celery"
    delayed = Exchange(f"{uid}-delayed", type="x-delayed-message", arguments={"x-delayed-type": "direct"})
    env = dict(os.environ, LEVERET_CELERY_BROKER_URL=broker.url, LEVERET_CELERY_QUEUE=queue,
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    mod = _load_celery_app()
    app = mod.app
    app.conf.broker_url = broker.url
    app.conf.task_default_queue = queue
    app.conf.task_queues = [Queue(queue, delayed, routing_key=queue)]
    before_task_publish.connect(broker_side_delay, weak=False)

    log_path = tmp_path / "celery-worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.integration.celery_app", "worker", "--pool=solo",
             "--concurrency=1", "-l", "info", "-Q", queue, "-n", f"{uid}@%h", "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def worker_output() -> str:
        return log_path.read_text(errors="replace")

    try:
        # An undelayed task first: the worker consumes, and the queue is bound to the delayed exchange.
        assert mod.add.delay(0, 0).get(timeout=30) == 0, worker_output()
        sent_cd = time.time()
        r_cd = mod.add.apply_async((1, 2), countdown=COUNTDOWN)
        eta = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=ETA_IN)
        r_eta = mod.add.apply_async((3, 4), eta=eta)
        due_cd, due_eta = sent_cd + COUNTDOWN, eta.timestamp()

        time.sleep(1.0)  # held by the broker meanwhile: nothing in the queue, nothing at the worker
        with kombu.Connection(broker.url, connect_timeout=10) as conn:
            _, ready, _ = conn.default_channel.queue_declare(queue, passive=True)
        assert ready == 0
        assert not r_cd.ready() and not r_eta.ready()
        early = _worker_times(worker_output())
        assert (r_cd.id, "received") not in early and (r_eta.id, "received") not in early, worker_output()

        assert r_cd.get(timeout=COUNTDOWN + 30) == 3, worker_output()
        assert r_eta.get(timeout=ETA_IN + 30) == 7, worker_output()
        got = time.time()
        assert got >= due_eta

        deadline = time.monotonic() + 10  # the log line may trail the result
        while time.monotonic() < deadline:
            times = _worker_times(worker_output())
            if all((r.id, w) in times for r in (r_cd, r_eta) for w in ("received", "succeeded")):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the worker log lacks the tasks' lines:\n{worker_output()}")
        report = []
        for name, r, due in (("countdown", r_cd, due_cd), ("eta", r_eta, due_eta)):
            received, ran = times[(r.id, "received")], times[(r.id, "succeeded")]
            report.append(f"{name}: received {received - due:+.3f}s, done {ran - due:+.3f}s from due")
            assert received >= due - LOG_TOLERANCE, (name, received - due, worker_output())
            assert ran - due <= LATE_BOUND, (name, ran - due, worker_output())
        print("; ".join(report))
        assert worker.poll() is None, f"the worker died:\n{worker_output()}"
    finally:
        before_task_publish.disconnect(broker_side_delay)
        worker.terminate()  # warm shutdown
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        app.close()
        with kombu.Connection(broker.url, connect_timeout=10) as conn:
            conn.default_channel.queue_delete(queue)
            conn.default_channel.exchange_delete(delayed.name)
