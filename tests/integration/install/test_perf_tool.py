"""`leveret perf`, the load generator (broker/tools/perf.py; docs/decisions/performance.md), runs against a broker given by URL and reports
publish and consume rates and latency percentiles as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_leveret_perf_measures_a_short_run(broker, tmp_path):
    out = tmp_path / "result.json"
    run = subprocess.run([sys.executable, "-m", "broker", "perf", "--url", broker.url, "-x", "1", "-y", "1",
                          "-s", "64", "--time", "2", "--json-out", str(out)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    text = json.dumps(result)
    assert "publish" in run.stdout and "consume" in run.stdout
    assert '"p99' in text or "p99" in run.stdout
    rates = [v for k, v in _walk(result) if k in ("publish_rate", "consume_rate")]
    assert rates and all(r > 0 for r in rates), result


def _walk(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)):
                yield from _walk(v, k)
            else:
                yield k, v
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v, prefix)


def _perf(url: str, out, *args: str) -> dict:
    run = subprocess.run([sys.executable, "-m", "broker", "perf", "--url", url, "--json-out", str(out), *args],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(out.read_text())


def test_perf_reads_a_stream_from_first_and_counts_its_offsets(broker, tmp_path):
    """--queue-type stream declares a stream, --stream-offset first starts the consumer at its first offset:
    a backlog published before the consumer starts is read in full, every delivery carrying its offset."""
    result = _perf(broker.url, tmp_path / "r.json", "--queue-prefix", "perf-stream-first", "--queue-type",
                   "stream", "--stream-offset", "first", "-s", "256", "--confirm", "100", "--ack",
                   "--prefetch", "100", "--backlog", "2000")
    assert not result["errors"], result["errors"]
    assert result["drain_rate"] > 0
    st = result["stream"]
    assert st["first_offset"] == 0 and st["distinct_offsets"] >= 2000, st
    assert st["duplicates"] == 0 and st["no_offset"] == 0, st


@pytest.mark.leveret_only
def test_perf_consumer_group_gets_each_offset_once(broker, tmp_path):
    """--consumer-arg x-stream-group=NAME puts the consumers in one Leveret consumer group: together they receive
    each offset once (duplicates counted from the x-stream-offset headers)."""
    result = _perf(broker.url, tmp_path / "r.json", "--queue-prefix", "perf-stream-group", "--queue-type",
                   "stream", "--stream-offset", "first", "-s", "16", "-y", "3", "--ack", "--prefetch", "50",
                   "--consumer-arg", "x-stream-group=perf-test", "--rate", "2000", "--time", "2")
    assert not result["errors"], result["errors"]
    st = result["stream"]
    assert st["deliveries"] > 0 and st["duplicates"] == 0 and st["no_offset"] == 0, st
    assert result["consumers"]["count"] == 3, result["consumers"]
    assert st["distinct_offsets"] >= result["consumers"]["max"], st
