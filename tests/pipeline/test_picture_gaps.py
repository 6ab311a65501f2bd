"""Issue 32, defect 4: the traffic picture drew a straight line across minutes with no rows (it showed ~50
msg/s for an idle minute). The traffic table has rows only for minutes with events; the picture must draw an
idle gap as zero messages/s and break its latency lines there. No Spark here: the picture reads the table
(pyarrow), as ``leveret-pipeline traffic`` hands it over."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow as pa
from leveret_pipeline import picture

START = pd.Timestamp("2026-01-05 10:00", tz="UTC")
BUSY = [0, 1, 2, 10, 11]  # minutes with rows; 3..9 were idle


def table() -> pa.Table:
    n = len(BUSY)
    return pa.table({
        "vhost": ["/"] * n, "queue": ["orders"] * n,
        "minute": pa.array([(START + pd.Timedelta(minutes=m)).to_pydatetime() for m in BUSY],
                           pa.timestamp("ms", tz="UTC")),
        "published": [3000] * n, "delivered": [3000] * n,  # 50 msg/s in each busy minute
        "publish_to_deliver_p50_ms": [5] * n, "publish_to_deliver_p99_ms": [20] * n,
        "deliver_to_ack_p50_ms": [2] * n, "deliver_to_ack_p99_ms": [9] * n,
    })


def by_minute(line) -> dict[int, float]:
    """A drawn line's points, by minute after START."""
    import matplotlib.dates as mdates

    out = {}
    for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
        when = pd.Timestamp(mdates.num2date(x) if isinstance(x, float) else x)
        when = when.tz_localize("UTC") if when.tzinfo is None else when
        out[round((when - START).total_seconds() / 60)] = float(y)
    return out


def test_an_idle_gap_is_drawn_as_zero_and_breaks_the_latency_lines(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = picture.figure(table())
    try:
        rates, waits, _acks = fig.axes[:3]
        lines = {line.get_label(): line for line in rates.get_lines()}
        published = by_minute(lines["orders published"])
        assert sorted(published) == list(range(12)), "every minute of the span is drawn"
        assert all(published[m] == 0 for m in range(3, 10)), published
        assert all(published[m] == 50 for m in BUSY), published
        p50 = by_minute(next(line for line in waits.get_lines() if line.get_label() == "orders p50"))
        assert all(math.isnan(p50[m]) for m in range(3, 10)), p50  # no latency for an idle minute: a break
        assert all(p50[m] == 5 for m in BUSY), p50
    finally:
        plt.close(fig)
    drawn = picture.draw(table(), tmp_path / "traffic.png")
    assert drawn is not None and drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
