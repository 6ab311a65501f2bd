"""The metadata store on a disk that fills up: a definition whose ``put`` returned is there after the
store is reopened, one whose ``put`` raised may or may not be, and the store works again once space is
freed. The disk is a small tmpfs the test mounts (skipped, saying why, only where mounting is impossible)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from storage.metadata_store import MetadataStore


@pytest.fixture
def small_disk(tmp_path: Path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
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
        except sqlite3.OperationalError as e:
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
    assert reopened.get("queue", ("/", "after-3")) == value
    reopened.close()
