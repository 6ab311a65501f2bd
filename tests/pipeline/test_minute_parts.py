"""The traffic job's minute parts (pipeline/leveret_pipeline/minute_parts.py), without a JVM: a minute merged
from its batches' parts has the counters and the exact quantiles of all its samples however the batches cut
it, and a batch written again replaces its part instead of adding to the minute."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from leveret_pipeline.minute_parts import (
    COUNTERS,
    PART_SCHEMA,
    QUANTILES,
    merge,
    quantile,
    read_minute,
    read_minutes,
    traffic_table,
    write_parts,
)

MINUTE = 1_700_000_040_000


def _exact(samples: list[int], q: float) -> int:
    """The smallest sample with at least q of all samples at or below it."""
    ordered = sorted(samples)
    for i, value in enumerate(ordered):
        if i + 1 >= q * len(ordered):
            return value
    return ordered[-1]


def _part(queue: str, counters: dict[str, int], samples: dict[str, list[int]]) -> pa.Table:
    rows = [{"queue": queue, "measure": k, "latency_ms": None, "n": v} for k, v in counters.items()]
    for measure, values in samples.items():
        for latency in sorted(set(values)):
            rows.append({"queue": queue, "measure": measure, "latency_ms": latency, "n": values.count(latency)})
    return pa.Table.from_pylist(rows, schema=PART_SCHEMA)


def test_quantile_is_the_smallest_value_reaching_the_rank() -> None:
    assert quantile([(0, 1), (1000, 1)], 0.5) == 0  # as the hand-built trace test expects of percentile_approx
    assert quantile([(0, 1), (1000, 1)], 0.99) == 1000
    bins = [(v, 1) for v in range(1, 101)]
    assert (quantile(bins, 0.5), quantile(bins, 0.95), quantile(bins, 0.99)) == (50, 95, 99)
    assert quantile([(7, 1_000)], 0.99) == 7


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5_000), min_size=1, max_size=400), st.integers(1, 6), st.randoms())
def test_a_minute_merged_from_any_cut_has_the_quantiles_of_all_its_samples(
        samples: list[int], batches: int, rnd: random.Random) -> None:
    cuts = [[] for _ in range(batches)]  # type: list[list[int]]
    for value in samples:
        cuts[rnd.randrange(batches)].append(value)
    parts = pa.concat_tables(_part("q", {"published": len(cut), "acked": 1}, {"deliver_to_ack": cut})
                             for cut in cuts)
    [row] = merge(parts, ["queue"])
    assert row["published"] == len(samples) and row["acked"] == batches
    assert row["deliver_to_ack_n"] == len(samples)
    for q in QUANTILES:
        assert row[f"deliver_to_ack_p{int(q * 100)}_ms"] == _exact(samples, q)
    assert row["publish_to_deliver_n"] == 0 and row["publish_to_deliver_p99_ms"] is None
    assert all(row[c] == 0 for c in COUNTERS if c not in ("published", "acked"))


def test_a_batch_written_again_replaces_its_part(tmp_path: Path) -> None:
    def batch(queue_counts: dict[str, int]) -> pa.Table:
        table = pa.concat_tables(_part(q, {"published": n}, {"publish_to_deliver": [n]})
                                 for q, n in queue_counts.items())
        extra = {"vhost": ["/"] * len(table), "date": ["2023-11-14"] * len(table), "minute": [MINUTE] * len(table)}
        for name, values in extra.items():
            table = table.append_column(name, pa.array(values))
        return table

    write_parts(tmp_path, batch({"a": 1, "b": 2}), batch_id=0)
    write_parts(tmp_path, batch({"a": 10}), batch_id=1)
    write_parts(tmp_path, batch({"a": 10}), batch_id=1)  # the same batch run again
    rows = {r["queue"]: r for r in merge(read_minute(tmp_path, "/", "2023-11-14", MINUTE), ["queue"])}
    assert (rows["a"]["published"], rows["b"]["published"]) == (11, 2)
    assert (rows["a"]["publish_to_deliver_n"], rows["a"]["publish_to_deliver_p50_ms"]) == (2, 1)
    assert not list(tmp_path.rglob(".*.tmp"))  # nothing half-written left beside the parts

    table = traffic_table(merge(read_minute(tmp_path, "/", "2023-11-14", MINUTE), ["queue"]), MINUTE)
    assert table.column("queue").to_pylist() == ["a", "b"]
    assert table.column("minute")[0].as_py().timestamp() * 1000 == MINUTE

    summary = merge(read_minutes(tmp_path, MINUTE, MINUTE), ["vhost", "queue"])
    assert [(r["vhost"], r["queue"], r["published"]) for r in summary] == [("/", "a", 11), ("/", "b", 2)]
    assert merge(read_minutes(tmp_path, MINUTE + 60_000, MINUTE + 120_000), ["vhost", "queue"]) == []
