"""Every definitions row carries a checksum (storage/metadata_store.py): a flipped bit in a row's value, which
SQLite reads back without complaint, is refused instead of believed; a database written before the column
existed is migrated at open and keeps its rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgpack
import pytest

from storage import corruption
from storage.metadata_store import MetadataStore, MetadataStoreError, row_crc

OLD_SCHEMA = ("CREATE TABLE defs (kind TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, "
              "PRIMARY KEY (kind, key)) WITHOUT ROWID")  # the format before the crc column (up to commit 00c2ef3)


def _flip_in_file(path: Path, needle: bytes) -> None:
    data = path.read_bytes()
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, "the value should be stored once, in the main file"
    with open(path, "r+b") as f:
        f.seek(at + 2)
        f.write(bytes([data[at + 2] ^ 0x01]))


def test_a_flipped_bit_in_a_value_is_refused_not_believed(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite"
    s = MetadataStore(str(path))
    s.put("queue", ("/", "orders"), {"durable": True, "arguments": {"x-max-length": 123456789}, "tag": "ZQXW-orders"})
    s.put("queue", ("/", "other"), {"durable": True})
    s.close()  # a clean close checkpoints the WAL into the main file
    _flip_in_file(path, b"ZQXW-orders")
    before = corruption.counts()["metadata"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok", "the page's structure is intact"
    db.close()
    s = MetadataStore(str(path))
    with pytest.raises(MetadataStoreError):
        s.check_integrity()  # the start's check
    with pytest.raises(MetadataStoreError) as exc:
        s.items("queue")
    assert "fails its checksum" in str(exc.value) and "restore" in str(exc.value)
    with pytest.raises(MetadataStoreError):
        s.get("queue", ("/", "orders"))
    assert s.get("queue", ("/", "other")) == {"durable": True}
    assert corruption.counts()["metadata"] == before + 1
    s.close()


def test_a_database_of_the_previous_format_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(OLD_SCHEMA)
    rows = [("queue", f"/\x1fq{i}", msgpack.packb({"durable": True, "n": i})) for i in range(50)]
    db.executemany("INSERT INTO defs VALUES (?, ?, ?)", rows)
    db.close()
    s = MetadataStore(str(path))
    assert not s.was_empty
    assert s.items("queue") == [(("/", f"q{i}"), {"durable": True, "n": i}) for i in sorted(range(50), key=str)]
    s.close()
    db = sqlite3.connect(path)
    assert all(c == row_crc(k, y, v) for k, y, v, c in db.execute("SELECT kind, key, value, crc FROM defs"))
    db.close()
    s = MetadataStore(str(path))  # already migrated: opens as it is
    s.put("queue", ("/", "new"), {"durable": False})
    assert s.get("queue", ("/", "new")) == {"durable": False}
    s.close()


def test_a_flipped_bit_in_a_kind_is_found_at_the_start_check(tmp_path: Path) -> None:
    """A row whose kind changed is never read by kind (recovery asks for the kinds it knows): the start's
    check reads every row (found by the bit-flip lane: ``delayed_exchange`` became ``delayed_eychange``)."""
    path = tmp_path / "metadata.sqlite"
    s = MetadataStore(str(path))
    s.put("delayed_exchange", ("/", "dx"), 7)
    s.close()
    _flip_in_file(path, b"delayed_exchange")
    s = MetadataStore(str(path))
    assert s.items("delayed_exchange") == []  # moved out of sight of the reads by kind
    with pytest.raises(MetadataStoreError) as exc:
        s.check_integrity()
    assert "fails its checksum" in str(exc.value)
    s.close()
