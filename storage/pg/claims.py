"""Named claims a cluster member holds in PostgreSQL: a session-level advisory lock per name, on one
connection of the member's own (broker/shovel/placement.py: a dynamic shovel runs on the member that holds
its claim).

``pg_try_advisory_lock(CLAIM_CLASS, hashtext(name))`` never waits: a claim held by another member's session
answers False at once, and is free again the moment that session ends (the member exited, was killed, or its
connection broke), so the next member to ask takes it. Two names whose hashes collide share one lock: the
member holding it runs both, which is still one member each. The locks are per database, so clusters on one
server do not meet.

The session also holds the member's epoch key (``session_key``: LEASE_KEY and the epoch, in shared mode, as
every session of the member does, storage/pg/cluster.py). A member that hangs (SIGSTOP, a stalled VM) keeps its
TCP connections open: without the key its claims would outlive its lease and no other member would ever take
its shovels. With it, the peer that finds the member's lease expired ends this session with the member's
others (cluster.py's HOLDERS), and the claims are free for the next member that asks.

The member running shovels also writes their status objects (:meth:`report`, once a claim round: one statement
for all of them, on the same session) into ``leveret.shovel_status`` (schema version 10), and :meth:`others` reads
the other members' fresh rows for GET /api/shovels, on a connection of its own per call (an operator's request
must not break the session that holds the claims).

When the connection is found broken (a statement failed, or asyncpg reports it closed), every claim is
:meth:`lost`: the holder must stop what it ran under them before asking again (another member may hold them
now). The connection is opened again at the next :meth:`claim` once the lost claims are forgotten, never while
claims are held: a status report that found the session ended once reconnected silently, and a member woken
from a hang went on running the shovel another member had taken. Every statement is bounded by ``timeout``: a
PostgreSQL that does not answer is a claim not taken, never a wait on the loop beyond it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from storage.pg.connections import PG_FAILURES

log = logging.getLogger("leveret.pg")

CLAIM_CLASS = 4243  # the advisory lock class of claims (LEASE_KEY is 4242: storage/pg/cluster.py)
STATUS_FRESH = 5.0  # seconds a reported status is listed by the other members (reports come every second)
REPORT = ("INSERT INTO leveret.shovel_status (vhost, name, node, status) "
          "SELECT t.vhost, t.name, $4, t.status::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) "
          "AS t(vhost, name, status) ON CONFLICT (vhost, name) DO UPDATE "
          "SET node = excluded.node, status = excluded.status, updated_at = now()")
OTHERS = ("SELECT status::text FROM leveret.shovel_status WHERE node <> $1 "
          "AND updated_at > now() - $2 * interval '1 second' ORDER BY vhost, name")


class SessionEnded(ConnectionError):
    """A statement on claims held by a session that has ended (caught with the connection errors)."""


class AdvisoryClaims:
    def __init__(self, dsn: str, *, timeout: float = 3.0,
                 session_key: Callable[[], tuple[int, int]] | None = None, node: str = "") -> None:
        """``session_key``: the (class, key) of the member's epoch, taken in shared mode when the session opens
        (asked then: a member fenced and back under a new epoch opens its next session under the new one).
        ``node``: the member's name, in the status rows it reports."""
        self.dsn = dsn
        self.timeout = timeout
        self.session_key = session_key
        self.node = node
        # One statement at a time on the session: a release comes from a task of its own while the claim round
        # may be mid-statement (asyncpg refuses a second operation on a busy connection).
        self._lock = asyncio.Lock()
        self._conn: asyncpg.Connection | None = None
        self._held: set[str] = set()
        self._lost = False
        self._closed = False

    def holds(self, key: str) -> bool:
        return key in self._held and not self.lost()

    def lost(self) -> bool:
        """True once the session that held claims is gone (until the holder has stopped and asks again)."""
        if self._held and (self._conn is None or self._conn.is_closed()):
            self._lost = True
        return self._lost

    async def claim(self, key: str) -> bool:
        if self._closed:
            return False
        if self.lost():
            self._forget()
        if key in self._held:
            return True
        try:
            async with self._lock:
                conn = await self._connection()
                taken = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))", CLAIM_CLASS, key,
                                                 timeout=self.timeout))
        except PG_FAILURES as exc:
            log.warning("cluster: cannot claim %s in PostgreSQL: %s", key, exc)
            self._broken()
            return False
        if taken:
            self._held.add(key)
        return taken

    async def release(self, key: str) -> None:
        if key not in self._held:
            return
        self._held.discard(key)
        conn = self._conn
        if conn is None or conn.is_closed():
            return
        try:
            async with self._lock:
                await conn.execute("SELECT pg_advisory_unlock($1, hashtext($2))", CLAIM_CLASS, key,
                                   timeout=self.timeout)
        except PG_FAILURES:
            self._broken()  # the session is unusable: ending it frees every claim it held

    async def report(self, statuses: list[dict[str, Any]]) -> None:
        """Write the status of the shovels run here (only while holding claims: one statement for all)."""
        if not statuses or self._closed or not self._held or self.lost():
            return
        rows = [(str(s["vhost"]), str(s["name"]), json.dumps(s)) for s in statuses]
        try:
            async with self._lock:
                conn = await self._connection()
                await conn.execute(REPORT, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                   self.node, timeout=self.timeout)
        except PG_FAILURES as exc:
            log.warning("cluster: cannot report the shovels' status to PostgreSQL: %s", exc)
            self._broken()

    async def others(self) -> list[dict[str, Any]]:
        """The other members' fresh status rows; none if PostgreSQL does not answer within ``timeout``."""
        try:
            conn = await asyncpg.connect(self.dsn, timeout=self.timeout)
        except PG_FAILURES as exc:
            log.warning("cluster: cannot read the other members' shovels from PostgreSQL: %s", exc)
            return []
        try:
            rows = await conn.fetch(OTHERS, self.node, STATUS_FRESH, timeout=self.timeout)
            return [json.loads(r[0]) for r in rows]
        except PG_FAILURES as exc:
            log.warning("cluster: cannot read the other members' shovels from PostgreSQL: %s", exc)
            return []
        finally:
            try:
                await asyncio.wait_for(conn.close(), self.timeout)
            except PG_FAILURES:
                conn.terminate()

    async def close(self) -> None:
        """The member stops: its claims are freed with its session, for another member to take at once."""
        self._closed = True
        self._held.clear()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), self.timeout)
            except PG_FAILURES:
                conn.terminate()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            if self._held:
                # The session that held them ended after lost() was last asked (a statement waited for the
                # lock meanwhile): a new session would not hold them, another member may. Lost, not carried over.
                self._lost = True
                raise SessionEnded("the session that held this member's claims ended")
            conn = await asyncpg.connect(self.dsn, timeout=self.timeout)
            try:
                if self.session_key is not None:
                    classid, key = self.session_key()
                    await conn.execute("SELECT pg_advisory_lock_shared($1, $2)", classid, key, timeout=self.timeout)
            except BaseException:
                conn.terminate()
                raise
            self._conn = conn
        return self._conn

    def _broken(self) -> None:
        """The session may be gone: whatever it held may be another member's now."""
        if self._held:
            self._lost = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    def _forget(self) -> None:
        """The holder stopped what it ran under the lost claims: start afresh."""
        self._held.clear()
        self._lost = False
