"""The metadata store on a running node: commits fsynced by the syncer's thread, replies told when
(storage/metadata_store.py, storage/commits.py; issue 34's "SQLite commits run off the loop").

tests/integration/durability/test_slow_disk_definitions.py shows the same from outside, with a slow disk and
real clients; here the bookkeeping: what is accepted, when ``committed()`` has nothing to wait for, that the
loop's connection does not fsync (``synchronous=NORMAL``) while a store without a loop still does, and that the
WAL is checkpointed off the loop once it grows."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from storage import metadata_store
from storage.metadata_store import MetadataStore
from storage.syncer import Syncer


async def test_a_write_is_accepted_and_committed_once_the_syncer_fsynced_the_wal(tmp_path: Path) -> None:
    syncer = Syncer(asyncio.get_running_loop())
    md = MetadataStore(str(tmp_path / "m.sqlite"), syncer)
    assert md.committed() is None  # nothing written yet
    fsyncs = syncer.fsyncs
    md.put("queue", ("/", "orders"), {"durable": True})
    assert md.accepted == 1
    done = md.committed()
    assert done is not None and not done.done()  # the fsync is the syncer's, after this burst
    assert md._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: the commit did not fsync
    await asyncio.wait_for(done, 5)
    assert syncer.fsyncs > fsyncs
    assert md.committed() is None
    # Visible to another connection (committed in SQLite's sense), and on disk once ``done``.
    other = sqlite3.connect(md.path)
    assert other.execute("SELECT count(*) FROM defs WHERE kind = 'queue'").fetchone()[0] == 1
    other.close()
    syncer.stop()
    md.close()


async def test_writes_of_one_burst_share_one_fsync_and_each_caller_is_told(tmp_path: Path) -> None:
    syncer = Syncer(asyncio.get_running_loop())
    md = MetadataStore(str(tmp_path / "m.sqlite"), syncer)
    waits = []
    for i in range(20):
        md.put("queue", ("/", f"q{i}"), {})
        waits.append(md.committed())
    rounds = syncer.rounds
    await asyncio.wait_for(asyncio.gather(*[w for w in waits if w is not None]), 5)
    assert all(w is not None for w in waits)
    assert syncer.rounds - rounds == 1  # one burst: one round for all twenty
    syncer.stop()
    md.close()


async def test_a_transaction_is_one_accepted_commit(tmp_path: Path) -> None:
    syncer = Syncer(asyncio.get_running_loop())
    md = MetadataStore(str(tmp_path / "m.sqlite"), syncer)
    with md.transaction():
        for i in range(50):
            md.put("binding", ("/", "amq.topic", f"q{i}"), {})
    assert md.accepted == 1
    done = md.committed()
    assert done is not None
    await asyncio.wait_for(done, 5)
    syncer.stop()
    md.close()


async def test_an_applied_batch_waits_for_its_fsync(tmp_path: Path) -> None:
    syncer = Syncer(asyncio.get_running_loop())
    md = MetadataStore(str(tmp_path / "m.sqlite"), syncer)
    ops = md.open_batch()
    with md.recording(ops):
        for i in range(100):
            md.put("queue", ("/", f"q{i}"), {})
    rounds = syncer.rounds
    await md.apply_async(ops)
    assert syncer.rounds > rounds and md.committed() is None
    assert len(md.items("queue")) == 100
    syncer.stop()
    md.close()


def test_without_a_loop_every_commit_is_fsynced_within_the_call(tmp_path: Path) -> None:
    md = MetadataStore(str(tmp_path / "m.sqlite"))
    md.put("user", "a", {})
    assert md._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert md.committed() is None
    md.close()


async def test_the_wal_is_checkpointed_off_the_loop_every_so_many_commits(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata_store, "CHECKPOINT_EVERY", 50)
    syncer = Syncer(asyncio.get_running_loop())
    md = MetadataStore(str(tmp_path / "m.sqlite"), syncer)
    assert md._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # SQLite's own (on the loop) is off
    runs: list[tuple[str, tuple[int, int, int] | None]] = []
    real = md._checkpoint

    def checkpoint() -> tuple[int, int, int] | None:
        result = real()
        runs.append((threading.current_thread().name, result))
        return result

    monkeypatch.setattr(md, "_checkpoint", checkpoint)
    for burst in range(8):  # bursts of declares, the loop turning in between as a node's does
        for i in range(50):
            md.put("queue", ("/", f"q{burst}-{i}"), {"padding": "x" * 500})
        await asyncio.sleep(0.05)
    deadline = asyncio.get_running_loop().time() + 5
    while len(runs) < 2 or md._checkpointing:
        assert asyncio.get_running_loop().time() < deadline, runs
        await asyncio.sleep(0.01)
    assert all(name != threading.main_thread().name for name, _ in runs), runs
    assert all(result is not None and result[0] == 0 and result[2] > 0 for _, result in runs), runs
    # The database file holds rows now: the checkpoints copied the WAL's pages into it.
    assert os.path.getsize(md.path) > 64 << 10
    await asyncio.wait_for(md.committed() or asyncio.sleep(0), 5)
    syncer.stop()
    md.close()
    reopened = MetadataStore(md.path)
    assert len(reopened.items("queue")) == 400
    reopened.close()
