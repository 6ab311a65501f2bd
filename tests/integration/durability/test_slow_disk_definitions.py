"""A slow disk does not stall the node: a definition's fsync is off the event loop, and its reply waits for it.

Issue 34: "SQLite commits run off the loop with the reply sent on commit (as RabbitMQ's Khepri commands reply on
commit)". The metadata store used to fsync each commit on the event loop; with a disk whose fsync takes a second,
every client of the node waited a second per queue.declare of anyone. Now its commits are fsynced by the
syncer's thread (storage/metadata_store.py) and the declare-ok waits for that fsync, the channel's later methods
held behind it (broker/amqp/channel.py), while the loop serves everyone else.

The slow disk is real at the system-call level: ``strace`` attached to the running broker delays every
``fsync``/``fdatasync`` of every thread by :data:`FSYNC_DELAY_S` before the kernel runs it (seccomp/ptrace
injection, no change to the broker). While one client declares durable queues, another client's round trips
on a transient queue (which write nothing) stay fast, each reply (exchange.declare, queue.declare, queue.bind,
queue.delete) comes only after a delayed fsync, strace's record shows no fsync made by the event loop's thread,
and what was answered survives a ``kill -9``. A second test makes every fsync fail (EIO): the declare waiting
for it is refused with 541, never answered ok.

Leveret only: it attaches to the broker process it started (RabbitMQ's Khepri does the same off its channel
processes, but the test reads Leveret's threads).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.leveret_only]

FSYNC_DELAY_S = 1.0
ROUND_TRIP_BOUND_S = 0.5  # the frozen-PostgreSQL tests' bound (issue 34); a stalled loop takes FSYNC_DELAY_S


def _traced(pid: int) -> bool:
    """Whether every thread of ``pid`` has a tracer (strace attached to all of them)."""
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        status = (task / "status").read_text()
        if re.search(r"^TracerPid:\s+0$", status, re.MULTILINE):
            return False
    return True


def _attach_slow_disk(pid: int, record: Path) -> subprocess.Popen:
    strace = shutil.which("strace")
    if strace is None:
        pytest.fail("this test needs strace (apt-get install strace; `make test` installs it)")
    delay_us = int(FSYNC_DELAY_S * 1_000_000)
    proc = subprocess.Popen([strace, "-f", "-qq", "-e", "trace=fsync,fdatasync",
                             "-e", f"inject=fsync,fdatasync:delay_enter={delay_us}", "-o", str(record),
                             "-p", str(pid)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not _traced(pid):
        if proc.poll() is not None:
            pytest.fail(f"strace could not attach: {proc.stderr.read().decode(errors='replace') if proc.stderr else ''}")
        if time.monotonic() > deadline:
            pytest.fail("strace did not attach to every thread within 10 s")
        time.sleep(0.02)
    return proc


def test_a_slow_fsync_delays_the_replies_that_wait_for_it_and_no_other_client(start_broker, tmp_path: Path):
    b = start_broker()
    rt_conn = pika.BlockingConnection(b.pika_params())
    rt = rt_conn.channel()
    rt.queue_declare("round-trips", durable=False)  # transient: nothing of it is written to the metadata
    declarer_conn = pika.BlockingConnection(b.pika_params())
    declarer = declarer_conn.channel()

    record = tmp_path / "strace.txt"
    strace = _attach_slow_disk(b.pid, record)
    declares: list[tuple[str, float]] = []
    failure: list[BaseException] = []
    # Each writes one definition (or removes one): each reply must wait for a delayed fsync.
    steps = [("exchange.declare", lambda: declarer.exchange_declare("durable-x", "direct", durable=True)),
             ("queue.declare", lambda: declarer.queue_declare("durable-0", durable=True)),
             ("queue.bind", lambda: declarer.queue_bind("durable-0", "durable-x", "k")),
             ("queue.declare", lambda: declarer.queue_declare("durable-1", durable=True)),
             ("queue.delete", lambda: declarer.queue_delete("durable-1"))]

    def declare_durable_queues() -> None:
        try:
            for name, step in steps:
                t0 = time.monotonic()
                step()
                declares.append((name, time.monotonic() - t0))
        except Exception as exc:  # noqa: BLE001 (reported by the main thread)
            failure.append(exc)

    try:
        worker = threading.Thread(target=declare_durable_queues)
        worker.start()
        round_trips: list[float] = []
        while worker.is_alive():
            t0 = time.monotonic()
            rt.basic_publish("", "round-trips", b"ping")
            got = None
            while got is None or got[0] is None:
                got = rt.basic_get("round-trips", auto_ack=True)
            round_trips.append(time.monotonic() - t0)
        worker.join()
    finally:
        strace.send_signal(signal.SIGINT)  # detaches from the broker, which goes on
        strace.wait(timeout=10)
    assert not failure, failure

    assert len(declares) == len(steps)
    # Each reply came after its fsync, delayed by the slow disk: the reply is on commit.
    assert min(took for _, took in declares) >= FSYNC_DELAY_S * 0.9, declares
    # Meanwhile the other client's round trips went on: several per second of the declares, none stalled.
    assert len(round_trips) >= 10 * len(steps), (len(round_trips), declares)
    assert max(round_trips) < ROUND_TRIP_BOUND_S, (max(round_trips), sorted(round_trips)[-5:], declares)

    # The fsyncs were made, and none by the event loop's thread (the process's main thread, tid == pid).
    delayed = [line for line in record.read_text().splitlines() if "DELAYED" in line]
    assert delayed, "strace recorded no fsync: the declares wrote nothing durable"
    by_loop = [line for line in delayed if line.split()[0] == str(b.pid)]
    assert not by_loop, by_loop

    rt_conn.close()
    declarer_conn.close()
    # Answered means durable: after a kill -9 the exchange, the queue and its binding are there, and the queue
    # deleted is not.
    os.kill(b.pid, signal.SIGKILL)
    b.process.wait(timeout=10)
    b.start()
    with pika.BlockingConnection(b.pika_params()) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("durable-x", "k", b"routed", mandatory=True)
        got = ch.basic_get("durable-0", auto_ack=True)
        assert got[2] == b"routed"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            ch.queue_declare("durable-1", durable=True, passive=True)
        assert gone.value.reply_code == 404


def test_a_failed_fsync_fails_the_declare_with_541_and_the_node_goes_on(start_broker, tmp_path: Path):
    """A disk whose fsync fails (EIO, injected by strace into every fsync of the broker): the declare that waited
    for it is refused with 541 naming the reason (never a declare-ok for a definition that may not be on disk),
    the failure is logged, other clients are served, and once the disk is healthy again declares succeed."""
    b = start_broker()
    other_conn = pika.BlockingConnection(b.pika_params())
    other = other_conn.channel()
    other.queue_declare("round-trips", durable=False)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()

    strace = shutil.which("strace")
    if strace is None:
        pytest.fail("this test needs strace (apt-get install strace; `make test` installs it)")
    failing = subprocess.Popen([strace, "-f", "-qq", "-e", "trace=fsync,fdatasync", "-e",
                                "inject=fsync,fdatasync:error=EIO", "-o", str(tmp_path / "strace.txt"),
                                "-p", str(b.pid)])
    try:
        deadline = time.monotonic() + 10
        while not _traced(b.pid):
            assert failing.poll() is None and time.monotonic() < deadline, "strace did not attach"
            time.sleep(0.02)
        with pytest.raises((pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)) as err:
            ch.queue_declare("never-durable", durable=True)
        assert err.value.reply_code == 541, err.value
        assert "fsync failed" in err.value.reply_text, err.value
        other.basic_publish("", "round-trips", b"still served")
        got = None
        while got is None or got[0] is None:
            got = other.basic_get("round-trips", auto_ack=True)
        assert got[2] == b"still served"
    finally:
        failing.send_signal(signal.SIGINT)
        failing.wait(timeout=10)
    assert "metadata: fsync of" in b.log_text()

    # The disk is healthy again: declares are durable and answered.
    with pika.BlockingConnection(b.pika_params()) as again:
        again.channel().queue_declare("durable-after", durable=True)
    other_conn.close()
    if conn.is_open:
        conn.close()
