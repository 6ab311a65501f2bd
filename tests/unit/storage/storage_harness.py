"""A node's storage in a temporary directory that can be restarted cleanly (close, reopen) or dirtily
(everything handed to the kernel and fsynced, then abandoned without its clean-shutdown files: what a
kill -9 leaves behind after the last sync)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storage.node_storage import NodeStorage
from storage.variable_queue import VariableQueue


class Harness:
    """One node's storage and one queue in it, restartable."""

    def __init__(self, root: Path, durable: bool = True, **kw: Any) -> None:
        self.root = str(root)
        self.durable = durable
        self.kw = kw
        self.ns: NodeStorage = NodeStorage(self.root, **kw)
        self.vq: VariableQueue = self.open()

    def open(self) -> VariableQueue:
        vq = self.ns.open_queue("/", "q", self.durable)
        self.ns.finish_recovery()
        return vq

    def settle(self) -> None:
        """End of a burst: what the event loop's scheduled flush does, done inline."""
        self.ns.syncer.flush()

    def restart(self, clean: bool = True) -> VariableQueue:
        if clean:
            self.ns.close()
        else:
            self.ns.syncer.sync()
            self.abandon()
        self.ns = NodeStorage(self.root, **self.kw)
        self.vq = self.open()
        return self.vq

    def abandon(self) -> None:
        """Drop the storage as a crash would: descriptors released, no clean-shutdown files written."""
        ns = self.ns
        files = list(ns.persistent._files.values()) + list(ns.transient._files.values())
        for q in list(ns._queues.values()):
            files += list(q._index._files.values())
        for f in files:
            f.abandon()
        ns.metadata.close()

    def close(self) -> None:
        self.ns.close()
