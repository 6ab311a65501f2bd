"""The cluster's shared definitions in PostgreSQL: the metadata store's rows (``kind``, ``key``, ``value``,
as storage/metadata_store.py keeps them on one node) that every member of a cluster reads, and the change
feed through which each member learns what the others changed.

**A feed, not a re-read.** Every write gives its row a ``version`` from a sequence, and a delete leaves a
tombstone (``value`` NULL) with a new version, so a member that has applied everything up to version N asks
for the rows above N and gets every change since, deletions included. For that to be true, versions must
become visible in their order: a transaction holding version N-1 that committed after a reader saw N would
be skipped for ever. So every writing transaction first takes one transaction-level advisory lock and only
then draws its versions: writes of definitions are serialised cluster-wide, which costs nothing measurable
(they are administrative and rare: declares, bindings, users, policies, never messages).

**Synchronous on purpose.** The broker's metadata store is synchronous by design: a ``queue.declare-ok`` is
sent after the definition is committed, from a handler that does not wait. asyncpg (the cluster's driver,
chosen for the message path; research/postgres-queue.md §3.9) is asynchronous, so this store runs its own
event loop on a private thread and each call waits there for its statements (bounded by ``timeout``). The
broker's loop waits for the round trip, as it waits for SQLite's fsync on a single node. A lock keeps one
operation (or one transaction) at a time on the store's one connection, from any thread.

Values are msgpack, as in the SQLite store. Errors: a write that fails raises
:class:`~storage.metadata_store.MetadataWriteError` and changes nothing (the transaction is rolled back);
a read that fails raises :class:`~storage.metadata_store.MetadataStoreError`. A lost connection is made
again by the next call; and since a server that restarted is only noticed by the first statement sent to
it, a read, or a write outside :meth:`transaction`, that fails on a connection found dead is tried once
more on a new one (a write is idempotent: the same value put again, a tombstone made again). While the
server is down every call fails at once (the connect is refused), within ``timeout`` if it does not answer;
after a call that went unanswered, every call fails at once until a probe on the private loop is answered (a
hung server costs the broker's loop one ``timeout``, not one per declare or feed read).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import asyncpg
import msgpack

from storage.metadata_store import SEP, MetadataStoreError, MetadataWriteError, Op, split_key
from storage.pg.schema import migrate

T = TypeVar("T")

# What a statement on a lost, refused or slow connection raises.
_PG_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)

# The advisory lock every writing transaction takes first (pg_advisory_xact_lock(DEFINITIONS_LOCK_CLASS,
# DEFINITIONS_LOCK_ID)): versions then commit in the order they are drawn.
DEFINITIONS_LOCK_CLASS = 4250
DEFINITIONS_LOCK_ID = 1

# After a call went unanswered: a probe every PROBE_INTERVAL seconds, each given PROBE_TIMEOUT (or the store's
# timeout if shorter), until the server answers (calls fail at once meanwhile).
PROBE_INTERVAL = 0.5
PROBE_TIMEOUT = 2.0

# Its table, leveret.definition, is migration 2 of storage/pg/schema.py.

# The doorbell of the feed: every transaction that changed a definition notifies this channel (delivered when it
# commits; several in one transaction are one), and each member's follower listens (broker/cluster_definitions.py)
# and reads the feed at once instead of at its next poll.
DEFINITIONS_BELL = "leveret_definitions"

_PUT = ("INSERT INTO leveret.definition (kind, key, value, version, writer) "
        "VALUES ($1, $2, $3, nextval('leveret.definition_version'), $4) "
        "ON CONFLICT (kind, key) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version, "
        "writer = EXCLUDED.writer")
_DELETE = ("UPDATE leveret.definition SET value = NULL, version = nextval('leveret.definition_version'), "
           "writer = $3 WHERE kind = $1 AND key = $2 AND value IS NOT NULL")
_DELETE_PREFIX = ("UPDATE leveret.definition SET value = NULL, "
                  "version = nextval('leveret.definition_version'), writer = $3 "
                  "WHERE kind = $1 AND left(key, length($2)) = $2 AND value IS NOT NULL")


class Change(NamedTuple):
    """One row of the feed: ``value`` None for a deletion."""

    version: int
    kind: str
    key: Any  # a str, or a tuple of str for a composite key (as MetadataStore.items gives it)
    value: Any | None
    writer: str


def _key(key: str | tuple[str, ...]) -> str:
    return key if isinstance(key, str) else SEP.join(key)


def _unkey(key: str) -> Any:
    return split_key(key) if SEP in key else key


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


class PgDefinitionsStore:
    """The definitions table of a cluster, with the SQLite store's interface (put, delete, delete_prefix,
    get, items, kinds, transaction) plus the feed (:meth:`changes_since`, :meth:`last_version`).

    ``writer`` names this member in the rows it writes."""

    def __init__(self, dsn: str, writer: str, timeout: float = 10.0) -> None:
        self.dsn = dsn
        self.writer = writer
        self.timeout = timeout
        self.commits = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leveret-pg-definitions", daemon=True)
        self._thread.start()
        self._conn: asyncpg.Connection | None = None
        self.connects = 0  # sessions opened (the first by the constructor)
        self._lock = threading.RLock()
        self._tx: Any = None  # the open asyncpg transaction of transaction(), if any
        self._depth = 0
        # Set when a call went unanswered for ``timeout``: later calls fail at once, without waiting on the
        # caller's thread (the broker's event loop), until a probe on the private loop gets an answer again.
        self._unanswered = False
        self._probe: asyncio.Task[None] | None = None
        try:
            self._run(self._setup())
        except BaseException:
            self.close()
            raise

    # -- the private loop --------------------------------------------------------------------------------
    def _run(self, coro: Awaitable[T]) -> T:
        if self._unanswered:
            close = getattr(coro, "close", None)
            if close is not None:
                close()  # never started
            self._loop.call_soon_threadsafe(self._start_probe)  # (one runs already, unless it died)
            raise TimeoutError(f"PostgreSQL did not answer within {self.timeout:g} s, and has not answered since")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            # The session is in an unknown state (a statement cut off midway): the next call opens a new one.
            # Until the server answers a probe, calls fail at once: a hung server costs the caller (the
            # broker's event loop) one timeout, not one per declare or feed read.
            self._unanswered = True
            self._loop.call_soon_threadsafe(self._drop_connection)
            self._loop.call_soon_threadsafe(self._start_probe)
            raise TimeoutError(f"PostgreSQL did not answer within {self.timeout:g} s") from None

    def _start_probe(self) -> None:
        if self._probe is None:
            self._probe = self._loop.create_task(self._probe_until_answered())

    async def _probe_until_answered(self) -> None:
        """On the private loop: a new session and ``SELECT 1`` every PROBE_INTERVAL until one is answered."""
        wait = min(self.timeout, PROBE_TIMEOUT)
        try:
            while True:
                try:
                    conn = await asyncio.wait_for(asyncpg.connect(self.dsn, timeout=wait), wait)
                    try:
                        await asyncio.wait_for(conn.fetchval("SELECT 1"), wait)
                    finally:
                        conn.terminate()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 (any failure to answer: a protocol error, an EOF, ...)
                    await asyncio.sleep(PROBE_INTERVAL)
                    continue
                self._unanswered = False
                return
        finally:
            self._probe = None

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.terminate()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            if self._conn is not None:
                self._conn.terminate()
            self._conn = await asyncpg.connect(self.dsn, timeout=self.timeout)
            self.connects += 1
        return self._conn

    def _run_again_if_stale(self, make: Callable[[], Awaitable[T]]) -> T:
        """``_run(make())``, and once more when it failed on a session opened before this call that is dead
        now (the server restarted since it was last used): the retry opens a new one."""
        before = self.connects
        try:
            return self._run(make())
        except TimeoutError:
            raise  # no answer at all: trying again would only double the wait
        except _PG_ERRORS:
            conn = self._conn
            if self.connects != before or before == 0 or conn is None or not conn.is_closed():
                raise
        return self._run(make())

    async def _setup(self) -> None:
        await migrate(await self._connection())

    def _write_error(self, exc: BaseException) -> MetadataWriteError:
        return MetadataWriteError(f"cannot write the cluster's definitions to PostgreSQL: {exc}")

    def _read_error(self, exc: BaseException) -> MetadataStoreError:
        return MetadataStoreError(f"cannot read the cluster's definitions from PostgreSQL: {exc}")

    # -- writing -------------------------------------------------------------------------------------------
    def put(self, kind: str, key: str | tuple[str, ...], value: Any) -> None:
        self.write([("put", kind, key, value)])

    def delete(self, kind: str, key: str | tuple[str, ...]) -> bool:
        return self.write([("delete", kind, key, None)]) > 0

    def delete_prefix(self, kind: str, prefix: tuple[str, ...]) -> int:
        return self.write([("delete_prefix", kind, prefix, None)])

    def write(self, ops: list[Op]) -> int:
        """Make ``ops`` in the open transaction, or in one of their own; returns the rows changed."""
        with self._lock:
            try:
                if self._tx is not None:
                    return self._run(self._execute(ops))
                return self._run_again_if_stale(lambda: self._in_transaction(ops))
            except _PG_ERRORS as exc:
                raise self._write_error(exc) from None

    def apply(self, ops: list[Op]) -> None:
        """A recorded batch (a definitions import) in one transaction: :meth:`write` under its other name."""
        self.write(ops)

    async def _in_transaction(self, ops: list[Op]) -> int:
        conn = await self._connection()
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", DEFINITIONS_LOCK_CLASS, DEFINITIONS_LOCK_ID)
            n = await self._execute(ops)
        self.commits += 1
        return n

    async def _execute(self, ops: list[Op]) -> int:
        conn = await self._connection()
        n = 0
        for action, kind, key, value in ops:
            if action == "put":
                status = await conn.execute(_PUT, kind, _key(key), msgpack.packb(value, use_bin_type=True),
                                            self.writer)
            elif action == "delete":
                status = await conn.execute(_DELETE, kind, _key(key), self.writer)
            else:
                status = await conn.execute(_DELETE_PREFIX, kind, SEP.join(key) + SEP, self.writer)
            n += int(status.rsplit(" ", 1)[-1])
        if n:
            await conn.execute("SELECT pg_notify($1, '')", DEFINITIONS_BELL)
        return n

    @contextmanager
    def transaction(self, *, keep_on_error: bool = False) -> Iterator[None]:
        """Group writes into one commit; nests (only the outermost commits). ``keep_on_error`` commits what
        was written before an exception, as the SQLite store does for an import."""
        with self._lock:
            if self._depth == 0:
                try:
                    self._tx = self._run_again_if_stale(self._begin)
                except _PG_ERRORS as exc:
                    raise self._write_error(exc) from None
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    self._finish(commit=keep_on_error)
                raise
            self._depth -= 1
            if self._depth == 0:
                self._finish(commit=True)

    async def _begin(self) -> Any:
        conn = await self._connection()
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", DEFINITIONS_LOCK_CLASS, DEFINITIONS_LOCK_ID)
        return tx

    def _finish(self, commit: bool) -> None:
        tx, self._tx = self._tx, None
        try:
            self._run(tx.commit() if commit else tx.rollback())
        except _PG_ERRORS as exc:
            if commit:
                with contextlib.suppress(*_PG_ERRORS):  # the connection is gone: the server rolled it back
                    self._run(tx.rollback())
                raise self._write_error(exc) from None
            return
        if commit:
            self.commits += 1

    # -- reading -------------------------------------------------------------------------------------------
    def _read(self, coro_fn: Any, *args: Any) -> Any:
        with self._lock:
            try:
                return self._run_again_if_stale(lambda: coro_fn(*args))
            except _PG_ERRORS as exc:
                raise self._read_error(exc) from None

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await (await self._connection()).fetch(query, *args)

    def get(self, kind: str, key: str | tuple[str, ...]) -> Any | None:
        rows = self._read(self._fetch, "SELECT value FROM leveret.definition WHERE kind = $1 AND key = $2 "
                                       "AND value IS NOT NULL", kind, _key(key))
        return _unpack(rows[0]["value"]) if rows else None

    def items(self, kind: str) -> list[tuple[Any, Any]]:
        rows = self._read(self._fetch, "SELECT key, value FROM leveret.definition WHERE kind = $1 "
                                       "AND value IS NOT NULL ORDER BY key COLLATE \"C\"", kind)
        return [(_unkey(r["key"]), _unpack(r["value"])) for r in rows]

    def kinds(self) -> list[str]:
        rows = self._read(self._fetch, "SELECT DISTINCT kind FROM leveret.definition WHERE value IS NOT NULL "
                                       "ORDER BY kind")
        return [r["kind"] for r in rows]

    # -- the feed ------------------------------------------------------------------------------------------
    def last_version(self) -> int:
        rows = self._read(self._fetch, "SELECT coalesce(max(version), 0) AS v FROM leveret.definition")
        return int(rows[0]["v"])

    def changes_since(self, version: int, limit: int = 10_000) -> list[Change]:
        """The rows written after ``version``, oldest first (deletions with ``value`` None), at most
        ``limit`` of them: ask again from the last one's version for more."""
        rows = self._read(self._fetch, "SELECT version, kind, key, value, writer FROM leveret.definition "
                                       "WHERE version > $1 ORDER BY version LIMIT $2", version, limit)
        return [Change(int(r["version"]), r["kind"], _unkey(r["key"]),
                       None if r["value"] is None else _unpack(r["value"]), r["writer"]) for r in rows]

    def close(self) -> None:
        async def shut() -> None:
            if self._probe is not None:
                self._probe.cancel()
            if self._conn is not None and not self._conn.is_closed():
                await self._conn.close(timeout=2)

        if self._loop.is_running():
            with contextlib.suppress(*_PG_ERRORS):
                self._run(shut())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()
