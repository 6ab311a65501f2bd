"""Issue 14: the cost of one window load (``DelayStore._fill``) with a large time bucket.

What is measured: ``--count`` records (10 B bodies) are appended with due times uniform over one bucket
(an hour by default) and checkpointed; then a fake clock starts one minute into the bucket and advances by
``--step-ms`` per ``due()`` call for ``--minutes``, each batch marked dispatched. Every window load is timed
(``_fill`` wrapped): the first one (which, since the slices, also splits the bucket's index once) and the
ones after it (max and median) are reported, with the store's counters of index entries examined, entries
split and dispatch-log bytes read when it has them. The clock is injected, so nothing here waits; all the
time is the store's, on the calling thread (the broker's event loop).

    .venv/bin/python -m bench.delay_fill [--count 1000000] [--step-ms 5000] [--minutes 10] [--max-loaded 100000]

Run it against another tree (e.g. ``git archive HEAD | tar -x -C /tmp/old``) with ``PYTHONPATH=/tmp/old``
to compare.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

from storage.delay import DelayRecord, DelayStore


def run(count: int, bucket_ms: int, step_ms: int, minutes: float, max_loaded: int, seed: int) -> dict[str, Any]:
    t0 = 1_800_000_000_000 - 1_800_000_000_000 % bucket_ms
    now = [t0 - 10]
    d = tempfile.mkdtemp(prefix="delay-fill-")
    try:
        store = DelayStore(d, None, lambda: now[0], bucket_ms=bucket_ms, max_loaded=max_loaded,
                           checkpoint_bytes=1 << 40)
        rng = random.Random(seed)
        t = time.perf_counter()
        for _ in range(count):
            store.append(DelayRecord(t0 + rng.randrange(bucket_ms), 1, b"k", b"", b"x" * 10))
        store.checkpoint()
        append_s = time.perf_counter() - t

        fills: list[tuple[float, int]] = []  # (seconds, index entries examined)
        inner = store._fill

        def timed_fill(at: int) -> None:
            scanned = getattr(store, "fill_scanned", 0)
            t1 = time.perf_counter()
            inner(at)
            fills.append((time.perf_counter() - t1, getattr(store, "fill_scanned", 0) - scanned))

        store._fill = timed_fill  # type: ignore[method-assign, assignment]
        now[0] = t0 + 60_000
        end = now[0] + int(minutes * 60_000)
        handed = 0
        t = time.perf_counter()
        while now[0] < end:
            batch = store.due(100_000)
            handed += len(batch)
            store.dispatched(batch)
            now[0] += step_ms
        run_s = time.perf_counter() - t
        rest = [f for f, _ in fills[1:]]
        out = {
            "count": count, "bucket_ms": bucket_ms, "step_ms": step_ms, "max_loaded": max_loaded,
            "append_s": round(append_s, 2), "handed_out": handed, "dispatch_run_s": round(run_s, 2),
            "fills": len(fills),
            "first_fill_s": round(fills[0][0], 4) if fills else None,
            "first_fill_entries_examined": fills[0][1] if fills else None,
            "later_fill_max_s": round(max(rest), 4) if rest else None,
            "later_fill_median_s": round(statistics.median(rest), 4) if rest else None,
            "later_fill_entries_examined_max": max((n for _, n in fills[1:]), default=None),
            "entries_split": getattr(store, "fill_split", None),
            "disp_bytes_read": getattr(store, "fill_disp_read", None),
        }
        store.close()
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000, help="records in the bucket")
    ap.add_argument("--bucket-ms", type=int, default=3_600_000)
    ap.add_argument("--step-ms", type=int, default=5_000, help="fake-clock advance per due() call")
    ap.add_argument("--minutes", type=float, default=10, help="fake-clock time dispatched")
    ap.add_argument("--max-loaded", type=int, default=100_000, help="the window's cap")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print(json.dumps(run(a.count, a.bucket_ms, a.step_ms, a.minutes, a.max_loaded, a.seed), indent=2))


if __name__ == "__main__":
    main()
