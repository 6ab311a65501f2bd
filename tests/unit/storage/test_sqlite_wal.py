"""storage/sqlite_wal.py on write-ahead logs SQLite itself wrote: damage to an early frame, with committed
frames after it, is found (SQLite would drop those commits without a word, which the test shows first); a
torn last frame and a whole log are not damage."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from storage import corruption
from storage.metadata_store import MetadataStore, MetadataStoreError
from storage.sqlite_wal import FRAME_HEADER_SIZE, HEADER_SIZE, find_damage


def _crashed_copy(tmp_path: Path, transactions: int = 6) -> tuple[Path, int]:
    """A database in WAL mode with ``transactions`` commits still in its WAL, copied while the connection is
    open (what a kill -9 leaves); returns the copy and the page size."""
    src = tmp_path / "src.sqlite"
    db = sqlite3.connect(src, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)")
    for i in range(transactions):
        db.execute("INSERT INTO t VALUES (?, ?)", (f"k{i}", b"x" * 300))
    page = db.execute("PRAGMA page_size").fetchone()[0]
    dst = tmp_path / "crashed.sqlite"
    shutil.copy(src, dst)
    shutil.copy(str(src) + "-wal", str(dst) + "-wal")
    db.close()
    return dst, page


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0x04]))


def test_a_whole_log_and_a_torn_tail_are_not_damage(tmp_path: Path) -> None:
    db, page = _crashed_copy(tmp_path)
    wal = Path(str(db) + "-wal")
    assert find_damage(wal.read_bytes()) is None
    data = wal.read_bytes()
    wal.write_bytes(data[:-page // 2])  # the last frame cut short
    assert find_damage(wal.read_bytes()) is None
    wal.write_bytes(data)
    _flip(wal, len(data) - 100)  # the last frame's page: nothing follows it to tell it from a torn write
    assert find_damage(wal.read_bytes()) is None


@pytest.mark.parametrize("where", ["page", "frame-checksum", "header-salt"])
def test_damage_to_an_early_frame_is_found_and_the_store_refuses_to_open(tmp_path: Path, where: str) -> None:
    db, page = _crashed_copy(tmp_path)
    wal = Path(str(db) + "-wal")
    frame = FRAME_HEADER_SIZE + page
    second = HEADER_SIZE + frame  # the second frame (the first holds the table's creation)
    offset = {"page": second + FRAME_HEADER_SIZE + page // 2, "frame-checksum": second + 17, "header-salt": 17}[where]
    _flip(wal, offset)
    at = find_damage(wal.read_bytes())
    assert at == (0 if where == "header-salt" else second)
    # What SQLite alone makes of it: commits after the damaged frame are gone, no error.
    probe = tmp_path / "probe.sqlite"
    shutil.copy(db, probe)
    shutil.copy(wal, str(probe) + "-wal")
    c = sqlite3.connect(probe)
    try:
        rows = c.execute("SELECT count(*) FROM t").fetchone()[0] if where != "header-salt" else None
    except sqlite3.DatabaseError:
        rows = None
    c.close()
    assert rows is None or rows < 6, "SQLite should have lost commits silently (the reason for the check)"
    before = corruption.counts()["metadata"]
    with pytest.raises(MetadataStoreError) as exc:
        MetadataStore(str(db))
    text = str(exc.value)
    assert f"{wal} is damaged at offset {at}" in text and "restore" in text
    assert corruption.counts()["metadata"] == before + 1
