"""Where a parallel run's time goes, test by test: ``PYTEST_ADDOPTS="-p timeline" LEVERET_TEST_TIMELINE=DIR``
writes one JSON line per test (worker, test, start and end on the wall clock, the CPU seconds of the test process
and of its children waited for meanwhile: brokers and tools) to DIR/<worker>.jsonl.
The per-lane sums and the slowest tests that every run prints say what costs; this says what ran beside what,
e.g. when all workers sat in sleeping tests and the two cores idled (issue 33: the parallel pass is CPU-bound
except for such stretches). ``python tests/timeline.py DIR`` prints the stretches with the tests then running."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

_DIR = os.environ.get("LEVERET_TEST_TIMELINE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    start, cpu, children = time.time(), time.process_time(), _children_cpu()
    yield
    if _DIR:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(Path(_DIR) / f"{worker}.jsonl", "a") as out:
            out.write(json.dumps({"worker": worker, "test": item.nodeid, "start": start, "end": time.time(),
                                  "cpu": time.process_time() - cpu, "children_cpu": _children_cpu() - children})
                      + "\n")


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended and been waited for (its brokers, tools)."""
    t = os.times()
    return t.children_user + t.children_system


def _report(directory: str, width: float = 10.0) -> None:
    """Per ``width``-second stretch: the tests running on each worker (the longest first)."""
    rows = [json.loads(line) for f in Path(directory).glob("*.jsonl") for line in f.read_text().splitlines()]
    if not rows:
        return
    t0 = min(r["start"] for r in rows)
    end = max(r["end"] for r in rows)
    t = t0
    while t < end:
        running = [r for r in rows if r["start"] < t + width and r["end"] > t]
        by_worker: dict[str, list[dict[str, Any]]] = {}
        for r in running:
            by_worker.setdefault(r["worker"], []).append(r)
        cells = []
        for worker in sorted(by_worker):
            longest = max(by_worker[worker], key=lambda r: min(r["end"], t + width) - max(r["start"], t))
            cells.append(f"{worker}: {longest['test'].split('::')[-1][:50]} (+{len(by_worker[worker]) - 1})")
        print(f"{t - t0:6.0f} s  " + " | ".join(cells))
        t += width


if __name__ == "__main__":
    _report(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 10.0)
