"""What every holder of a PostgreSQL connection of the cluster store shares: what a failed statement raises,
and what it does at its end (close the connection, stop the tasks that use it)."""

from __future__ import annotations

import asyncio

import asyncpg

CLOSE_TIMEOUT = 2.0  # seconds a polite close may take before the connection is cut

# What a statement on a lost, refused or slow session raises: the one tuple every holder catches. asyncpg's
# InternalClientError is not one of its InterfaceErrors: a member woken from a hang (SIGSTOP) whose session the
# server had ended got "cannot switch to state 12; another operation is in progress" from its next statement,
# and the shovel placement's loop died of it (its claims never found lost, its shovel run beside the member
# that took it).
PG_FAILURES = (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


async def close_connection(conn: asyncpg.Connection | None, timeout: float = CLOSE_TIMEOUT) -> None:
    """Close ``conn`` (None or already closed: nothing), cutting it if PostgreSQL does not answer within
    ``timeout`` seconds: a node's stop must stay short while PostgreSQL is out of reach."""
    if conn is None or conn.is_closed():
        return
    try:
        await asyncio.wait_for(conn.close(), timeout)
    except Exception:  # noqa: BLE001 (closing anyway)
        conn.terminate()


async def stop_tasks(*tasks: asyncio.Task[object] | None, timeout: float | None = None) -> set[asyncio.Task[object]]:
    """Cancel ``tasks`` (None: skipped) and wait until they end; returns those still running after ``timeout``
    seconds (None: wait as long as it takes).

    The cancel is repeated while a task runs on: in Python 3.11 ``asyncio.wait_for`` swallows a cancel that
    arrives as the thing it waits for completes (CPython gh-86296, fixed in 3.12), so a loop around a
    ``wait_for`` (a flush, a poll with a timeout) cancelled once can go on for good, and whoever awaited its
    end waits for ever (seen: the queue statistics writer of a stopped member kept flushing)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    live = {t for t in tasks if t is not None and not t.done()}
    while live:
        for t in live:
            t.cancel()
        wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - loop.time()))
        done, live = await asyncio.wait(live, timeout=wait)
        for t in done:  # retrieved, so that an error ending a task is not reported as never retrieved
            if not t.cancelled():
                t.exception()
        if deadline is not None and loop.time() >= deadline:
            break
    return live
