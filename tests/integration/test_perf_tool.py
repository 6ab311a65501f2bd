"""`leveret perf`, the load generator of bench/ (issue 6), runs against a broker given by URL and reports
publish and consume rates and latency percentiles as JSON."""

from __future__ import annotations

import json
import subprocess
import sys


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
