"""The traffic table as one PNG: per queue over time, the message rates and the two latencies.

matplotlib with the Agg backend (no display: the job runs on servers and in CI). Three panels sharing the
time axis, one colour per queue throughout: published/s (solid) and delivered/s (dashed); publish→deliver
p50 (solid) and p99 (dotted); deliver→ack p50 and p99. Latency axes are logarithmic above 1 ms (linear
below, so the 0 ms of a message handed straight to a waiting consumer is drawn): a queue at 2 ms and a
backlogged one at 2 minutes must both be readable. Only the busiest queues are drawn (a legend of 200 lines
helps nobody); the summary table lists them all.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa


def _label(vhost: str, queue: str, vhosts: int) -> str:
    return queue if vhosts == 1 else f"{queue} ({vhost})"


def _minute_ticks(first: pd.Timestamp, last: pd.Timestamp) -> Any:
    """Ticks on whole minutes, at most about ten of them (the rows are per minute: no tick in between)."""
    import matplotlib.dates as mdates

    span = max(1.0, (last - first).total_seconds() / 60)
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60) if span / s <= 10), None)
    if step is None:
        return mdates.AutoDateLocator(minticks=3, maxticks=10, tz=dt.UTC)
    if step == 60:
        return mdates.HourLocator(tz=dt.UTC)
    return mdates.MinuteLocator(byminute=range(0, 60, step), tz=dt.UTC)


def draw(rows: pa.Table, path: Path, top: int = 6, hours: float = 6.0) -> Path | None:
    """Draw the last ``hours`` of the traffic table ``rows`` (traffic.read_traffic's) to ``path``; None
    when there is nothing to draw."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    frame = rows.to_pandas()
    if frame.empty:
        return None
    frame["minute"] = pd.to_datetime(frame["minute"], utc=True)
    frame = frame[frame["minute"] >= frame["minute"].max() - pd.Timedelta(hours=hours)]
    volume = frame.groupby(["vhost", "queue"])[["published", "delivered"]].sum().sum(axis=1)
    busiest = list(volume.sort_values(ascending=False).index[:top])
    vhosts = frame["vhost"].nunique()

    fig, (rates, waits, acks) = plt.subplots(3, 1, sharex=True, figsize=(11, 9), constrained_layout=True)
    colours = plt.get_cmap("tab10")
    for i, (vhost, queue) in enumerate(busiest):
        series = frame[(frame["vhost"] == vhost) & (frame["queue"] == queue)].sort_values("minute")
        colour, label = colours(i % 10), _label(vhost, queue, vhosts)
        style = {"color": colour, "marker": "o", "markersize": 3}
        rates.plot(series["minute"], series["published"] / 60.0, linestyle="-", label=f"{label} published", **style)
        rates.plot(series["minute"], series["delivered"] / 60.0, linestyle="--", label=f"{label} delivered",
                   **style)
        for axis, name in ((waits, "publish_to_deliver"), (acks, "deliver_to_ack")):
            for quantile, line in (("p50", "-"), ("p99", ":")):
                values = series[f"{name}_{quantile}_ms"].astype("float64")
                if values.notna().any():
                    axis.plot(series["minute"], values, linestyle=line, label=f"{label} {quantile}", **style)
    rates.set_ylabel("messages/s (per minute)")
    rates.set_ylim(bottom=0)
    rates.set_title("Leveret traffic per queue")
    waits.set_ylabel("publish → deliver, ms")
    acks.set_ylabel("deliver → ack, ms")
    for axis in (waits, acks):
        axis.set_yscale("symlog", linthresh=1.0)
        axis.set_ylim(0, max(10.0, axis.get_ylim()[1] * 2))
        axis.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    first, last = frame["minute"].min(), frame["minute"].max()
    # Limits of our own: matplotlib widens a single minute to ±2 years, and ticks per minute over that hang.
    acks.set_xlim(first - pd.Timedelta(seconds=30), last + pd.Timedelta(seconds=30))
    acks.xaxis.set_major_locator(_minute_ticks(first, last))
    acks.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=dt.UTC))
    for axis in (rates, waits, acks):
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    acks.set_xlabel("minute (UTC)")
    fig.autofmt_xdate()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
