"""Memory stays flat reading a long stream from ``first`` (issue 12): build a stream of N records (10 M by
default, ~100-byte payloads, increasing timestamps) directly with the file stream store
(storage/stream_store.py) in a temporary directory on disk, reopen it, then read it all from offset 0 in
batches of 1,000 records, as a consumer does, sampling this process's resident memory after every batch.

The store keeps a few numbers per segment and a bounded tail of recent records, never anything per message,
so the read's peak RSS should stay within a few MiB of where it started whatever N is; that is what this
measures, with the append and read rates and the bytes on disk beside it.

    .venv/bin/python -m bench.stream_memory [--records 10000000] [--size 100] [--dir /tmp] [--keep] [--json]

The data (about 152 bytes per record: 112 in the message log, 40 in the consume log) goes in a temporary
directory under ``--dir``, checked for free space first, and is deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

from storage.segment import HEADER_SIZE
from storage.stream_store import DEFAULT_MESSAGE_SEGMENT_SIZE, ENTRY_SIZE, FileStreamLog, StreamStore
from storage.syncer import Syncer

STREAM_SEGMENT_BYTES = 500_000_000  # the broker's default x-stream-max-segment-size-bytes
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes of this process now (/proc/self/statm: cheap enough to read after every batch)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def disk_bytes(path: str) -> int:
    total = 0
    for d, _, names in os.walk(path):
        total += sum(os.path.getsize(os.path.join(d, n)) for n in names)
    return total


def payload_maker(size: int) -> Callable[[int], bytes]:
    """Payloads of ``size`` bytes that name their offset (so the read can check it got the right record)."""
    pad = b"p" * max(0, size - 12)

    def make(i: int) -> bytes:
        return (b"%011d:" % i + pad)[:size]

    return make


def open_store(directory: str) -> tuple[Syncer, StreamStore, FileStreamLog]:
    syncer = Syncer(None)  # no loop: flushes write and fsync inline, in this thread
    store = StreamStore(directory, syncer, message_segment_size=DEFAULT_MESSAGE_SEGMENT_SIZE)
    return syncer, store, store.open_stream("bench", max_segment_size_bytes=STREAM_SEGMENT_BYTES)


def build(directory: str, records: int, size: int, flush_every: int) -> dict[str, float]:
    """Append ``records`` records, flushing (write + fsync) every ``flush_every`` as the end of a burst does."""
    make = payload_maker(size)
    syncer, store, stream = open_store(directory)
    t0_ms = 1_700_000_000_000
    peak = rss()
    start = time.perf_counter()
    for i in range(records):
        stream.append(make(i), t0_ms + i)
        if i % flush_every == flush_every - 1:
            syncer.flush()
            peak = max(peak, rss())
            if i % (flush_every * 10) == flush_every * 10 - 1:
                print(f"  appended {i + 1:,}", file=sys.stderr, flush=True)
    syncer.flush()
    seconds = time.perf_counter() - start
    assert stream.next_offset == records
    store.close()
    syncer.close()
    return {"append_s": seconds, "append_per_s": records / seconds, "rss_peak_build": peak}


def read_all(directory: str, records: int, size: int, batch: int) -> dict[str, float]:
    """Reopen the store and read every record from offset 0, ``batch`` at a time, sampling RSS each batch."""
    make = payload_maker(size)
    t = time.perf_counter()
    syncer, store, stream = open_store(directory)
    store.finish_recovery()
    open_s = time.perf_counter() - t
    assert stream.next_offset == records, stream.next_offset
    before = peak = rss()
    samples = 0
    o = n = 0
    last_ts = -1
    start = time.perf_counter()
    while True:
        recs = stream.read(o, batch)
        if not recs:
            break
        first = recs[0]
        if first.offset != o or first.payload != make(o) or first.timestamp_ms <= last_ts:
            raise AssertionError(f"record {first.offset} (wanted {o}) is not what was appended")
        n += len(recs)
        o = recs[-1].offset + 1
        last_ts = recs[-1].timestamp_ms
        del recs, first
        peak = max(peak, rss())
        samples += 1
        if n % 1_000_000 == 0:
            print(f"  read {n:,}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    after = rss()
    if n != records:
        raise AssertionError(f"read {n} records of {records}")
    store.close()
    syncer.close()
    return {"open_s": open_s, "read_s": seconds, "read_per_s": n / seconds, "rss_before_read": before,
            "rss_peak_read": peak, "rss_after_read": after, "rss_samples": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--size", type=int, default=100, help="payload bytes")
    ap.add_argument("--batch", type=int, default=1_000, help="records per read, as a consumer's prefetch")
    ap.add_argument("--flush-every", type=int, default=10_000, help="appends per burst (write + fsync)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary data directory goes")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = ap.parse_args(argv)

    need = int(args.records * (args.size + HEADER_SIZE + ENTRY_SIZE) * 1.1) + (256 << 20)
    free = shutil.disk_usage(args.dir).free
    if free < need:
        print(f"not enough free space in {args.dir}: {free >> 20} MiB free, {need >> 20} MiB needed", file=sys.stderr)
        return 2
    directory = tempfile.mkdtemp(prefix="leveret-stream-memory-", dir=args.dir)
    try:
        rss_start = rss()
        print(f"building {args.records:,} records of {args.size} B in {directory}", file=sys.stderr)
        built = build(directory, args.records, args.size, args.flush_every)
        rss_built = rss()
        on_disk = disk_bytes(directory)
        print("reading from offset 0", file=sys.stderr)
        read = read_all(directory, args.records, args.size, args.batch)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    result = {"records": args.records, "payload_bytes": args.size, "batch": args.batch, "rss_start": rss_start,
              "rss_after_build": rss_built, "disk_bytes": on_disk, **built, **read,
              "loadavg_1m": os.getloadavg()[0], "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result))
        return 0
    mib = 1 << 20
    print(f"records              {args.records:,} × {args.size} B payload, read in batches of {args.batch:,}")
    print(f"append               {built['append_per_s']:,.0f} records/s ({built['append_s']:.1f} s, "
          f"a write + fsync every {args.flush_every:,})")
    print(f"reopen               {read['open_s']:.2f} s")
    print(f"read from first      {read['read_per_s']:,.0f} records/s ({read['read_s']:.1f} s)")
    print(f"disk                 {on_disk:,} bytes ({on_disk / args.records:.1f} per record)")
    print(f"RSS start            {rss_start / mib:.1f} MiB")
    print(f"RSS peak build       {built['rss_peak_build'] / mib:.1f} MiB")
    print(f"RSS after build      {rss_built / mib:.1f} MiB")
    print(f"RSS before read      {read['rss_before_read'] / mib:.1f} MiB")
    print(f"RSS peak during read {read['rss_peak_read'] / mib:.1f} MiB (+{(read['rss_peak_read'] - read['rss_before_read']) / mib:.1f} MiB, "
          f"{read['rss_samples']:,} samples)")
    print(f"RSS after read       {read['rss_after_read'] / mib:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
