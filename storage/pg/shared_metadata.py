"""A cluster member's metadata store: the node's own SQLite store (storage/metadata_store.py) for what is
the node's alone, and the cluster's PostgreSQL table (storage/pg/definitions_store.py) for what every
member shares, behind the one interface the broker writes through.

Which rows are whose is the broker's knowledge, not storage's (a queue row is shared when its queue type
says so): the broker passes ``where(kind, key, value)``, answering ``"local"``, ``"shared"`` or, when it
cannot tell without the value (a read or a delete), ``"both"``. A put goes to one side; a delete is made
on both (deleting what is not there costs a statement and changes nothing); a read of a ``"both"`` kind
merges the two, the shared row winning a key both hold.

Transactions span both stores (the outer commit commits PostgreSQL first, then SQLite): the SQLite side
holds only node-local rows, so a crash between the two commits leaves at worst a local row its shared
twin's transaction also wrote elsewhere, never a shared definition half-made. Batches (a definitions
import: :meth:`open_batch`, :meth:`recording`, :meth:`apply_async`) are recorded here and split at apply.
The shared side is written on the broker's event loop (storage/pg/definitions_store.py); reads of it are the
recovery pass's, at start.

:meth:`replaying` is for changes other members made: the broker applies them to its memory through its
ordinary operations, which write through this store as they always do; inside ``replaying`` those writes
are dropped, since the change is already in the cluster's table (and a local copy would be wrong).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, Literal

from storage.metadata_store import Metadata, Op
from storage.pg.definitions_store import PgDefinitionsStore

Where = Literal["local", "shared", "both"]
WhereFn = Callable[[str, "str | tuple[str, ...]", Any], Where]


class SplitMetadataStore:
    """The metadata store of a cluster member (see the module docstring)."""

    def __init__(self, local: Metadata, shared: PgDefinitionsStore, where: WhereFn) -> None:
        self.local = local
        self.shared = shared
        self.where = where
        self.path = local.path
        self.was_empty = local.was_empty
        self._replaying = 0
        self._recording: list[Op] | None = None
        self._pending: list[list[Op]] = []
        self._lock = threading.RLock()

    @property
    def commits(self) -> int:
        return self.local.commits + self.shared.commits

    def check_integrity(self) -> None:
        self.local.check_integrity()

    @contextmanager
    def replaying(self) -> Iterator[None]:
        """Writes made inside are dropped: the memory is catching up with the cluster's table."""
        self._replaying += 1
        try:
            yield
        finally:
            self._replaying -= 1

    # -- writing -------------------------------------------------------------------------------------------
    def put(self, kind: str, key: str | tuple[str, ...], value: Any) -> None:
        self._write(("put", kind, key, value))

    def delete(self, kind: str, key: str | tuple[str, ...]) -> bool:
        return self._write(("delete", kind, key, None)) > 0

    def delete_prefix(self, kind: str, prefix: tuple[str, ...]) -> int:
        return self._write(("delete_prefix", kind, prefix, None))

    def _sides(self, op: Op) -> tuple[bool, bool]:
        """(local, shared): where ``op`` is made."""
        action, kind, key, value = op
        where = self.where(kind, key, value if action == "put" else None)
        if action == "put" and where == "both":
            where = "shared"
        return where != "shared", where != "local"

    def _write(self, op: Op) -> int:
        if self._replaying:
            return 1
        if self._recording is not None:
            self._recording.append(op)
            return 1
        with self._lock:
            local, shared = self._sides(op)
            n = 0
            if shared:
                n += self.shared.write([op])
            if local:
                n += self._write_local(op)
            for pending in self._pending:
                pending.append(op)
        return n

    def _write_local(self, op: Op) -> int:
        action, kind, key, value = op
        if action == "put":
            self.local.put(kind, key, value)
            return 1
        if action == "delete":
            return int(self.local.delete(kind, key))
        assert isinstance(key, tuple)
        return self.local.delete_prefix(kind, key)

    @contextmanager
    def transaction(self, *, keep_on_error: bool = False) -> Iterator[None]:
        if self._recording is not None or self._replaying:
            yield
            return
        with self._lock, ExitStack() as stack:
            # Entered local first so that PostgreSQL's commit (the inner context) comes first on the way out.
            stack.enter_context(self.local.transaction(keep_on_error=keep_on_error))
            stack.enter_context(self.shared.transaction(keep_on_error=keep_on_error))
            yield

    # -- reading -------------------------------------------------------------------------------------------
    def get(self, kind: str, key: str | tuple[str, ...]) -> Any | None:
        where = self.where(kind, key, None)
        if where != "local":
            value = self.shared.get(kind, key)
            if value is not None or where == "shared":
                return value
        return self.local.get(kind, key)

    def items(self, kind: str) -> list[tuple[Any, Any]]:
        where = self.where(kind, "", None)
        if where == "local":
            return self.local.items(kind)
        if where == "shared":
            return self.shared.items(kind)
        merged = dict(self.local.items(kind))
        merged.update(self.shared.items(kind))
        return sorted(merged.items(), key=lambda kv: kv[0] if isinstance(kv[0], tuple) else (kv[0],))

    def kinds(self) -> list[str]:
        return sorted(set(self.local.kinds()) | set(self.shared.kinds()))

    # -- batches (definitions imports) -----------------------------------------------------------------------
    def open_batch(self) -> list[Op]:
        ops: list[Op] = []
        with self._lock:
            self._pending.append(ops)
        return ops

    @contextmanager
    def recording(self, ops: list[Op]) -> Iterator[None]:
        previous, self._recording = self._recording, ops
        try:
            yield
        finally:
            self._recording = previous

    def _split(self, ops: Sequence[Op]) -> tuple[list[Op], list[Op]]:
        """(shared, local): the ops of a batch by the store they are made in."""
        shared_ops, local_ops = [], []
        for op in ops:
            local, shared = self._sides(op)
            if shared:
                shared_ops.append(op)
            if local:
                local_ops.append(op)
        return shared_ops, local_ops

    def apply(self, ops: Sequence[Op]) -> None:
        """A recorded batch: its shared writes in one PostgreSQL transaction (accepted into its journal: on the
        broker's loop), then its local ones in one SQLite transaction."""
        with self._lock:
            self.discard(ops)
            shared_ops, local_ops = self._split(ops)
            if shared_ops:
                self.shared.apply(shared_ops)
            if local_ops:
                self.local.apply(local_ops)

    async def apply_async(self, ops: Sequence[Op]) -> None:
        """:meth:`apply` on the broker's loop without it waiting: the shared writes into the PostgreSQL journal
        (one transaction; the reply waits for its commit, storage/commits.py), the local ones in one SQLite
        transaction on a worker thread (both stores lock their connection)."""
        with self._lock:
            self.discard(ops)
            shared_ops, local_ops = self._split(ops)
            if shared_ops:
                self.shared.apply(shared_ops)
        if local_ops:
            await self.local.apply_async(local_ops)

    def discard(self, ops: Sequence[Op]) -> None:
        with self._lock:
            self._pending = [p for p in self._pending if p is not ops]

    def close(self) -> None:
        self.shared.close()
        self.local.close()
