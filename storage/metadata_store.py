"""Durable definitions (vhosts, users, permissions, exchanges, queues, bindings, policies) in SQLite.

One table of ``(kind, key) -> value``: the broker decides what a kind and a key are (for example kind
``"queue"``, key ``("/", "orders")``; a tuple key is joined with U+001F) and values are anything msgpack
encodes. SQLite gives atomic, crash-safe updates for free, which files of our own would have to earn.

Durability: WAL journal with ``synchronous=FULL``, so every committed change is fsynced before the call
returns. In WAL mode ``NORMAL`` survives a process crash but may lose the last commits on a power cut;
a declare-ok must mean the definition survives both, and definitions change rarely, so the fsync per
commit is cheap enough. Batch many changes (a definitions import, a vhost's deletion) in
:meth:`transaction` to pay it once.

Calls block the caller for the commit's fsync (about a millisecond); the broker calls this from the
event loop only for rare administrative changes, never per message.

A file that is not a SQLite database, or whose pages are damaged, raises :class:`MetadataStoreError` (one
line naming the file) rather than sqlite3's exception: the node must stop with a message the operator can
act on, before anything is recovered from the message files this store describes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack

SEP = "\x1f"


class MetadataStoreError(Exception):
    """The metadata file cannot be used: not a SQLite database, or corrupt. The text names the file."""


def _key(key: str | tuple[str, ...]) -> str:
    return key if isinstance(key, str) else SEP.join(key)


def split_key(key: str) -> tuple[str, ...]:
    return tuple(key.split(SEP))


class MetadataStore:
    """The definitions table. ``was_empty``: the file held no definitions when it was opened (a new
    file, or one whose table is empty), which NodeStorage checks against the message files."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # Looked at before the table is created, so that a database without definitions is told apart
            # from one that has some (NodeStorage refuses the first next to message files).
            has_table = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'defs'"
                                         ).fetchone() is not None
            self.was_empty = not has_table or self._db.execute("SELECT 1 FROM defs LIMIT 1").fetchone() is None
            self._db.execute("CREATE TABLE IF NOT EXISTS defs (kind TEXT NOT NULL, key TEXT NOT NULL, "
                             "value BLOB NOT NULL, PRIMARY KEY (kind, key)) WITHOUT ROWID")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise self._error(exc) from None
        self._depth = 0

    def _error(self, exc: Exception) -> MetadataStoreError:
        return MetadataStoreError(f"{self.path} is not a readable metadata database ({exc})")

    def check_integrity(self) -> None:
        """SQLite's ``quick_check`` over every page: damage found now stops the start before recovery
        acts on a partial list of queues (which would take the missing ones' files for orphans)."""
        try:
            rows = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None
        if rows != ["ok"]:
            raise MetadataStoreError(f"{self.path} is corrupt (sqlite quick_check: {'; '.join(rows[:3])})")

    def put(self, kind: str, key: str | tuple[str, ...], value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO defs (kind, key, value) VALUES (?, ?, ?)",
                         (kind, _key(key), msgpack.packb(value, use_bin_type=True)))

    def get(self, kind: str, key: str | tuple[str, ...]) -> Any | None:
        try:
            row = self._db.execute("SELECT value FROM defs WHERE kind = ? AND key = ?",
                                   (kind, _key(key))).fetchone()
            return None if row is None else msgpack.unpackb(row[0], raw=False, strict_map_key=False)
        except (sqlite3.DatabaseError, ValueError, msgpack.UnpackException) as exc:
            raise self._error(exc) from None

    def delete(self, kind: str, key: str | tuple[str, ...]) -> bool:
        return self._db.execute("DELETE FROM defs WHERE kind = ? AND key = ?", (kind, _key(key))).rowcount > 0

    def delete_prefix(self, kind: str, prefix: tuple[str, ...]) -> int:
        """Delete every key of ``kind`` starting with the parts ``prefix`` (e.g. all of one vhost)."""
        start = SEP.join(prefix) + SEP
        return self._db.execute("DELETE FROM defs WHERE kind = ? AND key >= ? AND key < ?",
                                (kind, start, start + "\U0010ffff")).rowcount

    def items(self, kind: str) -> list[tuple[str | tuple[str, ...], Any]]:
        """Every ``(key, value)`` of ``kind``, by key; tuple keys come back as tuples. Recovery reads
        through this, so a damaged page or record is a :class:`MetadataStoreError`."""
        try:
            rows = self._db.execute("SELECT key, value FROM defs WHERE kind = ? ORDER BY key", (kind,)).fetchall()
            return [(split_key(k) if SEP in k else k, msgpack.unpackb(v, raw=False, strict_map_key=False))
                    for k, v in rows]
        except (sqlite3.DatabaseError, ValueError, msgpack.UnpackException) as exc:
            raise self._error(exc) from None

    def kinds(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT kind FROM defs ORDER BY kind")]

    @contextmanager
    def transaction(self, *, keep_on_error: bool = False) -> Iterator[None]:
        """Group changes into one atomic commit (one fsync). Nests: only the outermost commits.

        ``keep_on_error``: an exception still commits what was written before it, for callers (a
        definitions import) whose in-memory state already holds those changes, so that the store never
        falls behind what clients were told exists."""
        if self._depth == 0:
            self._db.execute("BEGIN IMMEDIATE")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._db.execute("COMMIT" if keep_on_error else "ROLLBACK")
            raise
        self._depth -= 1
        if self._depth == 0:
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
