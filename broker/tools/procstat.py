"""Resident memory and CPU time of a process (the broker under test), read from /proc."""

from __future__ import annotations

import os
import threading
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def read_status_kb(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


def read_cpu_s(pid: int) -> float:
    """utime + stime of the process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def read_io(pid: int) -> dict[str, int]:
    """/proc/PID/io: write_bytes is what the process sent towards storage (page cache dirtied included)."""
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, value = line.split(":", 1)
            out[key] = int(value)
    return out


class ProcSampler(threading.Thread):
    """Samples VmRSS every ``interval`` seconds (peak kept), and CPU time at :meth:`mark_start` / :meth:`mark_end`."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True, name=f"procstat-{pid}")
        self.pid = pid
        self.interval = interval
        self.rss_peak_kb = 0
        self.rss_start_kb = 0
        self.cpu_start: float | None = None
        self.cpu_end: float | None = None
        self.io_start: dict[str, int] | None = None
        self.io_end: dict[str, int] | None = None
        self.error: str | None = None
        self._halt = threading.Event()
        try:
            self.rss_start_kb = read_status_kb(pid).get("VmRSS", 0)
        except OSError as exc:
            self.error = f"cannot read /proc/{pid}: {exc}"

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def sample(self) -> int:
        try:
            rss = read_status_kb(self.pid).get("VmRSS", 0)
        except OSError:
            return 0
        self.rss_peak_kb = max(self.rss_peak_kb, rss)
        return rss

    def mark_start(self) -> None:
        try:
            self.cpu_start = read_cpu_s(self.pid)
            self.io_start = read_io(self.pid)
        except OSError:
            pass

    def mark_end(self) -> None:
        try:
            self.cpu_end = read_cpu_s(self.pid)
            self.io_end = read_io(self.pid)
        except OSError:
            pass

    def stop(self) -> dict[str, Any]:
        end = self.sample()  # the RSS once the run is over (a drained backlog: is the memory given back?)
        self._halt.set()
        out: dict[str, Any] = {"pid": self.pid, "rss_start_kb": self.rss_start_kb, "rss_peak_kb": self.rss_peak_kb,
               "rss_end_kb": end}
        try:
            out["vm_hwm_kb"] = read_status_kb(self.pid).get("VmHWM")
        except OSError:
            out["vm_hwm_kb"] = None
        if self.cpu_start is not None and self.cpu_end is not None:
            out["cpu_s"] = round(self.cpu_end - self.cpu_start, 3)
        if self.io_start and self.io_end:
            out["disk_write_bytes"] = self.io_end.get("write_bytes", 0) - self.io_start.get("write_bytes", 0)
        if self.error:
            out["error"] = self.error
        return out
