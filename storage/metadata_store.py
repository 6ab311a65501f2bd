"""The node's one metadata store: every durable definition (vhosts, users, permissions, topic
permissions, policies, operator policies, runtime and global parameters, exchanges, queues, bindings)
in SQLite, as RabbitMQ keeps all of them in one Mnesia/Khepri database.

Schema: one table, ``defs (kind TEXT, key TEXT, value BLOB, crc INTEGER, PRIMARY KEY (kind, key))``. The broker
decides what a kind and a key are (broker/persistence.py lists them: for example kind ``"queue"``, key
``("/", "orders")``; a tuple key is joined with U+001F and comes back as a tuple) and a value is a
plain dict (or any value) msgpack encodes. Keys of per-vhost kinds start with the vhost, so a vhost's
rows go with one :meth:`delete_prefix` each. SQLite gives atomic, crash-safe updates for free, which
files of our own would have to earn.

Durability: WAL journal. A declare-ok must mean the definition survives a process crash and a power cut, so
every commit is fsynced before anyone is told of it. Where it is fsynced depends on the caller:

- **On a running node** (a ``syncer`` is given: storage/syncer.py, the message store's group commit) nothing on
  the event loop waits for the disk. The connection runs with ``synchronous=NORMAL``: a commit hands its WAL
  frames to the kernel and returns (SQLite's write, no fsync), the write counts as *accepted*, and the WAL is
  marked dirty in the syncer, whose thread fsyncs it by path with the message files of the same burst. The
  store is the node's :class:`~storage.commits.Commits`: a reply that follows a write waits for
  :meth:`committed` (broker/amqp/channel.py holds the channel's later methods meanwhile; the HTTP API awaits it),
  as RabbitMQ's Khepri commands reply on commit. Because the syncer's generations complete in order, a publish
  confirmed into a queue declared a moment before is confirmed after the queue's row is on disk too. SQLite's
  own checkpoints (which fsync) are turned off on this connection (``wal_autocheckpoint=0``) and run from a
  worker thread on a connection of their own every :data:`CHECKPOINT_EVERY` commits; what is left on the
  loop is the WAL header's fsync when SQLite starts reusing the log after such a checkpoint (once per
  :data:`CHECKPOINT_EVERY` commits).
- **Without a loop** (tools, unit tests, ``syncer=None``) ``synchronous=FULL``: every commit is fsynced before
  the call returns, and :meth:`committed` has nothing to wait for.

Batch many changes (a definitions import, a vhost's deletion) in :meth:`transaction` to commit them once. Long
batches (a definitions import of thousands of objects) are recorded with :meth:`recording` while they are
applied in memory and written by :meth:`apply` in one transaction from a worker thread; a lock keeps the event
loop's own writes out of that transaction. ``commits`` counts the commits, for tests.

A write that fails (a full disk, a read-only file) raises :class:`MetadataWriteError` and leaves the
store as it was (the statement or the whole transaction is rolled back): the caller changes nothing in
memory, so that memory never holds what a restart would not bring back.

A file that is not a SQLite database, or whose pages are damaged, raises :class:`MetadataStoreError` (one
line naming the file) rather than sqlite3's exception: the node must stop with a message the operator can
act on, before anything is recovered from the message files this store describes. SQLite checks neither its
pages' contents nor (silently) its write-ahead log, so damage is looked for three ways: the WAL is checked
before the database is opened (storage/sqlite_wal.py: a bad frame with committed frames after it), ``PRAGMA
quick_check`` checks the pages' structure (``check_integrity``), and every row carries a CRC-32 of its kind,
key and value (``crc``; ``row_crc``), checked when it is read, so that a flipped bit in a definition that
leaves the page readable is refused rather than believed. A database written before rows had the column is
migrated at open (checked with quick_check, then every row's checksum added in one transaction). Each of
these is reported (storage/corruption.py, ``store="metadata"``) and refuses the start.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import msgpack

from storage import corruption, sqlite_wal
from storage.checksum import crc32
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

SEP = "\x1f"

# Commits between two checkpoints of the WAL into the database, made by a worker thread (a running node; see
# the module docstring). Each commit appends at least one page to the WAL, so this checkpoints at least as often
# as SQLite's own default (every 1,000 pages: 4 MiB with 4 KiB pages).
CHECKPOINT_EVERY = 1000

# A recorded write (see MetadataStore.deferred): ("put", kind, key, value), ("delete", kind, key, None)
# or ("delete_prefix", kind, prefix, None).
Op = tuple[str, str, "str | tuple[str, ...]", Any]


class MetadataStoreError(Exception):
    """The metadata file cannot be used: not a SQLite database, or corrupt. The text names the file."""


class MetadataWriteError(Exception):
    """A change could not be written (disk full, read-only, I/O error); the store is unchanged. The text
    names the file and SQLite's reason."""


def row_crc(kind: str, key: str, value: bytes) -> int:
    """A row's checksum: CRC-32 (storage/checksum.py) of its kind, key and value, each length-prefixed."""
    k, y = kind.encode(), key.encode()
    return crc32(b"".join((len(k).to_bytes(4, "little"), k, len(y).to_bytes(4, "little"), y, value)))


def _key(key: str | tuple[str, ...]) -> str:
    return key if isinstance(key, str) else SEP.join(key)


def split_key(key: str) -> tuple[str, ...]:
    return tuple(key.split(SEP))


class Metadata(Protocol):
    """What the node asks of its metadata store (NodeStorage.metadata; broker/persistence.py and
    broker/definitions.py write through it), declared so that the two stores are one type to mypy: the SQLite
    :class:`MetadataStore` of a node, and a cluster member's storage/pg/shared_metadata.py
    ``SplitMetadataStore``, which broker/clustering/cluster.py installs in its place (the definitions every member shares
    in PostgreSQL, the rest here). Writes raise :class:`MetadataWriteError` and change nothing."""

    path: str
    was_empty: bool

    @property
    def commits(self) -> int:
        """Commits made (each one fsync), for tests and the curious."""
        ...

    def put(self, kind: str, key: str | tuple[str, ...], value: Any) -> None: ...

    def delete(self, kind: str, key: str | tuple[str, ...]) -> bool: ...

    def delete_prefix(self, kind: str, prefix: tuple[str, ...]) -> int: ...

    def get(self, kind: str, key: str | tuple[str, ...]) -> Any | None: ...

    def items(self, kind: str) -> list[tuple[Any, Any]]: ...

    def kinds(self) -> list[str]: ...

    def transaction(self, *, keep_on_error: bool = False) -> AbstractContextManager[None]: ...

    def open_batch(self) -> list[Op]: ...

    def recording(self, ops: list[Op]) -> AbstractContextManager[None]: ...

    def apply(self, ops: Sequence[Op]) -> None: ...

    async def apply_async(self, ops: Sequence[Op]) -> None:
        """:meth:`apply` for a caller on the event loop (an HTTP import), the loop serving everyone meanwhile."""
        ...

    def discard(self, ops: Sequence[Op]) -> None: ...

    def check_integrity(self) -> None: ...

    def close(self) -> None: ...


class _WriteAheadLog:
    """The store's WAL as the syncer sees it (storage/syncer.py ``SyncedFile``): SQLite has handed its frames to
    the kernel when a commit returns, so there is nothing to write out; ``written`` counts the commits marked,
    so that the syncer's bookkeeping of what a round covered holds. ``new`` until its first round: the log's
    directory entry is fsynced once, as a new segment file's is."""

    __slots__ = ("dirty", "error", "new", "path", "synced", "write_behind", "written")

    def __init__(self, path: str) -> None:
        self.path = path
        self.dirty = False
        self.new = True
        self.written = 0
        self.synced = 0
        self.write_behind = False
        self.error: OSError | None = None

    def write_out(self) -> bool:
        return True


class MetadataStore:
    """The definitions table. ``was_empty``: the file held no definitions when it was opened (a new
    file, or one whose table is empty), which NodeStorage checks against the message files.

    ``syncer``: the node's (a running node): commits are fsynced by its thread and :meth:`committed` says when;
    None: every commit is fsynced within the call (see the module docstring)."""

    def __init__(self, path: str, syncer: Syncer | None = None) -> None:
        self.path = path
        self._syncer = syncer
        self._check_wal()
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            if syncer is None:
                self._db.execute("PRAGMA synchronous=FULL")
            else:  # fsynced by the syncer's thread; checkpoints on a worker thread (module docstring)
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA wal_autocheckpoint=0")
            # Looked at before the table is created, so that a database without definitions is told apart
            # from one that has some (NodeStorage refuses the first next to message files).
            has_table = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'defs'"
                                         ).fetchone() is not None
            self.was_empty = not has_table or self._db.execute("SELECT 1 FROM defs LIMIT 1").fetchone() is None
            self._db.execute("CREATE TABLE IF NOT EXISTS defs (kind TEXT NOT NULL, key TEXT NOT NULL, "
                             "value BLOB NOT NULL, crc INTEGER, PRIMARY KEY (kind, key)) WITHOUT ROWID")
            if has_table and "crc" not in [r[1] for r in self._db.execute("PRAGMA table_info(defs)")]:
                self._add_row_checksums()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise self._error(exc) from None
        self._depth = 0
        self.commits = 0  # commits made (each one fsync), for tests and the curious
        self._lock = threading.RLock()
        self._recording: list[Op] | None = None
        self._pending: list[list[Op]] = []
        # Commits (storage/commits.py): writes accepted, the syncer generation that covers the last of them,
        # the newest generation known durable, and the replies waiting for theirs.
        self.accepted = 0
        self._wal = _WriteAheadLog(path + "-wal")
        self._covering = 0
        self._durable = 0
        self._waits: list[tuple[int, asyncio.Future[None]]] = []
        self._watching = False
        # Checkpoints off the loop (a running node): a connection of their own, one worker at a time.
        self._since_checkpoint = 0
        self._checkpointing = False
        self._checkpoint_lock = threading.Lock()
        self._closed = False

    def _add_row_checksums(self) -> None:
        """Migrate a database written before rows carried a checksum (``crc`` column): check its pages first
        (a damaged row must not be sealed with a checksum of its damage), then add the column and every row's
        checksum in one transaction. A start that dies half-way leaves the old format, migrated again next time."""
        rows = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
        if rows != ["ok"]:
            raise MetadataStoreError(f"{self.path} is corrupt (sqlite quick_check: {'; '.join(rows[:3])}); stop "
                                     "the node and restore the file from a backup")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("ALTER TABLE defs ADD COLUMN crc INTEGER")
            for kind, key, value in self._db.execute("SELECT kind, key, value FROM defs").fetchall():
                self._db.execute("UPDATE defs SET crc = ? WHERE kind = ? AND key = ?",
                                 (row_crc(kind, key, value), kind, key))
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _check_row(self, kind: str, key: str, value: bytes, crc: int | None) -> None:
        """A row whose checksum does not match was changed under SQLite (a flipped bit in a page SQLite still
        reads): refused like any damage to this file, since a changed definition would be believed."""
        if crc != row_crc(kind, key, value):
            corruption.report(self.path, 0, f"the row ({kind!r}, {key!r}) fails its checksum", "the start is "
                              "refused", store="metadata")
            raise MetadataStoreError(f"{self.path} is corrupt (the row {kind!r} {key!r} fails its checksum); stop "
                                     "the node and restore the file from a backup")

    def _error(self, exc: Exception) -> MetadataStoreError:
        # Refused, never repaired (RabbitMQ does not boot on damaged metadata either): recovery trusts this file to
        # say which message files belong to which queue, and a guess would delete the messages of the queues it
        # lost. The operator's ways out are a backup of this file or a reset (the caller appends the latter).
        return MetadataStoreError(f"{self.path} is not a readable metadata database ({exc}); stop the node and "
                                  "restore the file from a backup")

    def _check_wal(self) -> None:
        """Refuse a write-ahead log that SQLite would silently cut short (storage/sqlite_wal.py): damage to a
        frame with committed frames after it would lose those definitions without a word, so the start stops
        with one line naming the file and offset, as damage to the database itself does. Checked before the
        connection is opened, because opening replays (and may checkpoint) the log."""
        wal = self.path + "-wal"
        try:
            with open(wal, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._error(exc) from None
        at = sqlite_wal.find_damage(data)
        if at is None:
            return
        corruption.report(wal, at, "a WAL frame fails its checksum and committed frames follow it (SQLite would "
                          "drop them silently)", "the start is refused", store="metadata")
        raise MetadataStoreError(f"{wal} is damaged at offset {at} (a frame fails its checksum and committed "
                                 f"frames follow it); stop the node and restore {self.path} and {wal} from a backup")

    def check_integrity(self) -> None:
        """SQLite's ``quick_check`` over every page, then every row's checksum: damage found now stops the
        start before recovery acts on a partial list of queues (which would take the missing ones' files for
        orphans). All rows, not only the kinds recovery reads: a flipped bit in a row's kind or key moves it
        where no read looks (the bit-flip lane turned ``delayed_exchange`` into ``delayed_eychange``, and the
        delayed exchange's messages went unrouted without a word)."""
        try:
            rows = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
            if rows == ["ok"]:
                for kind, key, value, crc in self._db.execute("SELECT kind, key, value, crc FROM defs"):
                    self._check_row(kind, key, value, crc)
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None
        if rows != ["ok"]:
            what = "; ".join(r.replace("\n", " ") for r in rows[:3])
            corruption.report(self.path, 0, f"sqlite quick_check: {what}", "the start is refused", store="metadata")
            raise MetadataStoreError(f"{self.path} is corrupt (sqlite quick_check: {what}); stop the node and restore "
                                     "the file from a backup")

    # -- writing -------------------------------------------------------------------------------------------
    def put(self, kind: str, key: str | tuple[str, ...], value: Any) -> None:
        self._write(("put", kind, key, value))

    def delete(self, kind: str, key: str | tuple[str, ...]) -> bool:
        """Whether a row was deleted (always True while recording: the write happens later)."""
        return self._write(("delete", kind, key, None)) > 0

    def delete_prefix(self, kind: str, prefix: tuple[str, ...]) -> int:
        """Delete every key of ``kind`` starting with the parts ``prefix`` (e.g. all of one vhost)."""
        return self._write(("delete_prefix", kind, prefix, None))

    def _write(self, op: Op) -> int:
        if self._recording is not None:
            self._recording.append(op)
            return 1
        with self._lock:
            try:
                n = self._execute(op)
            except sqlite3.Error as exc:
                raise self._write_error(exc) from None
            if self._depth == 0:
                self.commits += 1
                self._accept()
            # A batch recorded earlier and not applied yet replays its writes later: the writes made since
            # are replayed after them, so that the last write of a key still wins.
            for pending in self._pending:
                pending.append(op)
        return n

    def _execute(self, op: Op) -> int:
        action, kind, key, value = op
        if action == "put":
            k = _key(key)
            packed = msgpack.packb(value, use_bin_type=True)
            return self._db.execute("INSERT OR REPLACE INTO defs (kind, key, value, crc) VALUES (?, ?, ?, ?)",
                                    (kind, k, packed, row_crc(kind, k, packed))).rowcount
        if action == "delete":
            return self._db.execute("DELETE FROM defs WHERE kind = ? AND key = ?", (kind, _key(key))).rowcount
        start = SEP.join(key) + SEP
        return self._db.execute("DELETE FROM defs WHERE kind = ? AND key >= ? AND key < ?",
                                (kind, start, start + "\U0010ffff")).rowcount

    def _write_error(self, exc: Exception) -> MetadataWriteError:
        return MetadataWriteError(f"cannot write to {self.path}: {exc}")

    # -- reading -------------------------------------------------------------------------------------------
    def get(self, kind: str, key: str | tuple[str, ...]) -> Any | None:
        try:
            k = _key(key)
            row = self._db.execute("SELECT value, crc FROM defs WHERE kind = ? AND key = ?", (kind, k)).fetchone()
            if row is None:
                return None
            self._check_row(kind, k, row[0], row[1])
            return msgpack.unpackb(row[0], raw=False, strict_map_key=False)
        except (sqlite3.DatabaseError, ValueError, msgpack.UnpackException) as exc:
            raise self._error(exc) from None

    def items(self, kind: str) -> list[tuple[Any, Any]]:
        """Every ``(key, value)`` of ``kind``, by key: a key is a str, or a tuple of str for a kind with a
        composite key (typed Any: its shape is the kind's, known to the caller). Recovery reads
        through this, so a damaged page or record is a :class:`MetadataStoreError`."""
        try:
            rows = self._db.execute("SELECT key, value, crc FROM defs WHERE kind = ? ORDER BY key", (kind,)
                                    ).fetchall()
            for k, v, c in rows:
                self._check_row(kind, k, v, c)
            return [(split_key(k) if SEP in k else k, msgpack.unpackb(v, raw=False, strict_map_key=False))
                    for k, v, _c in rows]
        except (sqlite3.DatabaseError, ValueError, msgpack.UnpackException) as exc:
            raise self._error(exc) from None

    def kinds(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT kind FROM defs ORDER BY kind")]

    # -- transactions ----------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self, *, keep_on_error: bool = False) -> Iterator[None]:
        """Group changes into one atomic commit (one fsync). Nests: only the outermost commits. A commit
        that fails rolls everything back and raises :class:`MetadataWriteError`.

        ``keep_on_error``: an exception still commits what was written before it, for callers (a
        definitions import) whose in-memory state already holds those changes, so that the store never
        falls behind what clients were told exists."""
        if self._recording is not None:  # recording a batch: it is applied in one transaction later
            yield
            return
        self._lock.acquire()
        try:
            if self._depth == 0:
                try:
                    self._db.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    raise self._write_error(exc) from None
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    if keep_on_error:
                        self._commit()
                    else:
                        self._rollback()
                raise
            self._depth -= 1
            if self._depth == 0:
                self._commit()
        finally:
            self._lock.release()

    def _commit(self, accept: bool = True) -> None:
        """COMMIT; ``accept``: the caller is on the loop's thread (``apply``'s worker is not: apply_async
        accepts its commit once back on the loop)."""
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise self._write_error(exc) from None
        self.commits += 1
        if accept:
            self._accept()

    def _rollback(self) -> None:
        if self._db.in_transaction:  # SQLite ends the transaction itself on some errors (SQLITE_FULL)
            self._db.execute("ROLLBACK")

    # -- batches written later, in one transaction (definitions imports) ---------------------------------------
    def open_batch(self) -> list[Op]:
        """A batch to record writes into (:meth:`recording`), written by :meth:`apply` or dropped by
        :meth:`discard`. Until then, every write made directly is also appended to it (see ``_write``)."""
        ops: list[Op] = []
        with self._lock:
            self._pending.append(ops)
        return ops

    @contextmanager
    def recording(self, ops: list[Op]) -> Iterator[None]:
        """While inside, writes are appended to ``ops`` instead of being made (the caller applies them
        later with :meth:`apply`). Only for code that does not wait in between (one slice of an import)."""
        previous, self._recording = self._recording, ops
        try:
            yield
        finally:
            self._recording = previous

    def apply(self, ops: Sequence[Op]) -> None:
        """Write a recorded batch in one transaction (one commit). Safe to call from a worker thread: the
        lock keeps other writes out until it is committed. Raises MetadataWriteError, writing nothing."""
        with self._lock:
            self.discard(ops)
            batch = list(ops)
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for op in batch:
                    self._execute(op)
            except sqlite3.Error as exc:
                self._rollback()
                raise self._write_error(exc) from None
            self._commit(accept=False)

    async def apply_async(self, ops: Sequence[Op]) -> None:
        """:meth:`apply` on a worker thread, then its fsync by the syncer (or within apply, without one), the
        event loop serving meanwhile."""
        await asyncio.to_thread(self.apply, ops)
        self._accept()
        commit = self.committed()
        if commit is not None:
            await commit

    def discard(self, ops: Sequence[Op]) -> None:
        with self._lock:
            self._pending = [p for p in self._pending if p is not ops]

    # -- commits (storage/commits.py), on a running node ------------------------------------------------------
    def _accept(self) -> None:
        """A commit was made on the loop's thread: count it and, on a running node, have the syncer fsync the
        WAL in its next round (the end of this burst), which is the generation a reply waits for."""
        self.accepted += 1
        syncer = self._syncer
        if syncer is None:
            return
        wal = self._wal
        wal.written += 1
        if not wal.dirty:
            wal.dirty = True
            syncer.mark(wal)
        self._covering = syncer.generation
        if not self._watching:
            self._watching = True
            syncer.wait(self)
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_EVERY and not self._checkpointing and not self._closed:
            self._since_checkpoint = 0
            self._checkpointing = True
            done = asyncio.get_running_loop().run_in_executor(None, self._checkpoint)
            done.add_done_callback(self._checkpointed)

    def committed(self) -> asyncio.Future[None] | None:
        """None if every write accepted so far is on disk; else a future done once it is, or failed with
        :class:`MetadataWriteError` if the fsync that covered it failed (storage/commits.py)."""
        if self._covering <= self._durable:
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waits.append((self._covering, done))
        return done

    def on_synced(self, generation: int) -> bool:
        """The syncer's round up to ``generation`` is on disk (storage/syncer.py SyncWaiter)."""
        self._durable = max(self._durable, generation)
        self._release(generation, None)
        return self._still_watching()

    def on_sync_failed(self, generation: int) -> bool:
        """The fsync of a round up to ``generation`` failed: the writes it covered may not survive a power cut.
        Their replies fail (541 / 500 naming the reason, as a publish in such a round is nacked); later writes go
        on (an fsync is not retried: the kernel may have dropped the pages it failed to write)."""
        log.error("metadata: fsync of %s failed; the definitions written since the last good one may not survive "
                  "a power cut", self._wal.path)
        self._durable = max(self._durable, generation)
        self._release(generation, MetadataWriteError(f"cannot make {self.path} durable: fsync failed"))
        return self._still_watching()

    def _release(self, generation: int, error: MetadataWriteError | None) -> None:
        if not self._waits:
            return
        waiting = []
        for covering, done in self._waits:
            if covering > generation:
                waiting.append((covering, done))
            elif not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)
        self._waits = waiting

    def _still_watching(self) -> bool:
        if self._waits or self._covering > self._durable:
            return True
        self._watching = False
        return False

    # -- checkpoints off the loop --------------------------------------------------------------------------------
    def _checkpoint(self) -> tuple[int, int, int] | None:
        """A passive checkpoint (worker thread): the WAL's committed frames into the database file, fsynced by
        SQLite before and after; the loop's writes go on meanwhile. SQLite's answer: (busy, frames in the WAL,
        frames checkpointed); None once closed."""
        with self._checkpoint_lock:
            if self._closed:
                return None
            # A connection per checkpoint (one every CHECKPOINT_EVERY commits), closed after it: the node holds no
            # descriptor for it between checkpoints (the live fuzz test counts the broker's descriptors).
            checkpointer = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                row = checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            finally:
                checkpointer.close()
            return int(row[0]), int(row[1]), int(row[2])

    def _checkpointed(self, done: asyncio.Future[tuple[int, int, int] | None]) -> None:
        self._checkpointing = False
        exc = done.exception()
        if exc is not None:  # the WAL keeps the commits; the next look tries again
            log.warning("metadata: checkpoint of %s failed: %s", self._wal.path, exc)

    def close(self) -> None:
        with self._checkpoint_lock:
            self._closed = True
        self._db.close()
