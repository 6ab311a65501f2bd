"""Pytest fixtures for the PostgreSQL store's tests (load with ``pytest_plugins = ["pg_fixtures"]``).

``postgres``: one throwaway server per pytest session (tests/pg_server.py). ``pg_dsn``: a fresh, empty
database of that server for each test (CREATE DATABASE takes a few ms), so tests never see each other's rows.
``own_postgres``: a server of the test's own (initdb: a second or two), for a test that halts and resumes it
(``PgServer.halt``/``resume``): the session's server is shared by every test.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import asyncpg
import pytest
from pg_server import PgServer

_db_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    server = PgServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_postgres() -> Iterator[PgServer]:
    server = PgServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _admin(server: PgServer, sql: str) -> None:
    conn = await asyncpg.connect(server.dsn())
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def create_database(server: PgServer) -> str:
    """A new empty database on ``server``; its DSN. Usable from sync code (runs its own loop briefly)."""
    name = f"t{next(_db_numbers)}"
    loop = asyncio.new_event_loop()
    try:
        # FILE_COPY: a file copy and two checkpoints (cheap with fsync off) rather than the whole template
        # written through the WAL, which made each test's set-up take a second on a loaded machine.
        loop.run_until_complete(_admin(server, f"CREATE DATABASE {name} STRATEGY = FILE_COPY"))
    finally:
        loop.close()
    return server.dsn(name)


@pytest.fixture
def pg_dsn(postgres: PgServer) -> str:
    return create_database(postgres)
