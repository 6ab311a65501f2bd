"""A delay store under test (storage/delay/): an injectable clock, and a node that restarts cleanly or crashes.
Shared by the delay store's test modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storage.delay import DelayRecord, DelayStore
from storage.delay.record import DueRecord
from storage.syncer import Syncer


class Clock:
    """The store's ``now_ms``: whatever the test sets ``t`` to."""

    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


class Node:
    """A delay store on a loop-less syncer; ``restart`` closes cleanly, ``crash`` abandons its buffers."""

    def __init__(self, path: Path, clock: Clock, **kw: Any) -> None:
        self.path = path
        self.clock = clock
        self.kw = kw
        self.durable = 0
        self.start()

    def start(self) -> None:
        self.syncer = Syncer(None)
        self.store = DelayStore(str(self.path), self.syncer, self.clock, **self.kw)
        self.store.on_durable = self._durable

    def _durable(self, n: int) -> None:
        self.durable = max(self.durable, n)

    def restart(self) -> None:
        self.store.close()
        self.syncer.close()
        self.start()

    def crash(self) -> None:
        self.store.abandon()
        self.start()

    def put(self, due: int, body: bytes = b"", xref: int = 1, delay: int = 0) -> int:
        return self.store.append(DelayRecord(due, xref, b"rk", b"\x00\x01", body, delay))

    def sync(self) -> None:
        self.syncer.flush()

    def drain(self, limit: int = 1000) -> list[DueRecord]:
        """Everything due now, each batch marked dispatched."""
        out: list[DueRecord] = []
        while True:
            batch = self.store.due(limit)
            if not batch:
                return out
            self.store.dispatched(batch)
            out.extend(batch)
