"""One broker per data directory: an exclusive lock held for the life of the process.

Two brokers on one data directory both recovered the same message files and both delivered the same
persistent messages. ``DataDirLock.acquire`` takes ``flock(LOCK_EX | LOCK_NB)`` on ``<data_dir>/leveret.lock``
and writes the holder's pid into it; a second broker is refused with the holder's pid. The kernel
releases the lock when the process ends, however it ends (kill -9 included), so a stale file never
blocks a restart: the pid in it is information, the lock is the truth.
"""

from __future__ import annotations

import fcntl
import os

LOCK_FILE = "leveret.lock"


class DataDirLocked(Exception):
    """Another process holds the data directory; the text names it and its pid."""


class DataDirLock:
    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def acquire(cls, data_dir: str) -> DataDirLock:
        """Lock ``data_dir`` (created if missing); raises DataDirLocked, or OSError if it can't be written."""
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(f"the data directory {data_dir} is in use by another Leveret process "
                                f"(pid {holder}, holding {path}); one data directory serves one broker") from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
