"""storage/deduplication_log.py: a deduplication cache's append-only log comes back whole after a clean stop and
after a crash (what reached the kernel and was fsynced), cuts a torn tail, starts over for a fresh cache,
replaces itself with a snapshot without losing an entry at any point, and tells when its entries are durable."""

from __future__ import annotations

import os
from pathlib import Path

from storage.deduplication_log import DIRECTORY, ENTRY, SUFFIX, DedupLog, log_id, log_ids
from storage.node_storage import NodeStorage
from storage.segment import frame
from storage.syncer import Syncer


def files(root: Path) -> list[str]:
    d = root / DIRECTORY
    return sorted(os.listdir(d)) if d.is_dir() else []


def open_log(root: Path, syncer: Syncer, fresh: bool = False) -> tuple[DedupLog, list[tuple[bytes, int]]]:
    """The log and the entries it replayed, in order (every one written as a digest, as the cache writes)."""
    entries: list[tuple[bytes, int]] = []

    def replay(key: bytes, expires_at: int, digested: bool) -> None:
        assert digested
        entries.append((bytes(key), expires_at))

    return DedupLog.open(str(root / DIRECTORY), log_id("queue", "/", "q"), syncer, fresh, replay), entries


def test_entries_come_back_in_order_after_a_clean_close(tmp_path):
    syncer = Syncer()
    dlog, entries = open_log(tmp_path, syncer)
    assert entries == []
    for i in range(5):
        dlog.append(b"k%d" % i, 1000 * i)
    dlog.close()
    syncer.sync()
    _, entries = open_log(tmp_path, syncer)
    assert entries == [(b"k%d" % i, 1000 * i) for i in range(5)]


def test_a_torn_tail_is_cut_and_later_appends_follow_the_last_good_record(tmp_path):
    syncer = Syncer()
    dlog, _ = open_log(tmp_path, syncer)
    dlog.append(b"a", 0)
    dlog.append(b"b", 0)
    dlog.close()
    path = tmp_path / DIRECTORY / files(tmp_path)[0]
    with open(path, "ab") as f:
        f.write(b"LVET\x05\x00")  # half a record header: a write torn by a crash
    dlog, entries = open_log(tmp_path, syncer)
    assert entries == [(b"a", 0), (b"b", 0)]
    dlog.append(b"c", 7)
    dlog.close()
    assert open_log(tmp_path, syncer)[1] == [(b"a", 0), (b"b", 0), (b"c", 7)]


def test_a_fresh_log_forgets_what_an_earlier_owner_of_the_name_left(tmp_path):
    syncer = Syncer()
    dlog, _ = open_log(tmp_path, syncer)
    dlog.append(b"old", 0)
    dlog.close()
    dlog, entries = open_log(tmp_path, syncer, fresh=True)
    assert entries == []
    dlog.close()
    assert open_log(tmp_path, syncer)[1] == []


def test_rotation_keeps_every_entry_and_drops_the_old_file_once_the_snapshot_is_durable(tmp_path):
    syncer = Syncer()
    dlog, _ = open_log(tmp_path, syncer)
    for i in range(10):
        dlog.append(b"k%d" % i, 0)
    syncer.flush()
    live = [(b"k%d" % i, 0) for i in range(7, 10)]
    dlog.start_rotation()
    dlog.append_snapshot(*live[0])
    dlog.append(b"k10", 0)  # admitted while the snapshot is copied: to the current file
    for entry in (*live[1:], (b"k10", 0)):
        dlog.append_snapshot(*entry)
    # A crash now (what was written reached the kernel) replays the old file, whose history the new file's
    # snapshot records only repeat.
    dlog._file.write_out()
    dlog._next.write_out()
    assert open_log(tmp_path, Syncer())[1] == [(b"k%d" % i, 0) for i in range(11)]
    dlog.finish_rotation()
    assert dlog.records == 4
    assert len(files(tmp_path)) == 2  # the old file stays until the snapshot is on disk
    dlog.append(b"k11", 0)
    syncer.flush()  # inline fsync (no loop): the snapshot is durable, the old file goes
    assert files(tmp_path) == [f"{log_id('queue', '/', 'q')}.1{SUFFIX}"]
    dlog.close()
    assert open_log(tmp_path, syncer)[1] == [*live, (b"k10", 0), (b"k11", 0)]


def test_durable_says_whether_the_last_append_was_fsynced_and_callbacks_follow_the_syncer(tmp_path):
    syncer = Syncer()
    dlog, _ = open_log(tmp_path, syncer)
    assert dlog.durable
    answers: list[bool] = []
    dlog.call_when_durable(answers.append)
    assert answers == [True]  # nothing pending: answered at once
    dlog.append(b"a", 0)
    assert not dlog.durable
    dlog.call_when_durable(answers.append)
    assert answers == [True]
    syncer.flush()
    assert dlog.durable and answers == [True, True]
    dlog.append(b"b", 0)
    dlog.call_when_durable(answers.append)
    dlog.on_sync_failed(syncer.generation)  # the fsync meant to cover it failed
    assert answers == [True, True, False]


def test_delete_removes_the_files_and_answers_whoever_waits(tmp_path):
    syncer = Syncer()
    dlog, _ = open_log(tmp_path, syncer)
    dlog.append(b"a", 0)
    answers: list[bool] = []
    dlog.call_when_durable(answers.append)
    dlog.delete()
    assert files(tmp_path) == [] and answers == [True]


def test_the_node_removes_logs_nobody_opened_at_recovery_and_closes_the_others(tmp_path):
    ns = NodeStorage(str(tmp_path))
    kept = ns.open_dedup_log("queue", "/", "kept", fresh=True, replay=lambda *entry: None)
    gone = ns.open_dedup_log("exchange", "/", "gone", fresh=True, replay=lambda *entry: None)
    kept.append(b"k", 0)
    gone.append(b"g", 0)
    ns.finish_recovery()
    ns.close()
    assert log_ids(str(tmp_path / DIRECTORY)) == {log_id("queue", "/", "kept"), log_id("exchange", "/", "gone")}
    ns = NodeStorage(str(tmp_path))
    entries: list[tuple[bytes, int, bool]] = []
    kept = ns.open_dedup_log("queue", "/", "kept", fresh=False, replay=lambda k, e, d: entries.append((bytes(k), e, d)))
    assert entries == [(b"k", 0, True)]
    ns.finish_recovery()  # the exchange was not declared again: its log goes
    assert log_ids(str(tmp_path / DIRECTORY)) == {log_id("queue", "/", "kept")}
    ns.close()


def test_records_written_before_digests_replay_as_header_values(tmp_path):
    """A log of an older version (the header value as the key, no DIGESTED bit) replays with digested=False,
    so that the cache digests them; the records after them are digests."""
    directory = tmp_path / DIRECTORY
    directory.mkdir()
    ident = log_id("queue", "/", "q")
    (directory / f"{ident}.0{SUFFIX}").write_bytes(frame(ENTRY.pack(0) + b"Sold-1") + frame(ENTRY.pack(99) + b"Sold-2"))
    seen: list[tuple[bytes, int, bool]] = []
    syncer = Syncer()
    dlog = DedupLog.open(str(directory), ident, syncer, False, lambda k, e, d: seen.append((bytes(k), e, d)))
    dlog.append(b"D" * 16, 5)
    dlog.close()
    assert seen == [(b"Sold-1", 0, False), (b"Sold-2", 99, False)]
    seen.clear()
    DedupLog.open(str(directory), ident, syncer, False, lambda k, e, d: seen.append((bytes(k), e, d))).close()
    assert seen == [(b"Sold-1", 0, False), (b"Sold-2", 99, False), (b"D" * 16, 5, True)]
