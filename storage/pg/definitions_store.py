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

**Everything on the broker's loop, nothing waits there** (issue 34). The store has one session, opened on the
broker's event loop by :meth:`PgDefinitionsStore.open` (awaited at start, before the node serves). A write is
accepted at once into an ordered journal, and a task commits the journal on that session, every entry queued
meanwhile in one transaction (a group commit); :meth:`committed` (the storage/commits.py seam) gives the future
the writer's reply waits for. So a slow or frozen PostgreSQL delays the replies of the methods that wrote a
definition, never the loop: every other connection of the member is served meanwhile. A batch that fails is
tried again on a new session until it commits (writes are idempotent: the same value put again, a tombstone made
again); a waiter gives up after ``timeout`` (541 to the client) while the write stays queued, as a Khepri
command that timed out may still be applied. The change feed is read on the same session, after the journal's
writes (:meth:`changes_since`, awaited).

**Reads are for the recovery pass.** :meth:`get`, :meth:`items` and :meth:`kinds` (the metadata store's
synchronous reads) answer from the table as :meth:`open` read it, in one snapshot with the feed's version at
that moment (:attr:`version_at_open`, from which the member follows the feed), plus this member's writes since.
That is what the recovery pass reads, before the node serves; :meth:`recovered` drops the snapshot once the
member follows the feed, and a read after it is refused (MetadataStoreError): a running member's memory is the
definitions, kept in line by the feed (broker/clustering/cluster_definitions.py), never read back from here.

Values are msgpack, as in the SQLite store. Errors: a write refused (the session is known lost) raises
:class:`~storage.metadata_store.MetadataWriteError` and changes nothing; a write not committed within
``timeout`` fails its waiter with MetadataWriteError; a feed read that fails raises
:class:`~storage.metadata_store.MetadataStoreError`. A lost session is made again by the next read of the feed
(the member's poll, every 0.5 s) or the journal's next try.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import asyncpg
import msgpack

from storage.metadata_store import SEP, MetadataStoreError, MetadataWriteError, Op, split_key
from storage.pg.connections import PG_FAILURES
from storage.pg.schema import migrate

log = logging.getLogger("leveret.pg.definitions")

# The advisory lock every writing transaction takes first (pg_advisory_xact_lock(DEFINITIONS_LOCK_CLASS,
# DEFINITIONS_LOCK_ID)): versions then commit in the order they are drawn.
DEFINITIONS_LOCK_CLASS = 4250
DEFINITIONS_LOCK_ID = 1

# A journal batch that failed is tried again after RETRY_FIRST seconds, doubling up to RETRY_MAX.
RETRY_FIRST = 0.1
RETRY_MAX = 2.0

# Its table, leveret.definition, is migration 2 of storage/pg/schema.py.

# The doorbell of the feed: every transaction that changed a definition notifies this channel (delivered when it
# commits; several in one transaction are one), and each member's follower listens
# (broker/clustering/cluster_definitions.py) and reads the feed at once instead of at its next poll.
DEFINITIONS_BELL = "leveret_definitions"

_PUT = ("INSERT INTO leveret.definition (kind, key, value, version, writer) "
        "VALUES ($1, $2, $3, nextval('leveret.definition_version'), $4) "
        "ON CONFLICT (kind, key) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version, "
        "writer = EXCLUDED.writer")
# _PUT for many rows in one statement (a definitions import's thousands of queues and bindings), their versions
# drawn in the rows' order.
_PUT_MANY = ("INSERT INTO leveret.definition (kind, key, value, version, writer) "
             "SELECT k, key, v, nextval('leveret.definition_version'), $4 "
             "FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY AS r(k, key, v, n) ORDER BY n "
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


_SNAPSHOT = "SELECT kind, key, value FROM leveret.definition WHERE value IS NOT NULL"
_LAST_VERSION = "SELECT coalesce(max(version), 0) FROM leveret.definition"


class PgDefinitionsStore:
    """The definitions table of a cluster, with the SQLite store's interface (put, delete, delete_prefix,
    transaction; get, items, kinds for the recovery pass) plus the feed (:meth:`changes_since`,
    :attr:`version_at_open`) and the storage/commits.py seam (:attr:`accepted`, :meth:`committed`). Made by
    :meth:`open`, on the broker's event loop.

    ``writer`` names this member in the rows it writes."""

    def __init__(self, dsn: str, writer: str, timeout: float = 10.0) -> None:
        """No I/O: :meth:`open` connects."""
        self.dsn = dsn
        self.writer = writer
        self.timeout = timeout
        self.commits = 0
        self.connects = 0  # sessions opened
        self.version_at_open = 0
        # The table as open() read it, plus this member's writes since: kind -> {key: value} (recovery's reads).
        self._snapshot: dict[str, dict[str, Any]] | None = None
        # The journal (see the module docstring): entries not committed yet, each with the future its writers
        # wait for; the task committing them; the session and the lock that orders the feed's reads after the
        # journal's writes; the writes accepted so far and the last one's future.
        self._journal: list[tuple[list[Op], asyncio.Future[None]]] = []
        self._journal_task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._lock: asyncio.Lock | None = None
        self._accepted = 0
        self._last: asyncio.Future[None] | None = None
        self._group: list[Op] | None = None  # the writes of an open transaction()
        # Whether the session was lost (dropped after a failure, or ended by the server) and not made again
        # since: writes are then refused at once, before anything changes in memory.
        self._lost = False

    @classmethod
    async def open(cls, dsn: str, writer: str, timeout: float = 10.0) -> PgDefinitionsStore:
        """The store, its session open on the running loop: the schema migrated, the table read in one snapshot
        with the feed's version (each step bounded by ``timeout``). Raises what connecting or migrating raised
        (OSError, TimeoutError, asyncpg's errors, storage.pg.schema.SchemaTooNew)."""
        store = cls(dsn, writer, timeout)
        try:
            conn = await store._connection()
            await asyncio.wait_for(migrate(conn), timeout)
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                rows = await asyncio.wait_for(conn.fetch(_SNAPSHOT), timeout)
                version = await asyncio.wait_for(conn.fetchval(_LAST_VERSION), timeout)
        except BaseException:
            store.close()
            raise
        snapshot: dict[str, dict[str, Any]] = {}
        for r in rows:
            snapshot.setdefault(r["kind"], {})[r["key"]] = _unpack(r["value"])
        store._snapshot = snapshot
        store.version_at_open = int(version)
        return store

    def _write_error(self, exc: BaseException) -> MetadataWriteError:
        return MetadataWriteError(f"cannot write the cluster's definitions to PostgreSQL: {exc}")

    def _read_error(self, exc: BaseException) -> MetadataStoreError:
        return MetadataStoreError(f"cannot read the cluster's definitions from PostgreSQL: {exc}")

    # -- the session ------------------------------------------------------------------------------------------
    def _session_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._drop()
            self._conn = await asyncpg.connect(self.dsn, timeout=self.timeout)
            self.connects += 1
            self._lost = False
        return self._conn

    def _drop(self) -> None:
        """The session is lost as of now (a failure, or ended by the server): cut, made again by the next use."""
        self._lost = True
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    # -- writing -------------------------------------------------------------------------------------------
    def put(self, kind: str, key: str | tuple[str, ...], value: Any) -> None:
        self.write([("put", kind, key, value)])

    def delete(self, kind: str, key: str | tuple[str, ...]) -> bool:
        return self.write([("delete", kind, key, None)]) > 0

    def delete_prefix(self, kind: str, prefix: tuple[str, ...]) -> int:
        return self.write([("delete_prefix", kind, prefix, None)])

    def write(self, ops: list[Op]) -> int:
        """Accept ``ops`` into the journal (into the open :meth:`transaction`'s group, if any) and return at
        once; the count is the number of ops. Whoever answers after it waits for :meth:`committed`. On the
        broker's event loop only (the journal's task runs there)."""
        if self._group is None:
            self._refuse_if_lost()
            self._accept(ops)
        else:
            self._group.extend(ops)
        return len(ops)

    def apply(self, ops: list[Op]) -> None:
        """A recorded batch (a definitions import) in one transaction: :meth:`write` under its other name."""
        self.write(ops)

    async def _execute(self, ops: list[Op], conn: asyncpg.Connection) -> int:
        n = 0
        puts: dict[tuple[str, str], bytes] = {}  # a run of puts of distinct keys, written in one statement

        async def put_run() -> int:
            if not puts:
                return 0
            if len(puts) == 1:
                ((kind, key), value), = puts.items()
                status = await conn.execute(_PUT, kind, key, value, self.writer)
            else:
                kinds, keys = zip(*puts, strict=True)
                status = await conn.execute(_PUT_MANY, list(kinds), list(keys), list(puts.values()), self.writer)
            puts.clear()
            return int(status.rsplit(" ", 1)[-1])

        for action, kind, key, value in ops:
            if action == "put":
                row_key = (kind, _key(key))
                if row_key in puts:  # (one statement may not write a row twice; the order of versions kept)
                    n += await put_run()
                puts[row_key] = msgpack.packb(value, use_bin_type=True)
                continue
            n += await put_run()
            if action == "delete":
                status = await conn.execute(_DELETE, kind, _key(key), self.writer)
            else:
                status = await conn.execute(_DELETE_PREFIX, kind, SEP.join(key) + SEP, self.writer)
            n += int(status.rsplit(" ", 1)[-1])
        n += await put_run()
        if n:
            await conn.execute("SELECT pg_notify($1, '')", DEFINITIONS_BELL)
        return n

    @contextmanager
    def transaction(self, *, keep_on_error: bool = False) -> Iterator[None]:
        """Group writes into one entry of the journal (one commit), accepted when the outermost level ends;
        nests. ``keep_on_error`` accepts what was written before an exception, as the SQLite store commits it
        for an import."""
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

    # -- the journal -----------------------------------------------------------------------------------------
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
        """A write while the session to PostgreSQL is lost (the server went away, or did not answer) is refused
        at once (541): nothing changes in memory, so nothing is made that the cluster never learns of. The
        feed's next read (every poll) makes a new session when the server is back."""
        conn = self._conn
        if conn is not None and conn.is_closed():
            self._drop()  # ended by the server: lost as of now
        if self._lost:
            raise self._write_error(ConnectionError("the session to PostgreSQL is lost"))

    def _accept(self, ops: list[Op]) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._journal.append((ops, done))
        self._remember(ops)
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
                        async with self._session_lock():
                            await asyncio.wait_for(self._commit(ops), self.timeout)
                        break
                    except PG_FAILURES as exc:
                        if pause == RETRY_FIRST:
                            log.warning("cannot commit the cluster's definitions to PostgreSQL; retrying: %s", exc)
                        self._drop()
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, RETRY_MAX)
                self.commits += 1
                for _ops, done in batch:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._journal_task = None

    async def _commit(self, ops: list[Op]) -> None:
        conn = await self._connection()
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", DEFINITIONS_LOCK_CLASS, DEFINITIONS_LOCK_ID)
            await self._execute(ops, conn)

    # -- the feed ------------------------------------------------------------------------------------------
    async def changes_since(self, version: int, limit: int = 10_000) -> list[Change]:
        """The rows written after ``version``, oldest first (deletions with ``value`` None), at most ``limit``
        of them (ask again from the last one's version for more); read after the journal's writes so far, on
        its session, within ``timeout``. MetadataStoreError if PostgreSQL does not answer."""
        try:
            async with self._session_lock():
                conn = await asyncio.wait_for(self._connection(), self.timeout)
                rows = await asyncio.wait_for(conn.fetch(_CHANGES, version, limit), self.timeout)
        except PG_FAILURES as exc:
            self._drop()
            raise self._read_error(exc) from None
        return _changes(rows)

    # -- the recovery pass's reads (the snapshot of open()) ----------------------------------------------------
    def _read_snapshot(self) -> dict[str, dict[str, Any]]:
        if self._snapshot is None:
            raise MetadataStoreError("the cluster's definitions are read at start only (a running member follows "
                                     "their feed)")
        return self._snapshot

    def _remember(self, ops: list[Op]) -> None:
        """This member's writes as they are accepted, into the snapshot while there is one (a read after them
        sees them)."""
        snapshot = self._snapshot
        if snapshot is None:
            return
        for action, kind, key, value in ops:
            rows = snapshot.setdefault(kind, {})
            if action == "put":
                rows[_key(key)] = _unpack(msgpack.packb(value, use_bin_type=True))  # (as a read gives it)
            elif action == "delete":
                rows.pop(_key(key), None)
            else:
                prefix = SEP.join(key) + SEP
                for k in [k for k in rows if k.startswith(prefix)]:
                    del rows[k]

    def get(self, kind: str, key: str | tuple[str, ...]) -> Any | None:
        return self._read_snapshot().get(kind, {}).get(_key(key))

    def items(self, kind: str) -> list[tuple[Any, Any]]:
        rows = self._read_snapshot().get(kind, {})
        return [(_unkey(k), rows[k]) for k in sorted(rows)]  # (code point order: PostgreSQL's COLLATE "C")

    def kinds(self) -> list[str]:
        return sorted(kind for kind, rows in self._read_snapshot().items() if rows)

    def recovered(self) -> None:
        """The recovery pass is over and the member follows the feed: the snapshot goes (later reads refused)."""
        self._snapshot = None

    def close(self) -> None:
        """At the node's stop: the journal's task stops (what it has not committed is logged: lost) and the
        session is cut."""
        if self._journal_task is not None:
            if self._journal:
                log.warning("%d definitions writes not committed at close", len(self._journal))
            self._journal_task.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()
