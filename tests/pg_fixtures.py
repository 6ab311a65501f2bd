"""Pytest fixtures for the PostgreSQL store's tests (load with ``pytest_plugins = ["pg_fixtures"]``).

``postgres``: one throwaway server per pytest session (tests/pg_server.py). ``pg_dsn``: a fresh, empty
database of that server for each test (CREATE DATABASE takes a few ms), so tests never see each other's rows.
``own_postgres``: a server of the test's own (initdb: a second or two), for a test that halts and resumes it
(``PgServer.halt``/``resume``): the session's server is shared by every test.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest
from pg_server import PgServer

_db_numbers = itertools.count(1)


def running_server() -> Iterator[PgServer]:
    """A throwaway server, started, then stopped when the generator is closed (the fixtures' body)."""
    server = PgServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    yield from running_server()


@pytest.fixture
def own_postgres() -> Iterator[PgServer]:
    yield from running_server()


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


@pytest.fixture
async def admin(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A session on the test's database, for tests that read or write the tables themselves (a module that
    needs the schema made first overrides it: ``async def admin(admin)``, then ``schema.migrate``)."""
    conn = await asyncpg.connect(pg_dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def nodes(pg_dsn: str) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """``await nodes(name, **kw)``: a PgCluster node of the test's database (storage/pg/cluster.py), closed at
    the end of the test."""
    from storage.pg.cluster import PgCluster

    made: list[PgCluster] = []

    async def make(name: str, **kw: Any) -> PgCluster:
        node = await PgCluster.connect(pg_dsn, name, **kw)
        made.append(node)
        return node

    yield make
    for node in made:
        await asyncio.wait_for(node.close(), 10)
