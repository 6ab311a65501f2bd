"""storage/background.py's WorkerThread: a thread that cannot be started leaves nothing queued behind it, and a
job that dies does not take the thread (and every later job, and ``wait``) with it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from storage.background import WorkerThread


def test_a_thread_that_could_not_start_is_started_by_the_next_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.new_event_loop()
    worker = WorkerThread(loop, "test-background")
    ran: list[str] = []

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError):
        worker.submit(lambda: ran.append("first"), lambda: None)
    monkeypatch.undo()
    worker.submit(lambda: ran.append("second"), lambda: None)
    worker.wait()  # would block for ever if the first job had been queued for a thread that never ran
    assert ran == ["second"]
    worker.close()
    loop.close()


def test_a_job_that_dies_leaves_the_thread_serving_the_next() -> None:
    loop = asyncio.new_event_loop()
    worker = WorkerThread(loop, "test-background")
    ran: list[str] = []

    def dies() -> None:
        raise SystemExit("a job must not take the thread down")

    worker.submit(dies, lambda: ran.append("then of the one that died"))
    worker.submit(lambda: ran.append("next"), lambda: None)
    worker.wait()
    assert "next" in ran
    loop.run_until_complete(asyncio.sleep(0))  # the thens come back on the loop
    assert "then of the one that died" in ran
    worker.close()
    loop.close()
