"""The metadata store on a disk that fills up: a definition whose ``put`` returned is there after the
store is reopened, one whose ``put`` raised (MetadataWriteError) is not, and the store works again once space is freed. The disk is a small tmpfs the test mounts (skipped, saying why, only where mounting is impossible)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from leftovers import record_mount

from storage.metadata_store import MetadataStore, MetadataWriteError


@pytest.fixture
def small_disk(tmp_path: Path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    record_mount(mnt)
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def fill(mnt: Path) -> Path:
    """Take every free byte of the volume with a file; returns it (delete it to free the space)."""
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                if not f.write(b"\0" * 4096):
                    break
        except OSError:
            pass
    return filler


def test_definitions_written_before_and_after_a_full_disk_survive(small_disk):
    path = str(small_disk / "metadata.sqlite")
    store = MetadataStore(path)
    value = {"durable": True, "arguments": {"x-pad": "p" * 2000}}
    for i in range(20):
        store.put("queue", ("/", f"before-{i}"), value)
    filler = fill(small_disk)
    stored, refused = [], 0
    for i in range(400):  # until the pages SQLite had in hand run out
        try:
            store.put("queue", ("/", f"during-{i}"), value)
            stored.append(f"during-{i}")
        except MetadataWriteError as e:
            assert "full" in str(e) or "disk" in str(e), e
            refused += 1
    assert refused > 0, "the disk never filled up for the metadata store"
    filler.unlink()
    for i in range(20):
        store.put("queue", ("/", f"after-{i}"), value)
    store.close()
    reopened = MetadataStore(path)
    names = {key[1] for key, _ in reopened.items("queue")}
    expected = {f"before-{i}" for i in range(20)} | set(stored) | {f"after-{i}" for i in range(20)}
    assert expected <= names, f"definitions whose put returned were lost: {sorted(expected - names)[:5]}"
    assert names == expected, "a put that raised was written after all"
    assert reopened.get("queue", ("/", "after-3")) == value
    reopened.close()


def test_a_batch_on_a_full_disk_writes_nothing_and_raises(small_disk):
    """A definitions import or a vhost deletion is one transaction: all of it, or none of it."""
    store = MetadataStore(str(small_disk / "metadata.sqlite"))
    store.put("vhost", "v", {})
    ops = store.open_batch()
    with store.recording(ops):
        for i in range(400):
            store.put("queue", ("v", f"q{i}"), {"arguments": "p" * 4000})
    assert store.items("queue") == []  # recorded, not written
    filler = fill(small_disk)
    commits = store.commits
    with pytest.raises(MetadataWriteError):
        store.apply(ops)
    assert store.commits == commits and store.items("queue") == []
    filler.unlink()
    store.put("vhost", "w", {})  # works again
    assert [k for k, _ in store.items("vhost")] == ["v", "w"]
    store.close()
