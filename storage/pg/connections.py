"""What every holder of a PostgreSQL connection of the cluster store does at its end."""

from __future__ import annotations

import asyncio

import asyncpg

CLOSE_TIMEOUT = 2.0  # seconds a polite close may take before the connection is cut


async def close_connection(conn: asyncpg.Connection | None, timeout: float = CLOSE_TIMEOUT) -> None:
    """Close ``conn`` (None or already closed: nothing), cutting it if PostgreSQL does not answer within
    ``timeout`` seconds: a node's stop must stay short while PostgreSQL is out of reach."""
    if conn is None or conn.is_closed():
        return
    try:
        await asyncio.wait_for(conn.close(), timeout)
    except Exception:  # noqa: BLE001 (closing anyway)
        conn.terminate()
