"""Work a store hands off the event loop: a job run on a thread of its own, its outcome taken back on the loop.

The seam (:class:`Background`) has two implementations: :class:`WorkerThread`, one daemon thread running the
jobs in the order given and calling each one's ``then`` on the loop thread, for a node serving clients; and
:class:`Inline`, which runs the job and its ``then`` at once, for a store without a loop (tools, unit tests),
where nobody else is waiting on it.

A job only touches what its owner handed it (copies of the state it writes, descriptors of its own): the loop
goes on changing the store meanwhile. ``then`` is where the outcome is applied, on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("leveret.storage")


class Background(Protocol):
    def submit(self, job: Callable[[], None], then: Callable[[], None]) -> None:
        """Run ``job`` off the loop, then ``then`` on the loop thread. ``job`` must not raise: it keeps its
        own outcome for ``then`` (an exception it lets out is logged, and ``then`` still runs)."""
        ...

    def wait(self) -> None:
        """Block until every job submitted so far has ended (their ``then`` may not have run yet): a clean
        stop, or an operation that needs the store's files settled now."""
        ...

    def close(self) -> None:
        """Wait for the jobs, then release the thread (if any)."""
        ...


class Inline:
    """No loop: the job and its ``then`` run at once, on the caller's thread."""

    def submit(self, job: Callable[[], None], then: Callable[[], None]) -> None:
        _run(job)
        then()

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass


class WorkerThread:
    """One thread for one owner's jobs, started on first use; ``then`` comes back through
    ``loop.call_soon_threadsafe``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._name = name
        self._jobs: queue.Queue[tuple[Callable[[], None], Callable[[], None]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None], then: Callable[[], None]) -> None:
        if self._thread is None:
            thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            thread.start()  # raises when no thread can be started: then nothing is queued, and the next try starts one
            self._thread = thread
        self._jobs.put((job, then))

    def wait(self) -> None:
        self._jobs.join()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            try:
                if item is None:
                    return
                job, then = item
                _run(job)
                if not self._loop.is_closed():
                    try:
                        self._loop.call_soon_threadsafe(then)
                    except RuntimeError:  # the loop closed meanwhile: nobody is left to apply the outcome
                        pass
            finally:
                self._jobs.task_done()


def _run(job: Callable[[], None]) -> None:
    try:
        job()
    except BaseException:  # the thread lives on: a job after it, and wait(), must not hang
        log.exception("storage: a background job failed")
