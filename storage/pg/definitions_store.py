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

**Writes commit on the broker's loop, replies wait for the commit.** Called on a running event loop (the
broker's), a write is accepted at once into an ordered journal, and a task commits the journal on a connection
of that loop's own, every entry queued meanwhile in one transaction (a group commit); :meth:`committed` (the
storage/commits.py seam) gives the future the writer's reply waits for. So a slow or frozen PostgreSQL delays
the replies of the methods that wrote a definition, never the loop: every other connection of the member is
served meanwhile (a frozen server used to stall them all for the store's timeout). A batch that fails is tried
again on a new session until it commits (writes are idempotent: the same value put again, a tombstone made
again); a waiter gives up after ``timeout`` (541 to the client) while the write stays queued, as a Khepri
command that timed out may still be applied. The change feed is read on the same connection, after the
journal's writes (:meth:`changes_since_async`).

Called off a loop (the node's start before it serves, a definitions import on a worker thread, tools), the
store is synchronous, as before: it runs a private event loop on a thread and each call waits there for its
statements (bounded by ``timeout``). A lock keeps one operation (or one transaction) at a time on that
connection, from any thread.

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
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import asyncpg
import msgpack

from storage.metadata_store import SEP, MetadataStoreError, MetadataWriteError, Op, split_key
from storage.pg.schema import migrate

T = TypeVar("T")

log = logging.getLogger("leveret.pg.definitions")

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
# A journal batch that failed is tried again after RETRY_FIRST seconds, doubling up to RETRY_MAX.
RETRY_FIRST = 0.1
RETRY_MAX = 2.0

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


_CHANGES = ("SELECT version, kind, key, value, writer FROM leveret.definition WHERE version > $1 "
            "ORDER BY version LIMIT $2")


def _changes(rows: list[asyncpg.Record]) -> list[Change]:
    return [Change(int(r["version"]), r["kind"], _unkey(r["key"]),
                   None if r["value"] is None else _unpack(r["value"]), r["writer"]) for r in rows]


def _on_a_loop() -> bool:
    """Whether the caller runs on an event loop (the broker's): its writes go to the journal, never wait."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class PgDefinitionsStore:
    """The definitions table of a cluster, with the SQLite store's interface (put, delete, delete_prefix,
    get, items, kinds, transaction) plus the feed (:meth:`changes_since`, :meth:`changes_since_async`,
    :meth:`last_version`) and the storage/commits.py seam (:attr:`accepted`, :meth:`committed`).

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
        # The journal of writes made on the broker's loop (see the module docstring): entries not committed
        # yet, each with the future its writers wait for; the task committing them; its connection and the
        # lock that orders the feed's reads after it; the writes accepted so far and the last one's future.
        self._journal: list[tuple[list[Op], asyncio.Future[None]]] = []
        self._journal_task: asyncio.Task[None] | None = None
        self._aconn: asyncpg.Connection | None = None
        self._alock: asyncio.Lock | None = None
        self._accepted = 0
        self._last: asyncio.Future[None] | None = None
        self._group: list[Op] | None = None  # the writes of an open transaction() on the loop
        # Whether the loop's session was lost (dropped after a failure, or ended by the server) and not made
        # again since: writes are then refused at once, before anything changes in memory, as before.
        self._lost = False
        self._lost_at = 0.0
        self._answered_at = 0.0  # the last answer on the private loop's session (a read made again since)
        try:
            self._run(self._setup())
        except BaseException:
            self.close()
            raise

    # -- the private loop --------------------------------------------------------------------------------
    def _run(self, coro: Awaitable[T], wait: float | None = None) -> T:
        """``coro`` on the private loop, waited for at most ``wait`` seconds (the store's ``timeout``)."""
        wait = self.timeout if wait is None else wait
        if self._unanswered:
            close = getattr(coro, "close", None)
            if close is not None:
                close()  # never started
            self._loop.call_soon_threadsafe(self._start_probe)  # (one runs already, unless it died)
            raise TimeoutError(f"PostgreSQL did not answer within {self.timeout:g} s, and has not answered since")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(wait)
        except concurrent.futures.TimeoutError:
            future.cancel()
            # The session is in an unknown state (a statement cut off midway): the next call opens a new one.
            # Until the server answers a probe, calls fail at once: a hung server costs the caller (the
            # broker's event loop) one timeout, not one per declare or feed read.
            self._unanswered = True
            self._loop.call_soon_threadsafe(self._drop_connection)
            self._loop.call_soon_threadsafe(self._start_probe)
            raise TimeoutError(f"PostgreSQL did not answer within {wait:g} s") from None

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

    def _run_again_if_stale(self, make: Callable[[], Awaitable[T]], wait: float | None = None) -> T:
        """``_run(make())``, and once more when it failed on a session opened before this call that is dead
        now (the server restarted since it was last used): the retry opens a new one."""
        before = self.connects
        try:
            return self._run(make(), wait)
        except TimeoutError:
            raise  # no answer at all: trying again would only double the wait
        except _PG_ERRORS:
            conn = self._conn
            if self.connects != before or before == 0 or conn is None or not conn.is_closed():
                raise
        return self._run(make(), wait)

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
        """Make ``ops`` in the open transaction, or in one of their own; returns the rows changed. On the
        broker's loop the write is accepted into the journal and returns at once (the count is then the
        number of ops): whoever answers after it waits for :meth:`committed`."""
        if self._group is not None:
            self._group.extend(ops)
            return len(ops)
        if self._tx is None and _on_a_loop():
            self._refuse_if_lost()
            self._accept(ops)
            return len(ops)
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

    async def _execute(self, ops: list[Op], conn: asyncpg.Connection | None = None) -> int:
        if conn is None:
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
        was written before an exception, as the SQLite store does for an import. On the broker's loop the
        writes become one entry of the journal, accepted when the outermost level ends."""
        if self._tx is None and (self._group is not None or _on_a_loop()):
            outer = self._group is None
            if outer:
                self._refuse_if_lost()
                self._group = []
            try:
                yield
            except BaseException:
                if outer:
                    group, self._group = self._group, None
                    if keep_on_error and group:
                        self._accept(group)
                raise
            if outer:
                group, self._group = self._group, None
                if group:
                    self._accept(group)
            return
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

    # -- the journal (writes made on the broker's loop) -------------------------------------------------------
    @property
    def accepted(self) -> int:
        return self._accepted

    def committed(self) -> asyncio.Future[None] | None:
        """The storage/commits.py seam: None if every write accepted so far is committed, else a future done
        when they are (failed with MetadataWriteError after ``timeout``; the writes stay in the journal)."""
        last = self._last
        if last is None or last.done():
            return None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def done(_f: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        def late() -> None:
            if not waiter.done():
                waiter.set_exception(MetadataWriteError(
                    f"cannot write the cluster's definitions to PostgreSQL: no answer within {self.timeout:g} s "
                    "(the change is committed when it answers)"))

        last.add_done_callback(done)
        timer = loop.call_later(self.timeout, late)
        waiter.add_done_callback(lambda _f: timer.cancel())
        return waiter

    def _refuse_if_lost(self) -> None:
        """A write while the loop's session to PostgreSQL is lost (the server went away, or did not answer) is
        refused at once (541): nothing changes in memory, so nothing is made that the cluster never learns of.
        The feed's next read (every poll) makes a new session when the server is back."""
        conn = self._aconn
        if conn is not None and conn.is_closed():
            self._drop_async()  # ended by the server: lost as of now
        if self._lost and self._answered_at <= self._lost_at:
            raise self._write_error(ConnectionError("the session to PostgreSQL is lost"))

    def _accept(self, ops: list[Op]) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._journal.append((ops, done))
        self._accepted += 1
        self._last = done
        if self._journal_task is None:
            self._journal_task = loop.create_task(self._commit_journal())

    async def _commit_journal(self) -> None:
        """Commit the journal in order, everything queued meanwhile in one transaction, each batch tried again
        on a new session until it commits (PostgreSQL away or frozen: the writers' replies wait, nobody else)."""
        try:
            while self._journal:
                batch, self._journal = self._journal, []
                ops = [op for entry_ops, _done in batch for op in entry_ops]
                pause = RETRY_FIRST
                while True:
                    try:
                        async with self._async_lock():
                            await asyncio.wait_for(self._commit_async(ops), self.timeout)
                        break
                    except _PG_ERRORS as exc:
                        if pause == RETRY_FIRST:
                            log.warning("cannot commit the cluster's definitions to PostgreSQL; retrying: %s", exc)
                        self._drop_async()
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, RETRY_MAX)
                self.commits += 1
                for _ops, done in batch:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._journal_task = None

    async def _commit_async(self, ops: list[Op]) -> None:
        conn = await self._async_connection()
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", DEFINITIONS_LOCK_CLASS, DEFINITIONS_LOCK_ID)
            await self._execute(ops, conn)

    def _async_lock(self) -> asyncio.Lock:
        if self._alock is None:
            self._alock = asyncio.Lock()
        return self._alock

    async def _async_connection(self) -> asyncpg.Connection:
        if self._aconn is None or self._aconn.is_closed():
            self._drop_async()
            self._aconn = await asyncpg.connect(self.dsn, timeout=self.timeout)
            self._lost = False
        return self._aconn

    def _drop_async(self) -> None:
        self._lost = True
        self._lost_at = time.monotonic()
        if self._aconn is not None:
            self._aconn.terminate()
            self._aconn = None

    async def changes_since_async(self, version: int, limit: int = 10_000) -> list[Change]:
        """:meth:`changes_since` on the broker's loop, after the journal's writes so far (on its connection),
        bounded by ``timeout``; MetadataStoreError if PostgreSQL does not answer."""
        try:
            async with self._async_lock():
                conn = await asyncio.wait_for(self._async_connection(), self.timeout)
                rows = await asyncio.wait_for(conn.fetch(_CHANGES, version, limit), self.timeout)
        except _PG_ERRORS as exc:
            self._drop_async()
            raise self._read_error(exc) from None
        return _changes(rows)

    # -- reading -------------------------------------------------------------------------------------------
    def _read(self, coro_fn: Any, *args: Any, wait: float | None = None) -> Any:
        with self._lock:
            try:
                answer = self._run_again_if_stale(lambda: coro_fn(*args), wait)
                self._answered_at = time.monotonic()  # the server is there: writes are accepted again
                return answer
            except _PG_ERRORS as exc:
                raise self._read_error(exc) from None

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await (await self._connection()).fetch(query, *args)
        return rows

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

    def changes_since(self, version: int, limit: int = 10_000, wait: float | None = None) -> list[Change]:
        """The rows written after ``version``, oldest first (deletions with ``value`` None), at most
        ``limit`` of them: ask again from the last one's version for more. ``wait``: at most that many
        seconds (the store's ``timeout``), after which calls fail at once until the server answers again."""
        return _changes(self._read(self._fetch, _CHANGES, version, limit, wait=wait))

    def close(self) -> None:
        if self._journal_task is not None:
            if self._journal:
                log.warning("%d definitions writes not committed at close", len(self._journal))
            self._journal_task.cancel()
        self._drop_async()

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
