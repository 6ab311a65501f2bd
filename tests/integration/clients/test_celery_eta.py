"""Celery's ETA / countdown tasks must not hold back the ordinary tasks queued behind them.

A worker keeps an ETA task unacknowledged until it is due, so each one it holds takes a slot of its prefetch
window; Celery makes up for that by raising the prefetch while it holds them (``qos.increment_eventually`` →
``basic.qos`` with a larger count), and then the broker must let its running consumer take more messages.
On RabbitMQ 3.x (kombu sends it ``global=true``) the worker gets the next ordinary task within about a
second. (kombu 5.7.0 sends RabbitMQ 4.x ``global=false``, which RabbitMQ applies to new consumers only:
kombu PR #2665.) A real ``celery worker`` process runs against the test's broker here, with Celery's own
prefetch defaults (multiplier 4); concurrency 1 makes the window 4 on any machine, so six countdown tasks
fill it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import amqp
import celery.exceptions
import kombu
import pytest

HERE = Path(__file__).resolve().parent.parent  # tests/integration (celery_app.py)
ROOT = HERE.parent.parent

COUNTDOWN = 30  # seconds: far beyond the wait below, so a pass cannot come from the countdowns running out
ORDINARY_WAIT = 10  # seconds the ordinary task may take (about 1 s on RabbitMQ)


def _drain(conn: amqp.Connection, until, timeout: float = 5.0) -> bool:
    """Let py-amqp read frames until ``until()`` holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.05)
        except TimeoutError:
            pass
    return until()


@pytest.mark.leveret_only
def test_py_amqp_qos_global_false_is_the_channel_limit_at_once(broker, uid):
    """What kombu means by ``global=false`` on a broker not named RabbitMQ (the AMQP 0-9-1 meaning): the
    channel's one limit, shared by its consumers and changed at once for the running ones. RabbitMQ itself
    would keep each existing consumer at 2 here; kombu sends RabbitMQ 3.3-3.x ``global=true`` instead."""
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid=broker.user, password=broker.password,
                           virtual_host=broker.vhost, connect_timeout=10)
    conn.connect()
    try:
        ch = conn.channel()
        qa, qb = f"{uid}-a", f"{uid}-b"
        for q in (qa, qb):
            ch.queue_declare(q, exclusive=True)
            for i in range(10):
                ch.basic_publish(amqp.Message(f"{q}-{i}"), routing_key=q)
        a: list[amqp.Message] = []
        b: list[amqp.Message] = []
        ch.basic_qos(0, 2, False)
        ch.basic_consume(qa, callback=a.append)
        ch.basic_consume(qb, callback=b.append)
        assert _drain(conn, lambda: len(a) + len(b) >= 2)
        _drain(conn, lambda: False, timeout=0.3)
        assert len(a) + len(b) == 2  # one limit for the channel, not 2 for each consumer
        ch.basic_qos(0, 5, False)  # raised while the consumers run, as Celery does for ETA tasks
        assert _drain(conn, lambda: len(a) + len(b) >= 5)
        _drain(conn, lambda: False, timeout=0.3)
        assert len(a) + len(b) == 5
        ch.basic_qos(0, 0, False)  # 0: no limit
        assert _drain(conn, lambda: len(a) + len(b) == 20)
    finally:
        conn.close()


@pytest.mark.quorum
def test_py_amqp_consumes_a_quorum_queue_under_its_channel_limit(broker, uid):
    """kombu's ``global=false`` (the channel's limit here, see above) is not the global QoS a quorum queue
    refuses (540, RabbitMQ's answer to basic.qos global=true): a Celery worker consumes quorum queues."""
    conn = amqp.Connection(f"{broker.host}:{broker.port}", userid=broker.user, password=broker.password,
                           virtual_host=broker.vhost, connect_timeout=10)
    conn.connect()
    try:
        ch = conn.channel()
        q = f"{uid}-quorum"
        ch.queue_declare(q, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
        for i in range(5):
            ch.basic_publish(amqp.Message(f"m{i}"), routing_key=q)
        got: list[amqp.Message] = []
        ch.basic_qos(0, 2, False)
        tag = ch.basic_consume(q, callback=got.append)
        assert _drain(conn, lambda: len(got) >= 2)
        for m in got[:2]:
            ch.basic_ack(m.delivery_tag)
        assert _drain(conn, lambda: len(got) >= 4)
        ch.basic_cancel(tag)
        ch.queue_delete(q)
    finally:
        conn.close()


def _load_celery_app():
    spec = importlib.util.spec_from_file_location("leveret_tests_celery_eta_app", HERE / "celery_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_countdown_tasks_do_not_block_an_ordinary_task(broker, uid, tmp_path):
    """Six ``countdown=30`` tasks, then an ordinary one: its result comes back within 10 s (bounded wait)."""
    queue = f"{uid}-celery"
    env = dict(os.environ, LEVERET_CELERY_BROKER_URL=broker.url, LEVERET_CELERY_QUEUE=queue,
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    mod = _load_celery_app()
    app = mod.app
    app.conf.broker_url = broker.url
    app.conf.task_default_queue = queue

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
        # The worker must be consuming before the tasks go out, so that it is its running consumer that
        # holds the countdown tasks when Celery raises the prefetch.
        assert mod.add.delay(0, 0).get(timeout=20) == 0, worker_output()
        # One queue, so the ordinary task is delivered after the six countdown tasks.
        delayed = [mod.add.apply_async((i, 1), countdown=COUNTDOWN) for i in range(6)]
        started = time.monotonic()
        try:
            assert mod.add.delay(2, 3).get(timeout=ORDINARY_WAIT) == 5
        except celery.exceptions.TimeoutError:
            pytest.fail(f"the ordinary task waited more than {ORDINARY_WAIT} s behind {len(delayed)} "
                        f"countdown tasks; worker output:\n{worker_output()}")
        assert time.monotonic() - started < COUNTDOWN
        assert all(not r.ready() for r in delayed)  # the countdown tasks are still waiting: they held slots
        assert worker.poll() is None, f"the worker died:\n{worker_output()}"
    finally:
        worker.terminate()  # warm shutdown
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        app.close()
        with kombu.Connection(broker.url, connect_timeout=5) as conn:
            conn.default_channel.queue_delete(queue)
