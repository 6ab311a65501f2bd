"""The fault injector the storage fault tests share (tests/unit/storage/test_write_faults.py for the variable
queue, test_stream_write_faults.py for the stream store): it replaces ``os.pwrite``, ``os.write`` and
``os.fsync`` while installed and makes the ``fail_at``-th call on a file under ``root`` fail once, the way a
full or failing disk does. Only calls on the store's own files count (resolved through /proc/self/fd), so
pytest's and the logging module's writes neither count nor fail."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager


class FaultInjector:
    """Counts the node's file writes and fsyncs and makes the ``fail_at``-th one fail once."""

    def __init__(self, root: str, fail_at: int = 0, err: int = errno.ENOSPC, mode: str = "fail") -> None:
        self.root = os.path.realpath(root)
        self.fail_at = fail_at
        self.err = err
        self.mode = mode  # "fail": nothing lands; "short": part lands, then the error; "garbage": junk lands
        self.calls = 0
        self.fired = False
        self._raise_next = False  # "short": the call after the short write fails, as on a full disk
        self._pwrite, self._write, self._fsync = os.pwrite, os.write, os.fsync

    def _ours(self, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(self.root)
        except OSError:
            return False

    def _should_fail(self, fd: int) -> bool:
        if not self._ours(fd):
            return False
        self.calls += 1
        if self._raise_next:
            self._raise_next = False
            raise OSError(self.err, os.strerror(self.err))
        if self.calls == self.fail_at and not self.fired:
            self.fired = True
            return True
        return False

    def pwrite(self, fd: int, data, offset: int) -> int:
        if self._should_fail(fd):
            n = len(data)
            if self.mode == "short" and n > 1:
                self._raise_next = True
                return self._pwrite(fd, bytes(data[:n // 2]), offset)
            if self.mode == "garbage":
                self._pwrite(fd, b"\xee" * min(n, 100), offset)
            raise OSError(self.err, os.strerror(self.err))
        return self._pwrite(fd, data, offset)

    def write(self, fd: int, data) -> int:
        if self._should_fail(fd):
            n = len(data)
            if self.mode == "short" and n > 1:
                self._raise_next = True
                return self._write(fd, bytes(data[:n // 2]))
            raise OSError(self.err, os.strerror(self.err))
        return self._write(fd, data)

    def fsync(self, fd: int) -> None:
        if self._should_fail(fd):
            raise OSError(self.err, os.strerror(self.err))
        self._fsync(fd)

    @contextmanager
    def installed(self) -> Iterator[FaultInjector]:
        os.pwrite, os.write, os.fsync = self.pwrite, self.write, self.fsync
        try:
            yield self
        finally:
            os.pwrite, os.write, os.fsync = self._pwrite, self._write, self._fsync
