"""A doorbell: a session of its own that LISTENs on one channel and calls back on each notification, opened
again (with back-off) whenever it is lost, so that a ring sent while PostgreSQL restarts is only late by the
caller's poll, which it never replaces (a notification is lost with a broken session; docs/decisions/postgres-cluster.md: "LISTEN/NOTIFY
as a doorbell, plus polling")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from storage.pg.connections import close_connection, stop_tasks

log = logging.getLogger("leveret.pg.bell")

CONNECT_TIMEOUT = 5.0
RETRY_FIRST, RETRY_MAX = 0.1, 2.0  # seconds between two attempts to listen again, doubling
CHECK_EVERY = 1.0  # seconds between two looks at whether the session is still open


class Bell:
    """Listens on ``channel`` at ``dsn``; ``on_ring()`` runs on the event loop for every notification."""

    def __init__(self, dsn: str, channel: str, on_ring: Callable[[], None]) -> None:
        self.dsn = dsn
        self.channel = channel
        self.on_ring = on_ring
        self.rings = 0  # notifications heard (tests)
        self.listening = asyncio.Event()  # set while a session listens
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _heard(self, _conn: Any, _pid: int, _channel: str, _payload: str) -> None:
        self.rings += 1
        self.on_ring()

    async def _run(self) -> None:
        delay = RETRY_FIRST
        while True:
            try:
                conn = self._conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
                await conn.add_listener(self.channel, self._heard)
                self.listening.set()
                delay = RETRY_FIRST
                self.on_ring()  # rings while no session listened were lost: the caller looks once now
                while not conn.is_closed():
                    await asyncio.sleep(CHECK_EVERY)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (PostgreSQL out of reach: the caller's poll goes on)
                log.debug("doorbell %s: %s", self.channel, exc)
            self.listening.clear()
            await close_connection(self._conn)
            self._conn = None
            await asyncio.sleep(delay)
            delay = min(RETRY_MAX, delay * 2)

    async def close(self) -> None:
        await stop_tasks(self._task, timeout=CONNECT_TIMEOUT)
        await close_connection(self._conn)
        self._conn = None
