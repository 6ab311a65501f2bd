"""The metadata store: durable definitions by kind and key, transactions, and survival across reopen."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from storage.metadata_store import MetadataStore


def test_put_get_delete_items(tmp_path: Path) -> None:
    md = MetadataStore(str(tmp_path / "m.sqlite"))
    md.put("vhost", "/", {"description": "default"})
    md.put("queue", ("/", "orders"), {"durable": True, "arguments": {"x-max-length": 10}})
    md.put("queue", ("/", "audit"), {"durable": True, "arguments": {}})
    md.put("queue", ("other", "orders"), {"durable": True, "arguments": {}})
    md.put("binding", ("/", "amq.direct", "queue", "orders", "rk"), {"arguments": {}})
    assert md.get("queue", ("/", "orders"))["arguments"] == {"x-max-length": 10}
    assert md.get("queue", ("/", "nope")) is None
    assert [k for k, _ in md.items("queue")] == [("/", "audit"), ("/", "orders"), ("other", "orders")]
    md.put("queue", ("/", "orders"), {"durable": True, "arguments": {}})  # replace
    assert md.get("queue", ("/", "orders"))["arguments"] == {}
    assert md.delete("queue", ("/", "audit")) and not md.delete("queue", ("/", "audit"))
    assert md.delete_prefix("queue", ("/",)) == 1
    assert [k for k, _ in md.items("queue")] == [("other", "orders")]
    assert md.kinds() == ["binding", "queue", "vhost"]
    md.close()


def test_transactions_commit_together_or_not_at_all(tmp_path: Path) -> None:
    md = MetadataStore(str(tmp_path / "m.sqlite"))
    with md.transaction():
        md.put("user", "a", {"tags": ["administrator"]})
        with md.transaction():
            md.put("user", "b", {"tags": []})
    with pytest.raises(RuntimeError), md.transaction():
        md.put("user", "c", {})
        md.delete("user", "a")
        raise RuntimeError("abort")
    assert [k for k, _ in md.items("user")] == ["a", "b"]
    md.close()


def test_definitions_survive_reopen_and_are_fsync_safe(tmp_path: Path) -> None:
    path = str(tmp_path / "m.sqlite")
    md = MetadataStore(path)
    md.put("exchange", ("/", "logs"), {"type": "topic", "durable": True, "bytes": b"\x00\x01"})
    # Not closed: a crash. The commit is already in the (fsynced) WAL.
    md2 = MetadataStore(path)
    assert md2.get("exchange", ("/", "logs")) == {"type": "topic", "durable": True, "bytes": b"\x00\x01"}
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert md2._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    md.close()
    md2.close()


def test_commits_are_counted_and_a_transaction_is_one(tmp_path: Path) -> None:
    md = MetadataStore(str(tmp_path / "m.sqlite"))
    start = md.commits
    md.put("user", "a", {})
    md.delete("user", "a")
    assert md.commits == start + 2
    with md.transaction():
        for i in range(100):
            md.put("queue", ("/", f"q{i}"), {})
        md.delete_prefix("queue", ("/",))
    assert md.commits == start + 3
    md.close()


def test_a_recorded_batch_is_one_commit_and_later_writes_still_win(tmp_path: Path) -> None:
    """What an HTTP definitions import does: record slices, write them in one commit at the end; a write
    made directly in between (another client) is replayed after the batch, so it is not undone."""
    md = MetadataStore(str(tmp_path / "m.sqlite"))
    ops = md.open_batch()
    with md.recording(ops):
        md.put("queue", ("/", "a"), {"n": 1})
        md.put("queue", ("/", "b"), {"n": 1})
        with md.transaction():  # a nested transaction while recording is part of the batch
            md.put("queue", ("/", "c"), {"n": 1})
    assert md.items("queue") == []
    md.delete("queue", ("/", "b"))  # another client deletes what the import created
    md.put("queue", ("/", "a"), {"n": 2})
    start = md.commits
    md.apply(ops)
    assert md.commits == start + 1
    assert md.items("queue") == [(("/", "a"), {"n": 2}), (("/", "c"), {"n": 1})]
    md.put("queue", ("/", "d"), {})  # the batch is no longer pending: nothing more is appended to it
    assert len(ops) == 5
    md.close()


def test_a_failed_write_raises_and_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    from storage.metadata_store import MetadataWriteError

    md = MetadataStore(str(tmp_path / "m.sqlite"))
    md.put("user", "a", {})
    md._db.execute("PRAGMA query_only = ON")  # as a read-only file would
    with pytest.raises(MetadataWriteError, match="m.sqlite"):
        md.put("user", "b", {})
    with pytest.raises(MetadataWriteError), md.transaction():
        md.delete("user", "a")
    md._db.execute("PRAGMA query_only = OFF")
    assert [k for k, _ in md.items("user")] == ["a"]
    with md.transaction():  # usable again
        md.put("user", "c", {})
    assert [k for k, _ in md.items("user")] == ["a", "c"]
    md.close()
