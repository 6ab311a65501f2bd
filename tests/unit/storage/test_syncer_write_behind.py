"""storage/syncer.py: while the fsync thread is busy with a round, a flush of ``write_behind`` files only (a
stream's logs) waits for the round to end and is run by its completion; a flush with any other dirty file (a
classic queue's) is written out and queued at once, as it always was. Real files, a real thread and a real
event loop; the round is held open by an fsync that waits for the test."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from storage.segment import AppendFile
from storage.syncer import Syncer


class HeldSyncer(Syncer):
    """A syncer whose fsync rounds wait for ``release`` (the first round starts at once)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.release = threading.Event()
        self.started = threading.Event()

    def _fsync(self, items):  # type: ignore[no-untyped-def]
        self.started.set()
        self.release.wait(10)
        return super()._fsync(items)


async def _until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _files(tmp_path: Path, syncer: Syncer) -> tuple[AppendFile, AppendFile]:
    stream = AppendFile.create(str(tmp_path / "stream"), syncer)
    stream.write_behind = True
    classic = AppendFile.create(str(tmp_path / "classic"), syncer)
    return stream, classic


def test_write_behind_files_wait_for_the_round_and_its_end_writes_them(tmp_path: Path) -> None:
    async def main() -> None:
        syncer = HeldSyncer(asyncio.get_running_loop())
        stream, _classic = _files(tmp_path, syncer)
        stream.append(b"first")
        await _until(lambda: syncer.started.is_set())  # round 1 holds the thread
        syncer.started.clear()
        stream.append(b"second")
        await asyncio.sleep(0.05)  # the scheduled flush has run: it waited
        assert stream.written < stream.size, "a write-behind flush during a round wrote its buffer out"
        syncer.release.set()
        await _until(lambda: stream.synced == stream.size)  # the round's end ran the waiting flush
        syncer.stop()

    asyncio.run(main())


@pytest.mark.parametrize("after_the_wait", [False, True], ids=["in-the-same-turn", "after-the-flush-waits"])
def test_any_other_dirty_file_makes_the_flush_go_out_at_once(tmp_path: Path, after_the_wait: bool) -> None:
    """The classic queue's append comes in the same turn as the stream's, or once the stream's flush has
    already decided to wait for the round (then that flush must go out at once, not at the round's end)."""
    async def main() -> None:
        syncer = HeldSyncer(asyncio.get_running_loop())
        stream, classic = _files(tmp_path, syncer)
        stream.append(b"first")
        await _until(lambda: syncer.started.is_set())
        stream.append(b"second")
        if after_the_wait:
            await asyncio.sleep(0.05)  # that flush ran and waits for the round
            assert stream.written < stream.size
        classic.append(b"urgent")
        await asyncio.sleep(0.05)
        assert classic.written == classic.size and stream.written == stream.size, "the urgent file waited"
        assert syncer._queue, "the flush was not queued for the next round"
        syncer.release.set()
        await _until(lambda: classic.synced == classic.size and stream.synced == stream.size)
        syncer.stop()

    asyncio.run(main())
