"""A deduplication window of 10 million ids (issue 38: at most 64 bytes of RAM an id, surviving a restart).

The cache a queue declared with ``x-message-deduplication: true, x-cache-size: N`` keeps (broker/
deduplication.py, its ring broker/deduplication_ring.py, its log storage/deduplication_log.py), built as the
broker builds it on a node's storage in a temporary directory on disk, filled with N distinct 36-character
ids (UUID-like, as a producer's message ids are) in bursts of 1,000 admissions, each burst's log records
written and fsynced as the node's syncer does between loop turns. Then, in a fresh process (so that nothing
of the fill is resident), the cache is opened again as after a restart: its log replayed, every id checked
as a duplicate on a sample, and one more burst admitted.

Prints, per phase: seconds, admissions or replayed records per second, and the resident memory the cache
added, in all and per id (VmRSS before and after; the log's files are read through a memory map, so the
figure after the reopen is the cache's, read once the map is closed). ``--json`` prints them as JSON.

    .venv/bin/python -m bench.dedup_scale [--ids 10000000] [--dir /tmp] [--json]

The log takes 36 bytes an id on disk (a 12-byte record header, the expiry, the digest), and up to about three
times the window before a rotation's snapshot replaces its older file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, ClassVar

from broker.clock import LoopClock
from broker.deduplication import DedupCache, DedupSettings, digest_key, encode_key, open_cache
from storage.node_storage import NodeStorage

_PAGE = os.sysconf("SC_PAGE_SIZE")
BURST = 1000


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def ids(start: int, n: int) -> list[bytes]:
    """``n`` distinct ids as the cache keys them (a long string header of 36 characters), from a counter."""
    return [digest_key(encode_key(str(uuid.UUID(int=i))) or b"") for i in range(start, start + n)]


class _Msg:
    """What admit() reads of a message: its headers (none here: no per-message TTL)."""

    headers: ClassVar[dict[str, Any]] = {}


def _open(data_dir: str, n: int, recovered: bool) -> tuple[NodeStorage, DedupCache]:
    storage = NodeStorage(data_dir)
    cache = open_cache(DedupSettings(n), LoopClock(), storage, "queue", "/", "q", durable=True, recovered=recovered)
    return storage, cache


def fill(data_dir: str, n: int) -> dict[str, Any]:
    gc.collect()
    before = rss()
    storage, cache = _open(data_dir, n, recovered=False)
    msg = _Msg()
    started = time.perf_counter()
    for burst in range(0, n, BURST):
        for key in ids(burst, min(BURST, n - burst)):
            if not cache.seen(key):
                cache.admit(key, msg)  # type: ignore[arg-type]
        storage.syncer.flush()  # the burst's log records written and fsynced (inline: no loop here)
    seconds = time.perf_counter() - started
    grown = rss() - before
    assert len(cache) == n, len(cache)
    cache.close()
    storage.close()
    return {"ids": n, "seconds": round(seconds, 1), "admissions_per_s": round(n / seconds),
            "rss_added_mib": round(grown / 2**20, 1), "rss_bytes_per_id": round(grown / n, 1)}


def reopen(data_dir: str, n: int) -> dict[str, Any]:
    gc.collect()
    before = rss()
    started = time.perf_counter()
    storage, cache = _open(data_dir, n, recovered=True)
    seconds = time.perf_counter() - started
    grown = rss() - before
    held = len(cache)
    sample = [i * (n // 1000) for i in range(1000)]
    kept = sum(cache.seen(ids(i, 1)[0]) for i in sample)
    new = ids(n, BURST)
    assert not any(cache.seen(k) for k in new)
    for key in new:
        cache.admit(key, _Msg())  # type: ignore[arg-type]
    storage.syncer.flush()
    result = {"ids": held, "seconds": round(seconds, 1), "replayed_per_s": round(n / seconds),
              "rss_added_mib": round(grown / 2**20, 1), "rss_bytes_per_id": round(grown / n, 1),
              "sample_still_duplicates": f"{kept}/{len(sample)}",
              "log_bytes": sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(data_dir)
                               for f in files if f.endswith(".dlog"))}
    cache.close()
    storage.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dedup_scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=10_000_000)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--phase", choices=("fill", "reopen"), help=argparse.SUPPRESS)  # the child processes
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase:
        result = fill(args.data_dir, args.ids) if args.phase == "fill" else reopen(args.data_dir, args.ids)
        print(json.dumps(result))
        return 0
    data_dir = tempfile.mkdtemp(prefix="leveret-dedup-", dir=args.dir)
    try:
        results = {}
        for phase in ("fill", "reopen"):  # each in a process of its own: the reopen starts with nothing resident
            out = subprocess.run([sys.executable, "-m", "bench.dedup_scale", "--phase", phase, "--data-dir", data_dir,
                                  "--ids", str(args.ids)], check=True, capture_output=True, text=True).stdout
            results[phase] = json.loads(out.strip().splitlines()[-1])
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for phase, result in results.items():
            print(phase, " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
