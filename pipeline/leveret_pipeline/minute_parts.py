"""A minute's traffic as the sum of its micro-batches' parts: what each batch saw of a (vhost, minute), kept
in a small file of its own, and the merge of a minute's parts into its traffic rows.

Why parts and not a re-read of the minute's events: at 5,000 messages/s a minute holds some 900,000 trace
events, and every 10 s batch touches the current minute; recomputing it from its events read up to six times
the batch's own events again, each batch. A part holds, per queue, the batch's counters (``published``,
``acked``, …) and the *exact* histogram of its latency samples (one row per distinct latency in ms and
measure): counters add up and histograms merge, so a minute's row is the sum of its parts however the
batches cut it — and its quantiles are exact, of all the minute's samples together, not quantiles of
quantiles. A part has a row per distinct latency, not per sample: a few hundred rows per queue and batch at
millisecond latencies.

Exactly-once: a part is named by its batch (``batch=N.parquet``) and written beside its final name, then
renamed over it; a batch run again (same offsets, same state: same part) replaces its own part and no other,
so a minute's merge never counts a batch twice.

Layout: ``parts/vhost=V/date=D/minute=M/batch=N.parquet`` (V escaped as Spark escapes a partition value, M the
minute's start in ms since the epoch). Retention is the operator's, as for the traffic table: a part is
needed while a late event may still touch its minute; deleting a day's parts once the day is complete loses
nothing the traffic table does not hold.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REASONS = ("expired", "rejected", "maxlen", "delivery_limit")  # x-death's reasons, as broker/observability/trace.py sends
COUNTERS = ("published", "published_bytes", "delivered", "delivered_bytes", "redelivered", "acked",
            "dead_lettered", *[f"dead_lettered_{r}" for r in REASONS])
LATENCIES = ("publish_to_deliver", "deliver_to_ack")
QUANTILES = (0.5, 0.95, 0.99)

# A part's rows: a counter (``measure`` a COUNTERS name, ``latency_ms`` null, ``n`` its value) or a histogram
# bin (``measure`` a LATENCIES name, ``n`` samples of exactly ``latency_ms``).
PART_SCHEMA = pa.schema([
    ("queue", pa.string()),
    ("measure", pa.string()),
    ("latency_ms", pa.int64()),
    ("n", pa.int64()),
])

# One traffic file's columns (vhost and date are its directory names, as Spark and pyarrow read them).
TRAFFIC_SCHEMA = pa.schema([
    ("queue", pa.string()),
    ("minute", pa.timestamp("ms", tz="UTC")),
    *[(name, pa.int64()) for name in COUNTERS],
    *[field for name in LATENCIES for field in (
        (f"{name}_n", pa.int64()), *[(f"{name}_p{int(q * 100)}_ms", pa.int64()) for q in QUANTILES])],
])


def escape_partition(value: str) -> str:
    """A partition value as a directory name, as Spark escapes it (and Spark and pyarrow unescape it):
    ``%XX`` for the characters a path or Hive cannot hold; other characters, non-ASCII too, as they are."""
    special = set('"#%\'*/:=?\\[]^{}') | {chr(c) for c in range(32)} | {"\x7f"}
    return "".join(f"%{ord(c):02X}" if c in special else c for c in value)


def write_atomically(table: pa.Table, path: Path) -> None:
    """Beside the target, then renamed over it: readers (and a crash) see the old file or the new one.
    The leading dot keeps the half-written file out of Spark's and pyarrow's listings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def minute_dir(root: Path, vhost: str, date: str, minute: int) -> Path:
    return root / f"vhost={escape_partition(vhost)}" / f"date={date}" / f"minute={minute}"


def write_parts(root: Path, parts: pa.Table, batch_id: int) -> None:
    """A batch's parts (columns vhost, date, minute and PART_SCHEMA's), one file per (vhost, date, minute)."""
    keys = parts.select(["vhost", "date", "minute"]).group_by(["vhost", "date", "minute"]).aggregate([])
    for vhost, date, minute in zip(*(keys[c].to_pylist() for c in ("vhost", "date", "minute")), strict=True):
        mine = parts.filter(pc.and_(pc.and_(pc.equal(parts["vhost"], vhost), pc.equal(parts["date"], date)),
                                    pc.equal(parts["minute"], minute)))
        write_atomically(mine.select(PART_SCHEMA.names).cast(PART_SCHEMA),
                         minute_dir(root, vhost, date, minute) / f"batch={batch_id}.parquet")


def read_minute(root: Path, vhost: str, date: str, minute: int) -> pa.Table:
    """Every part of one minute (its batches' files), PART_SCHEMA's columns."""
    directory = minute_dir(root, vhost, date, minute)
    files = sorted(p for p in directory.glob("batch=*.parquet")) if directory.is_dir() else []
    if not files:
        return PART_SCHEMA.empty_table()
    return pa.concat_tables(pq.read_table(f).cast(PART_SCHEMA) for f in files)


def read_minutes(root: Path, first_minute: int, last_minute: int) -> pa.Table:
    """Every part of every vhost's minutes from ``first_minute`` to ``last_minute`` (ms), with a ``vhost``
    column (unescaped) — a run's summary."""
    import urllib.parse

    tables = []
    for vhost_dir in sorted(root.glob("vhost=*")) if root.is_dir() else []:
        vhost = urllib.parse.unquote(vhost_dir.name.partition("=")[2])
        for minute_path in sorted(vhost_dir.glob("date=*/minute=*")):
            minute = int(minute_path.name.partition("=")[2])
            if first_minute <= minute <= last_minute:
                for f in sorted(minute_path.glob("batch=*.parquet")):
                    table = pq.read_table(f).cast(PART_SCHEMA)
                    tables.append(table.append_column("vhost", pa.array([vhost] * len(table), pa.string())))
    if not tables:
        return PART_SCHEMA.empty_table().append_column("vhost", pa.array([], pa.string()))
    return pa.concat_tables(tables)


def quantile(bins: Sequence[tuple[int, int]], q: float) -> int:
    """The smallest latency whose cumulative count reaches ``q`` of all samples (``bins``: (latency, count)
    sorted by latency) — what Spark's percentile_approx answers when exact: p50 of {0, 1000} is 0."""
    total = sum(n for _, n in bins)
    need = q * total
    seen = 0
    for latency, n in bins:
        seen += n
        if seen >= need:
            return latency
    return bins[-1][0]


def merge(parts: pa.Table, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Parts → one dict per distinct ``keys`` (columns of ``parts``): the COUNTERS summed, and per LATENCIES
    measure its sample count and QUANTILES (None without samples). Sorted by ``keys``."""
    keys = list(keys)
    summed = parts.group_by([*keys, "measure", "latency_ms"]).aggregate([("n", "sum")])
    columns = {c: summed[c].to_pylist() for c in (*keys, "measure", "latency_ms", "n_sum")}
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    bins: dict[tuple[tuple[Any, ...], str], list[tuple[int, int]]] = {}
    for i, measure in enumerate(columns["measure"]):
        key = tuple(columns[c][i] for c in keys)
        row = rows.get(key)
        if row is None:
            row = rows[key] = {**dict(zip(keys, key, strict=True)), **dict.fromkeys(COUNTERS, 0)}
        latency, n = columns["latency_ms"][i], columns["n_sum"][i]
        if latency is None:
            row[measure] = n
        else:
            bins.setdefault((key, measure), []).append((latency, n))
    for key, row in rows.items():
        for name in LATENCIES:
            ordered = sorted(bins.get((key, name), ()))
            row[f"{name}_n"] = sum(n for _, n in ordered)
            for q in QUANTILES:
                row[f"{name}_p{int(q * 100)}_ms"] = quantile(ordered, q) if ordered else None
    return [rows[k] for k in sorted(rows, key=_sort_key)]


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, v) for v in key)


def traffic_table(rows: Iterable[dict[str, Any]], minute: int) -> pa.Table:
    """Merged rows of one minute (keyed by queue) as traffic rows of TRAFFIC_SCHEMA."""
    listed = [{**r, "minute": minute} for r in rows]
    return pa.Table.from_pylist(listed, schema=TRAFFIC_SCHEMA) if listed else TRAFFIC_SCHEMA.empty_table()
