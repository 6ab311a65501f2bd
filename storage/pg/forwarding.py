"""Node-local queues across a Leveret cluster, PostgreSQL side (docs/decisions/postgres-cluster.md; broker/clustering/cluster_forwarding.py is the
broker side): the *directory* of every member's own queues (classic, exclusive, server-named, streams) and
of their bindings from shared exchanges, and the *forward* table through which a message published on one
member reaches a queue that lives on another.

Tables (storage/pg/schema.py, migration 3; SCHEMA.md): ``leveret.local_queue``, ``leveret.local_binding``,
``leveret.forward``.

Two halves, both on the broker's event loop (nothing there waits for PostgreSQL: issue 34):

- :class:`PgDirectory` answers before the reply: a queue.declare-ok or queue.bind-ok is sent after the row is
  committed, so that a reply published on another member right after finds the queue. One connection, every
  call serialised on it in call order (a lock taken in that order). Its caller awaits the answer (a channel's
  method handled again once it is in, the HTTP API's handler: broker/topology.py "Answers that come later") or
  the ``committed`` seam of a bind (storage/commits.py); the loop serves everyone else meanwhile. Removals are
  fire-and-forget (a late removal costs at most a forwarded message that the owner drops), additions and
  look-ups are awaited (bounded by ``timeout``). After a failure the directory stays *unavailable* for
  ``retry_after`` seconds (calls raise at once rather than wait again), and the caller rewrites its rows when it
  is back (:meth:`PgDirectory.replace_own`).
- :class:`PgForwarding` is **asynchronous** too, with three connections of its own:
  the publisher (every message of an event-loop burst, whatever its target, in one INSERT … unnest(): one
  transaction per burst, never one per message; the confirms after it commits), the forwarder (this node's
  rows in batches: ``DELETE … RETURNING`` in a transaction, handed to the broker, which enqueues them locally
  and waits for its own stores, then commit) and the bell (LISTEN, and a debounced NOTIFY after each commit,
  at most one per target per 10 ms: docs/decisions/postgres-cluster.md), plus a 1 s poll.

Two more uses, neither needing a table of its own:

- *Questions between members* (:meth:`PgDirectory.ask`): NOTIFY ``leveret_figures_ask`` with a JSON payload
  naming the member asked, an id and the queues; every member LISTENs on its bell connection and the one asked
  answers on ``leveret_figures_reply`` (the broker's rows, JSON, in chunks under PostgreSQL's 8000-byte payload
  limit, the last marked); the asker LISTENs on its directory connection and awaits the answer, up to a
  timeout, and not at all for a member without a live node row. Lost notifications cost a timeout.
- *Requests through the forward table* (:meth:`PgDirectory.unbind_for`): a row for the owner whose ``queues``
  name a request rather than a queue (the broker's encoding in ``body``), durable and ordered with the messages
  forwarded before it; the caller gets a future done once the owner has taken it.

Messages and binding arguments are opaque bytes here: the broker encodes them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import asyncpg

from storage.pg.connections import CLOSE_TIMEOUT, PG_FAILURES, close_connection, stop_tasks

log = logging.getLogger("leveret.pg.forwarding")

T = TypeVar("T")

FORWARD_BELL = "leveret_forward"  # payload: the target node's name
DIRECTORY_BELL = "leveret_directory"  # payload: the node whose directory rows changed
# A member asking another about its node-local queues (figures, flags, arguments), and the answer: JSON payloads
# (PgDirectory.ask, PgForwarding's answer), broadcast and picked by the "to" field / the asker's id.
FIGURES_ASK = "leveret_figures_ask"
FIGURES_REPLY = "leveret_figures_reply"
PAYLOAD_MAX = 7000  # bytes of one NOTIFY payload we send (PostgreSQL's limit is 8000)
TAKE_BATCH = 500  # rows per forwarder transaction (docs/decisions/postgres-cluster.md: batches of 100-500)
POLL_INTERVAL = 1.0
DIRECTORY_POLL = 2.0
RING_EVERY = 0.01
REAP_EVERY = 5.0
CONNECT_TIMEOUT = 5.0

# A member counts as alive while it has a node row neither stopped nor reaped (storage/pg/cluster.py).
_LIVE = ("EXISTS (SELECT 1 FROM leveret.node n WHERE n.name = {t}.node AND n.dead_at IS NULL "
         "AND n.stopped_at IS NULL)")

# Take (vhost, name) for ``node`` unless another live member holds it (a non-durable queue of a member that
# is gone is stale: taken over). Returns the owner's row either way.
CLAIM = (
    "WITH ins AS (INSERT INTO leveret.local_queue AS q (vhost, name, node, durable, exclusive) "
    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (vhost, name) DO UPDATE SET node = EXCLUDED.node, "
    "durable = EXCLUDED.durable, exclusive = EXCLUDED.exclusive "
    "WHERE q.node = EXCLUDED.node OR (NOT q.durable AND NOT " + _LIVE.format(t="q") + ") "
    "RETURNING node, durable, exclusive) "
    "SELECT node, durable, exclusive, pg_notify('" + DIRECTORY_BELL + "', $3) FROM ins "
    "UNION ALL SELECT node, durable, exclusive, NULL FROM leveret.local_queue "
    "WHERE vhost = $1 AND name = $2 AND NOT EXISTS (SELECT 1 FROM ins)")
# CLAIM for many names of one vhost in one statement (a definitions import's slice): the rows taken, then the
# owners of those another live member holds. Names in sorted order: two members claiming overlapping sets take
# their row locks in the same order (no deadlock).
CLAIM_MANY = (
    "WITH want AS (SELECT * FROM unnest($2::text[], $4::bool[], $5::bool[]) AS w(name, durable, exclusive)), "
    "ins AS (INSERT INTO leveret.local_queue AS q (vhost, name, node, durable, exclusive) "
    "SELECT $1, w.name, $3, w.durable, w.exclusive FROM want w ORDER BY w.name "
    "ON CONFLICT (vhost, name) DO UPDATE SET node = EXCLUDED.node, "
    "durable = EXCLUDED.durable, exclusive = EXCLUDED.exclusive "
    "WHERE q.node = EXCLUDED.node OR (NOT q.durable AND NOT " + _LIVE.format(t="q") + ") "
    "RETURNING q.name, q.node, q.durable, q.exclusive) "
    "SELECT name, node, durable, exclusive, pg_notify('" + DIRECTORY_BELL + "', $3) FROM ins "
    "UNION ALL SELECT q.name, q.node, q.durable, q.exclusive, NULL FROM leveret.local_queue q "
    "JOIN want w ON q.name = w.name WHERE q.vhost = $1 AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.name = q.name)")
LOOKUP = "SELECT node, durable, exclusive FROM leveret.local_queue WHERE vhost = $1 AND name = $2"
RELEASE = ("WITH d AS (DELETE FROM leveret.local_queue WHERE vhost = $1 AND name = $2 AND node = $3 RETURNING 1) "
           "SELECT pg_notify('" + DIRECTORY_BELL + "', $3) FROM d")
BIND = ("WITH ins AS (INSERT INTO leveret.local_binding "
        "(vhost, source, queue, routing_key, args_hash, arguments, routing, node) "
        "SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE EXISTS (SELECT 1 FROM leveret.local_queue "
        "WHERE vhost = $1 AND name = $3 AND node = $8) "
        "ON CONFLICT (vhost, source, queue, routing_key, args_hash) DO UPDATE SET arguments = EXCLUDED.arguments, "
        "routing = EXCLUDED.routing, node = EXCLUDED.node RETURNING 1) "
        "SELECT pg_notify('" + DIRECTORY_BELL + "', $8) FROM ins")
# BIND for the rows of many bindings (those written while the directory's session was busy) in one statement.
BIND_MANY = (
    "WITH ins AS (INSERT INTO leveret.local_binding "
    "(vhost, source, queue, routing_key, args_hash, arguments, routing, node) "
    "SELECT r.vhost, r.source, r.queue, r.routing_key, r.args_hash, r.arguments, r.routing, $8 "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[]) "
    "AS r(vhost, source, queue, routing_key, args_hash, arguments, routing) "
    "WHERE EXISTS (SELECT 1 FROM leveret.local_queue q WHERE q.vhost = r.vhost AND q.name = r.queue AND q.node = $8) "
    "ON CONFLICT (vhost, source, queue, routing_key, args_hash) DO UPDATE SET arguments = EXCLUDED.arguments, "
    "routing = EXCLUDED.routing, node = EXCLUDED.node RETURNING 1) "
    "SELECT pg_notify('" + DIRECTORY_BELL + "', $8) FROM ins LIMIT 1")
UNBIND = ("WITH d AS (DELETE FROM leveret.local_binding WHERE vhost = $1 AND source = $2 AND queue = $3 "
          "AND routing_key = $4 AND args_hash = $5 AND node = $6 RETURNING 1) "
          "SELECT pg_notify('" + DIRECTORY_BELL + "', $6) FROM d LIMIT 1")
UNBIND_SOURCE = ("WITH d AS (DELETE FROM leveret.local_binding WHERE vhost = $1 AND source = $2 AND node = $3 "
                 "RETURNING 1) SELECT pg_notify('" + DIRECTORY_BELL + "', $3) FROM d LIMIT 1")
ALIVE = ("SELECT EXISTS (SELECT 1 FROM leveret.node n WHERE n.name = $1 AND n.dead_at IS NULL "
         "AND n.stopped_at IS NULL)")
# queue.unbind on a member that is not the queue's: the directory row goes at once (every member stops routing
# there), and the owner is asked, through the forward table (durable, ordered with what was forwarded to it
# before), to remove the binding from its exchange and its own store.
UNBIND_ANY = ("WITH d AS (DELETE FROM leveret.local_binding WHERE vhost = $1 AND source = $2 AND queue = $3 "
              "AND routing_key = $4 AND args_hash = $5 RETURNING 1) "
              "SELECT pg_notify('" + DIRECTORY_BELL + "', $6) FROM d LIMIT 1")
REQUEST = ("INSERT INTO leveret.forward (target, vhost, queues, persistent, body) VALUES ($1, $2, $3, true, $4) "
           "RETURNING id")
OTHERS_QUEUES = "SELECT vhost, name, node, durable, exclusive FROM leveret.local_queue WHERE node <> $1"
OTHERS_BINDINGS = ("SELECT vhost, source, queue, routing_key, arguments, routing, node FROM leveret.local_binding "
                   "WHERE node <> $1")
# Rows of queues that died with a member that is gone (crashed: no clean stop deleted them). Durable queues
# stay: they come back when their member does, and messages forwarded meanwhile wait for it.
REAP = ("WITH d AS (DELETE FROM leveret.local_queue q WHERE NOT q.durable AND NOT " + _LIVE.format(t="q") +
        " RETURNING 1) SELECT count(*) FROM (SELECT pg_notify('" + DIRECTORY_BELL + "', $1) FROM d) x")
# Messages no member will take: for a member that is gone and has no durable queue to come back with (a
# reply to a direct reply-to channel of a crashed member, a burst to its exclusive queues).
REAP_FORWARD = ("DELETE FROM leveret.forward f WHERE NOT EXISTS (SELECT 1 FROM leveret.node n WHERE n.name = "
                "f.target AND n.dead_at IS NULL AND n.stopped_at IS NULL) AND NOT EXISTS (SELECT 1 FROM "
                "leveret.local_queue q WHERE q.node = f.target AND q.durable)")
# Messages forwarded to each other live member that it has not taken yet: how far behind its owner is (the
# publishers' members pause publishers to its queues above a mark, broker/clustering/cluster_forwarding.py). A member
# that is gone, stopped or past its lease is not counted: its messages wait for it without holding anyone up.
OWNER_LAG = ("SELECT f.target, count(*) FROM leveret.forward f WHERE f.target <> $1 AND EXISTS (SELECT 1 FROM "
             "leveret.node n WHERE n.name = f.target AND n.dead_at IS NULL AND n.stopped_at IS NULL AND "
             "n.lease_until > now()) GROUP BY f.target")
INSERT = (
    "INSERT INTO leveret.forward (target, vhost, queues, persistent, body) "
    "SELECT t, v, ARRAY(SELECT jsonb_array_elements_text(q::jsonb)), p, b "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[], $5::bytea[]) WITH ORDINALITY AS x(t, v, q, p, b, n) "
    "ORDER BY n")
TAKE = ("DELETE FROM leveret.forward WHERE id IN (SELECT id FROM leveret.forward WHERE target = $1 "
        "ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING id, vhost, queues, persistent, body")


class DirectoryUnavailable(Exception):
    """PostgreSQL did not answer the directory (or did not recently): the caller goes on locally."""


class Owner(NamedTuple):
    node: str
    durable: bool
    exclusive: bool


class QueueRow(NamedTuple):
    vhost: str
    name: str
    node: str
    durable: bool
    exclusive: bool


class BindingRow(NamedTuple):
    vhost: str
    source: str
    queue: str
    routing_key: str
    arguments: bytes
    routing: str
    node: str


class Forwarded(NamedTuple):
    """One row taken by the forwarder: a message for ``queues`` of ``vhost`` on this node."""

    id: int
    vhost: str
    queues: list[str]
    persistent: bool
    body: bytes


class PgDirectory:
    """This node's rows of the directory, on the broker's event loop (see the module docstring)."""

    def __init__(self, dsn: str, node: str, timeout: float = 3.0, retry_after: float = 10.0) -> None:
        self.dsn = dsn
        self.node = node
        self.timeout = timeout
        self.retry_after = retry_after
        self.down_until = 0.0
        self.failed = False  # a write was lost: the owner rewrites its rows when PostgreSQL is back
        self._conn: asyncpg.Connection | None = None
        self._lock: asyncio.Lock | None = None
        # Calls started without the caller waiting for them here (_later, bind, the ones being awaited), held
        # until done (the loop keeps only a weak reference to a task).
        self._calls: set[asyncio.Task[Any]] = set()
        # Questions to other members waiting for their answer (ask): id -> (done, rows gathered so far).
        self._asks: dict[str, tuple[asyncio.Future[None], list[Any]]] = {}
        self._ask_n = 0
        # Binding rows written without the caller waiting (bind): how many so far, the last one's call; the
        # reply (queue.bind-ok) waits for it through the storage/commits.py seam (committed).
        self._accepted = 0
        self._last: asyncio.Task[Any] | None = None
        # Calls submitted so far, and the binding rows of the last one if it is a write of binding rows that has
        # not started yet: a bind made while nothing was submitted after it joins it (one statement, one commit,
        # for the bindings of a definitions import or a burst of queue.binds; never reordered past another call).
        self._submitted = 0
        self._binds: list[tuple[str, str, str, str, str, bytes, str]] | None = None
        self._binds_after = -1

    # -- one session, one call at a time ---------------------------------------------------------------------
    async def _call(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(self.dsn, timeout=self.timeout)
                    await self._conn.add_listener(FIGURES_REPLY, self._answered)
                return await fn(self._conn)
            except BaseException:
                if self._conn is not None and not self._conn.is_closed():
                    self._conn.terminate()
                self._conn = None
                raise

    @property
    def available(self) -> bool:
        """False for ``retry_after`` seconds after a call failed: calls then raise DirectoryUnavailable at once."""
        return time.monotonic() >= self.down_until

    def _submit(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], force: bool = False) -> asyncio.Task[T]:
        """Start a call now (in call order with every other call: the session's lock is taken in that order),
        without waiting for it."""
        if not force and time.monotonic() < self.down_until:
            raise DirectoryUnavailable("the cluster's PostgreSQL did not answer recently")
        task = asyncio.get_running_loop().create_task(self._call(fn))
        self._submitted += 1
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return task

    async def _result(self, task: asyncio.Task[T]) -> T:
        """The call's answer, waited for at most ``timeout`` (it is cancelled then, its session cut); the loop
        serves everyone else meanwhile. DirectoryUnavailable if it failed or did not answer."""
        try:
            return await asyncio.wait_for(task, self.timeout)
        except PG_FAILURES as exc:  # TimeoutError among them
            raise self._unavailable(exc) from None

    async def _wait(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], force: bool = False) -> T:
        """A call started now and waited for (:meth:`_result`)."""
        return await self._result(self._submit(fn, force))

    def _unavailable(self, exc: BaseException) -> DirectoryUnavailable:
        """What a call that failed (``exc``), or did not answer in time (TimeoutError), means to its caller; the
        directory counts as down for a while either way."""
        self._down()
        if isinstance(exc, TimeoutError):
            return DirectoryUnavailable(f"PostgreSQL did not answer within {self.timeout:g} s")
        return DirectoryUnavailable(str(exc))

    def _later(self, fn: Callable[[asyncpg.Connection], Awaitable[Any]]) -> None:
        """Fire and forget, in order after every call made before it."""
        if time.monotonic() < self.down_until:
            self.failed = True
            return
        self._submit(fn).add_done_callback(self._later_done)

    def _later_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("directory write failed: %s", task.exception())
            self._down()

    def _down(self) -> None:
        self.failed = True
        self.down_until = time.monotonic() + self.retry_after

    # -- queues --------------------------------------------------------------------------------------------
    async def claim(self, vhost: str, name: str, durable: bool, exclusive: bool) -> Owner | None:
        """Record the queue as this node's; None if it is (now) ours, else the member that holds it. Started
        now (in call order with the other directory calls), answered within ``timeout`` or DirectoryUnavailable."""

        async def run(conn: asyncpg.Connection) -> Owner | None:
            for _ in range(3):
                row = await conn.fetchrow(CLAIM, vhost, name, self.node, durable, exclusive)
                if row is not None:
                    return None if row[0] == self.node else Owner(row[0], row[1], row[2])
            return None  # claimed and released under us three times: go on as ours

        return await self._wait(run)

    async def claim_many(self, vhost: str, queues: Sequence[tuple[str, bool, bool]]) -> dict[str, Owner | None]:
        """:meth:`claim` for many ``(name, durable, exclusive)`` of ``vhost`` in one statement (one commit): by
        name, None (ours now) or the Owner that holds it. A definitions import claims a slice of its queues so
        (broker/definitions.py), instead of one committed round trip per queue."""
        wanted = sorted({name: (durable, exclusive) for name, durable, exclusive in queues}.items())

        async def run(conn: asyncpg.Connection) -> dict[str, Owner | None]:
            answers: dict[str, Owner | None] = {}
            todo = wanted
            for _ in range(3):
                rows = await conn.fetch(CLAIM_MANY, vhost, [n for n, _ in todo], self.node,
                                        [d for _, (d, _e) in todo], [e for _, (_d, e) in todo])
                for name, node, durable, exclusive, _bell in rows:
                    answers[name] = None if node == self.node else Owner(node, durable, exclusive)
                todo = [item for item in todo if item[0] not in answers]
                if not todo:
                    break
            for name, _ in todo:
                answers[name] = None  # claimed and released under us three times: ours, as claim() says
            return answers

        return await self._wait(run)

    async def lookup(self, vhost: str, name: str) -> Owner | None:
        """The member whose node-local queue ``name`` is (None: nobody's), within ``timeout``."""

        async def run(conn: asyncpg.Connection) -> Owner | None:
            row = await conn.fetchrow(LOOKUP, vhost, name)
            return None if row is None else Owner(row[0], row[1], row[2])

        return await self._wait(run)

    def release(self, vhost: str, name: str) -> None:
        self._later(lambda conn: conn.execute(RELEASE, vhost, name, self.node))

    # -- bindings ------------------------------------------------------------------------------------------
    def bind(self, vhost: str, source: str, queue: str, routing_key: str, args_hash: str, arguments: bytes,
             routing: str) -> None:
        """Write the binding's row, in call order, without waiting: the caller's reply waits for
        :meth:`committed` (the event loop serves others meanwhile). A row that could not be written makes
        the directory unavailable for a while and is rewritten when PostgreSQL is back (replace_own)."""
        row = (vhost, source, queue, routing_key, args_hash, arguments, routing)
        if self._binds is not None and self._binds_after == self._submitted:
            self._binds.append(row)  # the write submitted last has not started: in its statement
            self._accepted += 1
            return
        rows = [row]
        task = self._submit(lambda conn: self._write_bindings(conn, rows))
        self._binds, self._binds_after = rows, self._submitted
        task.add_done_callback(self._later_done)
        self._accepted += 1
        self._last = task

    async def _write_bindings(self, conn: asyncpg.Connection,
                              rows: list[tuple[str, str, str, str, str, bytes, str]]) -> None:
        """The binding rows :meth:`bind` gathered, in one statement (the last row of a key wins, as it would
        have one statement at a time)."""
        if self._binds is rows:
            self._binds = None  # started: a later bind is a write of its own
        if len(rows) == 1:
            await conn.execute(BIND, *rows[0], self.node)
            return
        last = list({row[:5]: row for row in rows}.values())
        await conn.execute(BIND_MANY, *(list(column) for column in zip(*last, strict=True)), self.node)

    @property
    def accepted(self) -> int:
        """Rows written without waiting so far (storage/commits.py)."""
        return self._accepted

    def committed(self) -> asyncio.Future[None] | None:
        """storage/commits.py: None if the rows written so far are in; else a future done when they are, or
        failed, or after ``timeout`` (the row is then rewritten when PostgreSQL is back, as before: a bind-ok
        never waits longer, and never fails, for the directory)."""
        last = self._last
        if last is None or last.done():
            return None
        return asyncio.ensure_future(self._settled(last))

    async def _settled(self, task: asyncio.Task[Any]) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(task), self.timeout)
        except Exception:  # noqa: BLE001 (logged and marked by _later_done; the reply goes on)
            return

    async def has_binding(self, vhost: str, source: str, queue: str, routing_key: str, args_hash: str) -> bool:
        """Whether the binding's row is there, within ``timeout``."""

        async def run(conn: asyncpg.Connection) -> bool:
            return bool(await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM leveret.local_binding WHERE vhost = $1 AND source = $2 "
                "AND queue = $3 AND routing_key = $4 AND args_hash = $5)", vhost, source, queue, routing_key,
                args_hash))

        return await self._wait(run)

    def unbind(self, vhost: str, source: str, queue: str, routing_key: str, args_hash: str) -> None:
        self._later(lambda conn: conn.execute(UNBIND, vhost, source, queue, routing_key, args_hash, self.node))

    def unbind_source(self, vhost: str, source: str) -> None:
        self._later(lambda conn: conn.execute(UNBIND_SOURCE, vhost, source, self.node))

    def unbind_for(self, owner: str, vhost: str, source: str, queue: str, routing_key: str, args_hash: str,
                   request_queues: list[str], request: bytes, wait: float = 2.0,
                   committed: Callable[[], None] | None = None) -> asyncio.Future[bool]:
        """queue.unbind of ``owner``'s queue, asked on this member: its directory row goes, and ``request``
        (the broker's encoding of the unbind) is forwarded to ``owner`` as a row for ``request_queues``, in one
        transaction started now (in call order with the other directory calls). Returns a future that is True
        once ``owner`` has taken (and so carried out) the request, False if it is not alive or has not within
        ``wait`` seconds; it raises DirectoryUnavailable if the transaction failed (raised at once if
        PostgreSQL did not answer recently). ``committed()`` is called as soon as the transaction has committed
        (a read of the directory started after it no longer has the row). The waiting for the owner is a poll
        of short calls, the directory free for others in between."""

        async def write(conn: asyncpg.Connection) -> tuple[int, bool]:
            async with conn.transaction():
                await conn.execute(UNBIND_ANY, vhost, source, queue, routing_key, args_hash, self.node)
                fid = await conn.fetchval(REQUEST, owner, vhost, request_queues, request)
                await conn.execute("SELECT pg_notify($1, $2)", FORWARD_BELL, owner)
                alive = await conn.fetchval(ALIVE, owner)
            return int(fid), bool(alive)

        written = self._submit(write)
        return asyncio.ensure_future(self._taken(written, wait, committed))

    async def _taken(self, written: asyncio.Task[tuple[int, bool]], wait: float,
                     committed: Callable[[], None] | None = None) -> bool:
        """Until the request row ``written`` is gone from the forward table (the owner took it): True; False
        if its owner is not alive or after ``wait`` seconds, or if PostgreSQL stops answering meanwhile (the
        request is committed: the owner carries it out whenever it takes it)."""
        fid, alive = await self._result(written)
        if committed is not None:
            committed()
        if not alive:
            return False
        deadline = time.monotonic() + wait
        pause = 0.003
        while time.monotonic() < deadline:
            try:
                exists = await self._wait(lambda conn: conn.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM leveret.forward WHERE id = $1)", fid))
            except DirectoryUnavailable:
                return False
            if not exists:
                return True
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.05)
        return False

    # -- questions to other members --------------------------------------------------------------------------
    async def ask(self, owner: str, vhost: str | None, names: list[str] | None,
                  timeout: float = 1.0) -> list[Any] | None:
        """What ``owner`` says of its queues ``names`` of ``vhost`` (every queue of it, or of every vhost with
        ``vhost`` None, when ``names`` is None): the rows its broker answers, None if it did not answer within
        ``timeout`` (or is not a live member, or PostgreSQL did not answer the question within the directory's
        own timeout)."""
        if time.monotonic() < self.down_until:
            return None
        try:
            return await asyncio.wait_for(self._ask(owner, vhost, names, timeout), timeout + self.timeout)
        except TimeoutError:
            return None

    async def _ask(self, owner: str, vhost: str | None, names: list[str] | None, timeout: float) -> list[Any] | None:
        self._ask_n += 1
        ask_id = f"{self._ask_n}@{self.node}"
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        rows: list[Any] = []
        payload = json.dumps({"to": owner, "id": ask_id, "vhost": vhost, "names": names})
        if len(payload.encode()) > PAYLOAD_MAX:  # too many names for one question: ask for the whole vhost
            payload = json.dumps({"to": owner, "id": ask_id, "vhost": vhost, "names": None})
        self._asks[ask_id] = (done, rows)
        try:
            async def send(conn: asyncpg.Connection) -> bool:
                if not await conn.fetchval(ALIVE, owner):
                    return False
                await conn.execute("SELECT pg_notify($1, $2)", FIGURES_ASK, payload)
                return True

            if not await self._call(send):
                return None
            await asyncio.wait_for(done, timeout)
            return rows
        except PG_FAILURES:
            return None
        finally:
            self._asks.pop(ask_id, None)

    def _answered(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        try:
            msg = json.loads(payload)
            waiting = self._asks.get(msg["id"])
        except (ValueError, KeyError, TypeError):
            return
        if waiting is None:
            return  # another member's question, or one given up on
        done, rows = waiting
        rows.extend(msg.get("rows") or ())
        if msg.get("last") and not done.done():
            done.set_result(None)

    # -- whole sets ----------------------------------------------------------------------------------------
    async def replace_own(self, queues: Sequence[tuple[str, str, bool, bool]],
                          bindings: Sequence[tuple[str, str, str, str, str, bytes, str]],
                          force: bool = True) -> list[tuple[str, str, str]]:
        """This node's rows become exactly ``queues`` (vhost, name, durable, exclusive) and ``bindings``
        (vhost, source, queue, routing_key, args_hash, arguments, routing), in one transaction: at start
        (its non-durable queues died with the last process) and after PostgreSQL was out of reach. A name
        another member holds stays theirs: returned as (vhost, name, that member), for the caller to say
        (a queue this member recovered that the rest of the cluster does not reach: it was declared elsewhere
        while this member was forgotten, or out of reach)."""

        async def run(conn: asyncpg.Connection) -> list[tuple[str, str, str]]:
            taken: list[tuple[str, str, str]] = []
            async with conn.transaction():
                await conn.execute("DELETE FROM leveret.local_queue WHERE node = $1", self.node)
                for vhost, name, durable, exclusive in queues:
                    owner = await conn.fetchval(
                        "WITH ins AS (INSERT INTO leveret.local_queue (vhost, name, node, durable, exclusive) "
                        "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (vhost, name) DO NOTHING RETURNING node) "
                        "SELECT node FROM ins UNION ALL SELECT node FROM leveret.local_queue "
                        "WHERE vhost = $1 AND name = $2 AND NOT EXISTS (SELECT 1 FROM ins)",
                        vhost, name, self.node, durable, exclusive)
                    if owner is not None and owner != self.node:
                        taken.append((vhost, name, owner))
                if bindings:
                    await conn.executemany(BIND, [(*b, self.node) for b in bindings])
                await conn.execute("SELECT pg_notify($1, $2)", DIRECTORY_BELL, self.node)
            return taken

        taken = await self._wait(run, force=force)
        self.failed = False
        self.down_until = 0.0
        return taken

    async def drop_transient_own(self) -> None:
        """A clean stop: this node's non-durable queues end with it (its durable ones come back)."""
        await self._wait(lambda conn: conn.execute(
            "WITH d AS (DELETE FROM leveret.local_queue WHERE node = $1 AND NOT durable RETURNING 1) "
            "SELECT pg_notify($2, $1) FROM d LIMIT 1", self.node, DIRECTORY_BELL))

    async def close(self) -> None:
        """The calls still on their way are cut (a stop), and the session closed."""
        await stop_tasks(*self._calls, timeout=CLOSE_TIMEOUT)
        await close_connection(self._conn)
        self._conn = None


class _Pending:
    __slots__ = ("confirms", "msg", "persistent", "queues", "target", "vhost")

    def __init__(self, target: str, vhost: str, queue: str, msg: Any, persistent: bool, confirm: Any) -> None:
        self.target = target
        self.vhost = vhost
        self.queues = [queue]
        self.msg = msg
        self.persistent = persistent
        self.confirms = [] if confirm is None else [confirm]


class PgForwarding:
    """The forward table from this node: publishing to other members, taking what they forwarded here,
    and the bells (see the module docstring).

    ``encode(msg) -> bytes`` is applied at the insert. ``on_confirm(confirms, ok)`` gets the confirm objects
    of a burst once its INSERT committed (ok) or failed. ``deliver(rows)`` puts a batch taken for this node
    into its queues at once (batches in order) and returns an awaitable (or None) done when the queues have
    stored it; the batch's DELETE commits then (if it raises, the rows stay and are taken again).
    ``on_directory()`` is called when another member's directory rows changed. ``on_lag()`` is called when
    :meth:`refresh_owner_lag` has read :attr:`owner_lag` again.

    Taking is two batches deep, on two connections: while one batch waits for the local stores and its
    commit, the next is taken (its rows are past the first's, which are locked: SKIP LOCKED) and delivered
    after it. A batch that fails goes back and comes again after later ones (at least once, ordered unless
    something failed)."""

    def __init__(self, dsn: str, node: str, encode: Callable[[Any], bytes],
                 on_confirm: Callable[[list[Any], bool], None],
                 deliver: Callable[[list[Forwarded]], Awaitable[None] | None],
                 on_directory: Callable[[], None],
                 on_ask: Callable[[str | None, list[str] | None], list[Any]] | None = None,
                 on_lag: Callable[[], None] | None = None) -> None:
        self.dsn = dsn
        self.on_ask = on_ask
        self.on_lag = on_lag
        self._lag_task: asyncio.Task[None] | None = None
        self.node = node
        self.encode = encode
        self.on_confirm = on_confirm
        self.deliver = deliver
        self.on_directory = on_directory
        self.loop = asyncio.get_running_loop()
        self.pending: list[_Pending] = []
        self.inflight = 0  # messages in the INSERT being committed
        # Rows waiting in the forward table for each other live member: OWNER_LAG's count, read once per poll,
        # plus what this member committed since.
        self.owner_lag: dict[str, int] = {}
        self._committed_since_read: dict[str, int] | None = None  # per target, while read_owner_lag's count runs
        self.inserted = 0  # rows committed by this node's publisher (tests, bench)
        self.taken = 0  # rows this node's forwarder took and delivered
        self.inserts = 0  # INSERT statements (one per burst)
        self._pub_conn: asyncpg.Connection | None = None
        self._take_conns: list[asyncpg.Connection | None] = [None, None]
        self._finishing: list[asyncio.Task[None] | None] = [None, None]
        self._bell_conn: asyncpg.Connection | None = None
        self._bell_lock = asyncio.Lock()
        self._pub_wake = asyncio.Event()
        self._take_wake = asyncio.Event()
        self._scheduled = False
        self._rings: set[str] = set()
        self._ring_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        self._pub_conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        await self._connect_bell()
        for coro in (self._publish_loop(), self._take_loop(), self._poll_loop()):
            self._tasks.append(self.loop.create_task(coro))

    async def _connect_bell(self) -> None:
        self._bell_conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        await self._bell_conn.add_listener(FORWARD_BELL, self._bell)
        await self._bell_conn.add_listener(DIRECTORY_BELL, self._bell)
        if self.on_ask is not None:
            await self._bell_conn.add_listener(FIGURES_ASK, self._bell)

    def _bell(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if channel == FIGURES_ASK:
            self._asked(payload)
        elif channel == FORWARD_BELL:
            if payload == self.node:
                self._take_wake.set()
        elif payload != self.node:
            self.on_directory()

    # -- answering other members' questions about this node's queues (PgDirectory.ask) --------------------
    def _asked(self, payload: str) -> None:
        try:
            msg = json.loads(payload)
            if msg.get("to") != self.node or self.on_ask is None:
                return
            ask_id, vhost, names = str(msg["id"]), msg.get("vhost"), msg.get("names")
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        rows = self.on_ask(vhost, names)
        payloads: list[str] = []
        chunk: list[Any] = []
        size = 0
        for row in rows:
            text = json.dumps(row)
            if chunk and size + len(text) > PAYLOAD_MAX - 200:
                payloads.append(json.dumps({"id": ask_id, "rows": chunk}))
                chunk, size = [], 0
            if len(text) > PAYLOAD_MAX - 200:
                continue  # a queue whose answer cannot travel in one notification (huge arguments): left out
            chunk.append(row)
            size += len(text) + 2
        payloads.append(json.dumps({"id": ask_id, "rows": chunk, "last": True}))
        self._tasks.append(self.loop.create_task(self._answer(payloads)))

    async def _answer(self, payloads: list[str]) -> None:
        try:
            async with self._bell_lock:
                if self._bell_conn is not None and not self._bell_conn.is_closed():
                    await self._bell_conn.execute(
                        "SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS x(p, n) ORDER BY n",
                        FIGURES_REPLY, payloads)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the asker gives up after its timeout)
            log.warning("answering another member's question failed: %s", exc)
        finally:
            task = asyncio.current_task()
            if task in self._tasks:
                self._tasks.remove(task)

    # -- publishing ------------------------------------------------------------------------------------------
    def add(self, target: str, vhost: str, queue: str, msg: Any, persistent: bool, confirm: Any = None) -> None:
        """Forward ``msg`` to ``queue`` of ``vhost`` on ``target``. The same message for several queues of one
        target, one after the other (a fan-out), is one row."""
        pending = self.pending
        if pending:
            last = pending[-1]
            if last.msg is msg and last.target == target and last.vhost == vhost and queue not in last.queues:
                last.queues.append(queue)
                last.persistent = last.persistent or persistent
                if confirm is not None:
                    last.confirms.append(confirm)
                return
        pending.append(_Pending(target, vhost, queue, msg, persistent, confirm))
        self._idle.clear()
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._ring_publisher)

    def _ring_publisher(self) -> None:
        self._scheduled = False
        self._pub_wake.set()

    @property
    def backlog(self) -> int:
        """Messages not committed yet (credit flow)."""
        return len(self.pending) + self.inflight

    async def _publish_loop(self) -> None:
        while True:
            await self._pub_wake.wait()
            self._pub_wake.clear()
            while self.pending:
                await self._publish_step()
            if not self.pending:
                self._idle.set()

    async def _publish_step(self) -> None:
        rows, self.pending = self.pending, []
        self.inflight = len(rows)
        confirms = [c for r in rows for c in r.confirms]
        ok = False
        try:
            if self._pub_conn is None or self._pub_conn.is_closed():
                self._pub_conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
            encode = self.encode
            await self._pub_conn.execute(
                INSERT, [r.target for r in rows], [r.vhost for r in rows],
                [json.dumps(r.queues) for r in rows], [r.persistent for r in rows],
                [encode(r.msg) for r in rows])
            ok = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (logged; the next round retries)
            log.warning("forwarding %d messages failed (their publishers are nacked): %s", len(rows), exc)
            if self._pub_conn is not None and not self._pub_conn.is_closed():
                self._pub_conn.terminate()
            self._pub_conn = None
        finally:
            self.inflight = 0
        if ok:
            self.inserted += len(rows)
            self.inserts += 1
            lag = self.owner_lag
            since = self._committed_since_read
            for r in rows:  # counted at once: the poll's read corrects it as the owners take their rows
                lag[r.target] = lag.get(r.target, 0) + 1
                if since is not None:
                    since[r.target] = since.get(r.target, 0) + 1
            self.ring({r.target for r in rows})
        if confirms:
            self.on_confirm(confirms, ok)

    async def flushed(self) -> None:
        """Until every message added so far is committed (or failed)."""
        await self._idle.wait()

    # -- the doorbell ----------------------------------------------------------------------------------------
    def ring(self, targets: set[str]) -> None:
        self._rings |= targets
        if self._ring_task is None and not self._closing:
            self._ring_task = self.loop.create_task(self._ring_soon())

    async def _ring_soon(self) -> None:
        try:
            while self._rings:
                targets, self._rings = sorted(self._rings), set()
                async with self._bell_lock:
                    if self._bell_conn is not None and not self._bell_conn.is_closed():
                        await self._bell_conn.execute("SELECT pg_notify($1, t) FROM unnest($2::text[]) t",
                                                      FORWARD_BELL, targets)
                await asyncio.sleep(RING_EVERY)
        except asyncio.CancelledError:
            raise
        except Exception:  # the target's 1 s poll still finds the rows
            log.warning("forward doorbell failed", exc_info=True)
        finally:
            self._ring_task = None

    # -- taking what others forwarded here ------------------------------------------------------------------
    async def _take_loop(self) -> None:
        slot = 0
        while True:
            try:
                await asyncio.wait_for(self._take_wake.wait(), POLL_INTERVAL)
            except TimeoutError:
                pass
            self._take_wake.clear()
            try:
                while True:
                    n = await self._take(slot)
                    slot ^= 1
                    if n < TAKE_BATCH:
                        break
                for i in (0, 1):  # idle: the last batches committed before waiting for the bell
                    await self._finished(i)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (logged; the next round retries)
                log.warning("taking forwarded messages failed (retried): %s", exc)
                for i in (0, 1):
                    conn = self._take_conns[i]
                    if conn is not None and not conn.is_closed():
                        conn.terminate()
                    self._take_conns[i] = None
                    self._finishing[i] = None
                await asyncio.sleep(0.5)

    async def _finished(self, slot: int) -> None:
        """Until the batch on ``slot``'s connection is committed (raises if it failed)."""
        task = self._finishing[slot]
        if task is not None:
            self._finishing[slot] = None
            await task

    async def _take(self, slot: int) -> int:
        """Take one batch on connection ``slot`` (its previous batch committed first) and deliver it; its
        commit waits for the local stores in a task of its own. Returns how many rows."""
        await self._finished(slot)
        conn = self._take_conns[slot]
        if conn is None or conn.is_closed():
            conn = self._take_conns[slot] = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        tr = conn.transaction()
        await tr.start()
        try:
            records = await conn.fetch(TAKE, self.node, TAKE_BATCH)
            if not records:
                await tr.rollback()
                return 0
            rows = sorted((Forwarded(r[0], r[1], list(r[2]), r[3], r[4]) for r in records), key=lambda f: f.id)
            stored = self.deliver(rows)
        except BaseException:
            if not conn.is_closed():
                await tr.rollback()
            raise
        self._finishing[slot] = self.loop.create_task(self._commit(conn, tr, stored, len(rows)))
        return len(rows)

    async def _commit(self, conn: asyncpg.Connection, tr: Any, stored: Awaitable[None] | None, n: int) -> None:
        try:
            if stored is not None:
                await stored
            await tr.commit()
        except BaseException:
            if not conn.is_closed():
                try:
                    await tr.rollback()
                except Exception:  # noqa: BLE001 (the connection is dropped by the caller)
                    conn.terminate()
            raise
        self.taken += n

    async def take_once(self) -> int:
        """One batch taken, delivered and committed (tests); returns how many rows."""
        n = await self._take(0)
        await self._finished(0)
        return n

    # -- the directory, as other members wrote it ---------------------------------------------------------
    async def others(self) -> tuple[list[QueueRow], list[BindingRow]]:
        """Every other member's queue and binding rows."""
        async with self._bell_lock:
            conn = self._bell_conn
            if conn is None or conn.is_closed():
                await self._connect_bell()
                conn = self._bell_conn
            assert conn is not None
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                queues = [QueueRow(*r) for r in await conn.fetch(OTHERS_QUEUES, self.node)]
                bindings = [BindingRow(*r) for r in await conn.fetch(OTHERS_BINDINGS, self.node)]
        return queues, bindings

    async def namesakes(self) -> int:
        """Other live node rows with this node's name (another process, or this node's last one not reaped yet)."""
        async with self._bell_lock:
            assert self._bell_conn is not None
            return int(await self._bell_conn.fetchval(
                "SELECT count(*) - 1 FROM leveret.node WHERE name = $1 AND dead_at IS NULL AND stopped_at IS NULL",
                self.node))

    async def reap(self) -> int:
        """Drop the rows of non-durable queues of members that are gone, and the messages forwarded to members
        that are gone for good (no durable queue to come back with); returns how many queue rows."""
        async with self._bell_lock:
            if self._bell_conn is None or self._bell_conn.is_closed():
                return 0
            n = int(await self._bell_conn.fetchval(REAP, self.node))
            status = await self._bell_conn.execute(REAP_FORWARD)
        if status.split()[-1] != "0":
            log.info("dropped %s forwarded messages for members that are gone", status.split()[-1])
        if n:
            log.info("dropped %d directory rows of queues whose members are gone", n)
        return n

    async def read_owner_lag(self) -> dict[str, int]:
        """Refresh :attr:`owner_lag` (one grouped count; the rows counted are bounded by the publishers'
        pause at the mark)."""
        async with self._bell_lock:
            if self._bell_conn is None or self._bell_conn.is_closed():
                return self.owner_lag
            since: dict[str, int] = {}
            self._committed_since_read = since
            try:
                rows = await self._bell_conn.fetch(OWNER_LAG, self.node)
            finally:
                self._committed_since_read = None
        # Rows committed while the count ran may be missing from it: add them (a row the count did see is
        # then counted twice until the next read, which errs on the side of pausing).
        lag = {r[0]: int(r[1]) for r in rows}
        for target, n in since.items():
            lag[target] = lag.get(target, 0) + n
        self.owner_lag = lag
        return lag

    def refresh_owner_lag(self) -> None:
        """Read :attr:`owner_lag` now rather than at the next poll, then call ``on_lag`` (one read at a time).

        Between two reads the lag only grows (each commit adds its rows; what the owners took shows at the next
        read), so a publisher that crossed the mark on that estimate would otherwise wait for the poll
        (:data:`DIRECTORY_POLL`): with owners keeping up, that capped forwarding at about the mark's worth of
        messages per poll interval (20,000 per 2 s: the 10k msg/s bench/RESULTS.md reported)."""
        if self._lag_task is None and not self._closing:
            self._lag_task = self.loop.create_task(self._refresh_owner_lag())

    async def _refresh_owner_lag(self) -> None:
        try:
            await self.read_owner_lag()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the poll reads it again; paused publishers wait for that)
            log.warning("reading the owners' lag failed: %s", exc)
        finally:
            self._lag_task = None
        if self.on_lag is not None:
            self.on_lag()

    async def _poll_loop(self) -> None:
        last_reap = time.monotonic()
        while True:
            await asyncio.sleep(DIRECTORY_POLL)
            try:
                if time.monotonic() - last_reap >= REAP_EVERY:
                    last_reap = time.monotonic()
                    await self.reap()
                await self.read_owner_lag()
                self.on_directory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (logged; the next round retries)
                log.warning("directory poll failed: %s", exc)
                async with self._bell_lock:
                    if self._bell_conn is not None and not self._bell_conn.is_closed():
                        self._bell_conn.terminate()
                    self._bell_conn = None

    async def close(self) -> None:
        self._closing = True
        if self.pending or self.inflight:
            try:
                await asyncio.wait_for(self._idle.wait(), 5)
            except TimeoutError:
                pass
        tasks = [*self._tasks, *(t for t in (self._ring_task, self._lag_task, *self._finishing) if t is not None)]
        await stop_tasks(*tasks)  # (re-cancelled while running: a cancel wait_for swallowed would hang the stop)
        for conn in (self._pub_conn, *self._take_conns, self._bell_conn):
            if conn is not None and not conn.is_closed():
                try:
                    await asyncio.wait_for(conn.close(), 2)
                except Exception:  # noqa: BLE001 (closing anyway)
                    conn.terminate()
