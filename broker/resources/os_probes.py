"""What the operating system says about this process and its machine: resident memory, RAM, open file
descriptors and their limit, free disk, processors, uptime (the readings of RabbitMQ's ``vm_memory_monitor``,
``rabbit_disk_monitor`` and ``file_handle_cache`` stats).

One copy of each probe, for the alarms (broker/resources/alarms.py), the memory budget, the Prometheus exporter and
the HTTP API alike. Plain functions over /proc, ``os`` and ``resource``; nothing here imports the broker.
"""

from __future__ import annotations

import os
import resource
import shutil
import time
from collections.abc import Callable
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096  # platform: no sysconf on Windows
# Free disk reported when the data directory's file system cannot be asked (no alarm is raised for it).
UNKNOWN_DISK_FREE = 1 << 62


def resident_memory() -> int:
    """This process's resident set size in bytes (Linux /proc; 0 where unavailable, so no memory alarm)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def total_memory() -> int:
    """The machine's RAM in bytes (8 GiB where it cannot be read), the base of relative watermarks."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def open_fds() -> int:
    """File descriptors this process has open (0 where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def max_fds() -> int:
    """The soft limit on open file descriptors (``ulimit -n``)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft


def disk_free(path: str | os.PathLike[str]) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent, so the figure is
    right before the data directory is created); 0 if it cannot be read."""
    p = os.fspath(path)
    while p and not os.path.exists(p):
        parent = os.path.dirname(os.path.abspath(p))
        if parent == p:
            break
        p = parent
    try:
        return shutil.disk_usage(p or ".").free
    except OSError:
        return 0


def data_dir_free(path: str | os.PathLike[str]) -> int:
    """Free bytes on the data directory's file system as the disk alarm reads it: the directory exists,
    and a file system that cannot be asked counts as roomy (:data:`UNKNOWN_DISK_FREE`), not as full."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return UNKNOWN_DISK_FREE


def processors() -> int:
    """Logical processors of the machine (at least 1)."""
    return os.cpu_count() or 1


def uptime_seconds(started_at: float) -> float:
    """Seconds since ``started_at`` (a ``time.time()`` reading)."""
    return time.time() - started_at


def _find_malloc_trim() -> Callable[[int], Any] | None:
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], Any] = libc.malloc_trim
        return trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _find_malloc_trim()


def release_free_memory() -> None:
    """Give memory freed by paged-out messages back to the OS. glibc keeps freed blocks of this size in
    its heap, so the resident size (which the memory alarm reads) would otherwise stay high for good."""
    if _malloc_trim is not None:
        _malloc_trim(0)
