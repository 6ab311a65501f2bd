"""The cluster's definitions table written in batches (storage/pg/definitions_store.py): a journal entry of many
puts (a definitions import's thousands of queues and bindings) is one statement per run of distinct keys, and
the feed still shows every change in the order it was made, a key written twice with its last value, a delete
between two puts in its place. Real PostgreSQL (tests/pg_fixtures.py)."""

from __future__ import annotations

from typing import Any

from storage.pg.definitions_store import PgDefinitionsStore

pytest_plugins = ["pg_fixtures"]


class CountingSession:
    """The store's session, counting the statements its commits send (the transaction's own excepted)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    async def execute(self, query: str, *args: Any) -> str:
        self.statements.append(query)
        return await self.conn.execute(query, *args)


async def test_a_journal_entry_of_many_puts_is_one_statement_per_run_and_the_feed_keeps_their_order(pg_dsn) -> None:
    store = await PgDefinitionsStore.open(pg_dsn, "here@test", 5.0)
    try:
        session = CountingSession(await store._connection())
        store._conn = session  # type: ignore[assignment]
        start = store.version_at_open
        with store.transaction():
            for i in range(300):
                store.put("queue", ("/", f"q{i}"), {"n": i})
            store.put("queue", ("/", "q7"), {"n": "again"})  # a key of the run written again
            store.delete("queue", ("/", "q8"))
            store.put("queue", ("/", "q8"), {"n": "back"})
            store.put("binding", ("/", "x", "q1"), {"k": 1})
        wait = store.committed()
        assert wait is not None
        await wait
        writes = [q for q in session.statements if q.startswith(("INSERT", "UPDATE"))]
        assert len(writes) == 4, writes  # q0..q299; q7 again; the delete; q8 and the binding
        changes = await store.changes_since(start)
        assert [c.version for c in changes] == sorted(c.version for c in changes)
        keys = [c.key for c in changes]
        # Every key once, at its last write: q7 and q8 after the run, in the order written.
        assert keys[:298] == [("/", f"q{i}") for i in range(300) if i not in (7, 8)]
        assert keys[298:] == [("/", "q7"), ("/", "q8"), ("/", "x", "q1")]
        last = {c.key: c.value for c in changes}
        assert last[("/", "q7")] == {"n": "again"} and last[("/", "q8")] == {"n": "back"}
        assert last[("/", "q299")] == {"n": 299} and len(last) == 301
    finally:
        store.close()
