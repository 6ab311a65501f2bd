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
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack

SEP = "\x1f"


def _key(key: str | tuple[str, ...]) -> str:
    return key if isinstance(key, str) else SEP.join(key)


def split_key(key: str) -> tuple[str, ...]:
    return tuple(key.split(SEP))


class MetadataStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS defs (kind TEXT NOT NULL, key TEXT NOT NULL, "
                         "value BLOB NOT NULL, PRIMARY KEY (kind, key)) WITHOUT ROWID")
        self._depth = 0

    def put(self, kind: str, key: str | tuple[str, ...], value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO defs (kind, key, value) VALUES (?, ?, ?)",
                         (kind, _key(key), msgpack.packb(value, use_bin_type=True)))

    def get(self, kind: str, key: str | tuple[str, ...]) -> Any | None:
        row = self._db.execute("SELECT value FROM defs WHERE kind = ? AND key = ?", (kind, _key(key))).fetchone()
        return None if row is None else msgpack.unpackb(row[0], raw=False, strict_map_key=False)

    def delete(self, kind: str, key: str | tuple[str, ...]) -> bool:
        return self._db.execute("DELETE FROM defs WHERE kind = ? AND key = ?", (kind, _key(key))).rowcount > 0

    def delete_prefix(self, kind: str, prefix: tuple[str, ...]) -> int:
        """Delete every key of ``kind`` starting with the parts ``prefix`` (e.g. all of one vhost)."""
        start = SEP.join(prefix) + SEP
        return self._db.execute("DELETE FROM defs WHERE kind = ? AND key >= ? AND key < ?",
                                (kind, start, start + "\U0010ffff")).rowcount

    def items(self, kind: str) -> list[tuple[str | tuple[str, ...], Any]]:
        """Every ``(key, value)`` of ``kind``, by key; tuple keys come back as tuples."""
        rows = self._db.execute("SELECT key, value FROM defs WHERE kind = ? ORDER BY key", (kind,)).fetchall()
        return [(split_key(k) if SEP in k else k, msgpack.unpackb(v, raw=False, strict_map_key=False))
                for k, v in rows]

    def kinds(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT kind FROM defs ORDER BY kind")]

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group changes into one atomic commit (one fsync). Nests: only the outermost commits."""
        if self._depth == 0:
            self._db.execute("BEGIN IMMEDIATE")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._db.execute("ROLLBACK")
            raise
        self._depth -= 1
        if self._depth == 0:
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
