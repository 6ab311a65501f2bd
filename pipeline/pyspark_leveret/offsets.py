"""Offset planning for stream reads, as pure functions (no broker, no Spark): what ``startingOffsets`` /
``endingOffsets`` mean per queue, how far one micro-batch may go under a read limit, and how a batch's
ranges split into partitions.

An offset map is ``{queue name: stream offset}``, JSON-able as Spark's checkpoint stores it; a range is
``[start, end)``, end exclusive (``end`` is the next offset to read). Everything here is deterministic:
the same inputs give the same plan, which is what lets Spark replay a batch after a crash.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark_leveret.client import StreamStats

EARLIEST, LATEST = "earliest", "latest"
ERROR = "error"  # startingOffsetsByTimestampStrategy: a starting timestamp no message reaches fails the read


@dataclass(frozen=True)
class AtTime:
    """A position given as a time: the first offset appended at or after ``ms`` (epoch milliseconds), as
    Kafka's offsetsForTimes answers; the broker is asked (time_offsets.py)."""

    ms: int


OffsetSpec = int | str | AtTime  # an offset, EARLIEST / LATEST, or a time


class DataLossError(Exception):
    """Offsets a read needs are gone (retention removed their segments). Set ``failOnDataLoss=false`` to skip
    ahead to what the stream still has."""


@dataclass(frozen=True)
class Range:
    """Offsets ``[start, end)`` of one stream queue: one Spark task reads one range."""

    queue: str
    start: int
    end: int

    def __len__(self) -> int:
        return max(0, self.end - self.start)


def _one_spec(value: object, option: str) -> OffsetSpec:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"option {option}: offsets are ≥ 0, got {value}")
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in (EARLIEST, LATEST):
            return text
        if text.isdigit():
            return int(text)
    raise ValueError(f"option {option}: expected earliest, latest, an offset or a JSON object of them "
                     f"per queue, got {value!r}")


def parse_offsets_option(value: str | None, queues: list[str], default: str, option: str) -> dict[str, OffsetSpec]:
    """``earliest`` / ``latest`` / an integer for every queue, or a JSON object ``{"queue": spec}``; a queue
    the object leaves out gets ``default``; a name that is not one of ``queues`` is refused (a typo would
    otherwise silently read from the default)."""
    if value is None or not value.strip():
        return {q: default for q in queues}
    text = value.strip()
    if text.startswith("{"):
        try:
            given = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"option {option}: invalid JSON: {exc}") from exc
        if not isinstance(given, dict):
            raise ValueError(f"option {option}: a JSON object of offsets per queue expected")
        unknown = sorted(set(given) - set(queues))
        if unknown:
            raise ValueError(f"option {option} names queues {unknown} that are not read (queues: {queues})")
        return {q: _one_spec(given[q], option) if q in given else default for q in queues}
    spec = _one_spec(text, option)
    return {q: spec for q in queues}


def _one_time(value: object, option: str) -> AtTime:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return AtTime(value)
    raise ValueError(f"option {option}: expected a time in milliseconds since the epoch (e.g. 1700000000000), "
                     f"got {value!r}")


def parse_positions(offsets: str | None, timestamp: str | None, by_timestamp: str | None, queues: list[str],
                    default: str, prefix: str) -> dict[str, OffsetSpec]:
    """Where a read starts (``prefix`` ``starting``) or ends (``ending``) per queue, from Kafka's three
    options, the first given winning as in Kafka: ``{prefix}Timestamp`` (epoch ms, every queue),
    ``{prefix}OffsetsByTimestamp`` (``{"queue": ms}``; unlike Kafka, queues it leaves out take their
    ``{prefix}Offsets`` position instead of failing), ``{prefix}Offsets``."""
    specs = parse_offsets_option(offsets, queues, default, f"{prefix}Offsets")
    if timestamp is not None and timestamp.strip():
        return {q: _one_time(timestamp, f"{prefix}Timestamp") for q in queues}
    if by_timestamp is not None and by_timestamp.strip():
        option = f"{prefix}OffsetsByTimestamp"
        try:
            given = json.loads(by_timestamp)
        except json.JSONDecodeError as exc:
            raise ValueError(f"option {option}: invalid JSON: {exc}") from exc
        if not isinstance(given, dict):
            raise ValueError(f'option {option}: a JSON object of times per queue expected, e.g. {{"orders": '
                             f"1700000000000}}")
        unknown = sorted(set(given) - set(queues))
        if unknown:
            raise ValueError(f"option {option} names queues {unknown} that are not read (queues: {queues})")
        specs.update({q: _one_time(ms, option) for q, ms in given.items()})
    return specs


def times_in(specs: Mapping[str, OffsetSpec]) -> list[tuple[str, int]]:
    """The ``(queue, ms)`` of every time position: what the broker must be asked before :func:`resolve`."""
    return [(q, spec.ms) for q, spec in specs.items() if isinstance(spec, AtTime)]


def resolve(specs: Mapping[str, OffsetSpec], stats: Mapping[str, StreamStats],
            found: Mapping[tuple[str, int], int | None] | None = None, no_match: str = LATEST,
            option: str = "startingOffsetsByTimestamp") -> dict[str, int]:
    """Specs made offsets with the streams' extent now: earliest → first retained, latest → next offset, a
    time → the offset ``found`` for it (time_offsets.py), never beyond the next offset seen in ``stats``
    (messages appended since: the planner reads the stream as it saw it). A time no retained message
    reaches is the next offset with ``no_match`` LATEST (Kafka's rule for ending times, and its ``latest``
    strategy for starting ones) or an error naming the queue with ERROR."""
    out: dict[str, int] = {}
    for q, spec in specs.items():
        if spec == EARLIEST:
            out[q] = stats[q].first_offset
        elif spec == LATEST:
            out[q] = stats[q].next_offset
        elif isinstance(spec, AtTime):
            hit = (found or {})[(q, spec.ms)]
            if hit is None and no_match == ERROR:
                s = stats[q]
                held = f"offsets {s.first_offset}..{s.next_offset - 1}" if s.messages > 0 else "no message"
                raise ValueError(f"option {option}: no message of queue '{q}' was appended at or after "
                                 f"{spec.ms} ({_iso(spec.ms)}); it holds {held}. Set option "
                                 "startingOffsetsByTimestampStrategy=latest to start such a queue at its end.")
            out[q] = stats[q].next_offset if hit is None else min(hit, stats[q].next_offset)
        else:
            out[q] = int(spec)
    return out


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")


def missing_offsets(start: Mapping[str, int], stats: Mapping[str, StreamStats],
                    end: Mapping[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """Per queue, the offsets ``[start, first_offset)`` (capped at ``end``) that retention has removed."""
    out: dict[str, tuple[int, int]] = {}
    for q, s in start.items():
        if q in stats and s < stats[q].first_offset:
            upto = stats[q].first_offset if end is None else min(stats[q].first_offset, end.get(q, s))
            if upto > s:
                out[q] = (s, upto)
    return out


def data_loss_message(missing: Mapping[str, tuple[int, int]]) -> str:
    parts = ", ".join(f"queue '{q}' offsets {a}..{b - 1}" for q, (a, b) in sorted(missing.items()))
    return (f"data loss: {parts} are no longer in the stream (retention removed them). Set option "
            "failOnDataLoss=false to skip to the first retained offset.")


def _share(budget: float, demands: Mapping[str, float]) -> dict[str, float]:
    """``budget`` shared in proportion to ``demands`` (each capped at its demand)."""
    total = sum(demands.values())
    if total <= budget:
        return dict(demands)
    return {q: budget * d / total for q, d in demands.items()}


def _apportion(budget: int, available: Mapping[str, int]) -> dict[str, int]:
    """Whole records per queue summing to ``min(budget, total)``, proportional to what each has available;
    the remainder goes to the largest fractions (ties by name): deterministic, and no queue is starved."""
    total = sum(available.values())
    if total <= budget:
        return dict(available)
    exact = {q: budget * n / total for q, n in available.items()}
    out = {q: math.floor(x) for q, x in exact.items()}
    left = budget - sum(out.values())
    for q in sorted(exact, key=lambda q: (-(exact[q] - out[q]), q)):
        if left <= 0:
            break
        if out[q] < available[q]:
            out[q] += 1
            left -= 1
    return out


def cap_end(start: Mapping[str, int], target: Mapping[str, int], stats: Mapping[str, StreamStats],
            max_records: int | None = None, max_bytes: int | None = None) -> dict[str, int]:
    """The end of the next micro-batch: ``target`` (what is readable now, per queue), capped so the batch
    holds at most ``max_records`` records and about ``max_bytes`` payload bytes over all queues (bytes are
    estimated from each stream's ``stream_bytes`` / retained messages). A batch always makes progress when
    something is readable: at least one record, even when one message is bigger than ``max_bytes``.
    Offsets below a stream's first retained one cost nothing here (a read skips them: failOnDataLoss=false)."""
    begin = {q: max(start[q], stats[q].first_offset) if q in stats else start[q] for q in target}
    available = {q: max(0, target[q] - begin[q]) for q in target}
    allowed = dict(available)
    if max_records is not None:
        allowed = _apportion(max(1, max_records), allowed)
    if max_bytes is not None:
        size = {q: stats[q].bytes_per_message if q in stats else 0.0 for q in target}
        shares = _share(float(max_bytes), {q: allowed[q] * size[q] for q in target})
        by_bytes = {q: allowed[q] if size[q] <= 0 else min(allowed[q], math.floor(shares[q] / size[q]))
                    for q in target}
        if sum(by_bytes.values()) == 0 and sum(allowed.values()) > 0:
            first = min(q for q in target if allowed[q] > 0)
            by_bytes[first] = 1
        allowed = by_bytes
    # Never backwards; a queue with nothing allowed stays where it is (a range made only of removed offsets
    # with nothing after them would leave its read waiting for an offset that does not exist yet).
    return {q: max(start[q], begin[q] + allowed[q]) if allowed[q] > 0 else start[q] for q in target}


def split_ranges(start: Mapping[str, int], end: Mapping[str, int], max_per_partition: int | None = None,
                 min_partitions: int | None = None) -> list[Range]:
    """The ranges ``[start[q], end[q])`` of one batch, cut so that no piece exceeds ``max_per_partition``
    records and there are at least ``min_partitions`` pieces (the biggest piece is halved until then, as
    long as pieces have two records or more). A queue absent from ``start`` is new to the query: its range
    is empty this batch (its start is ``end``). Ordered by queue, then offset; empty ranges are dropped."""
    ranges: list[Range] = []
    for q in sorted(end):
        s, e = start.get(q, end[q]), end[q]
        if e <= s:
            continue
        if max_per_partition and max_per_partition > 0:
            pieces = math.ceil((e - s) / max_per_partition)
        else:
            pieces = 1
        ranges.extend(_even(q, s, e, pieces))
    if min_partitions and len(ranges) < min_partitions:
        while len(ranges) < min_partitions:
            biggest = max(range(len(ranges)), key=lambda i: (len(ranges[i]), -i), default=None)
            if biggest is None or len(ranges[biggest]) < 2:
                break
            r = ranges[biggest]
            ranges[biggest:biggest + 1] = _even(r.queue, r.start, r.end, 2)
    return ranges


def _even(queue: str, start: int, end: int, pieces: int) -> list[Range]:
    """``[start, end)`` in ``pieces`` contiguous ranges whose sizes differ by one at most."""
    n = end - start
    pieces = max(1, min(pieces, n))
    bounds = [start + (n * i) // pieces for i in range(pieces + 1)]
    return [Range(queue, bounds[i], bounds[i + 1]) for i in range(pieces)]
