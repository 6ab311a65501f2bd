"""The traffic table as one PNG: per queue over time, the message rates and the two latencies.

matplotlib with the Agg backend (no display: the job runs on servers and in CI). Three panels sharing the
time axis, one colour per queue throughout: published/s (solid) and delivered/s (dashed); publish→deliver
p50 (solid) and p99 (dotted); deliver→ack p50 and p99. Latency axes are logarithmic above 1 ms (linear
below, so the 0 ms of a message handed straight to a waiting consumer is drawn): a queue at 2 ms and a
backlogged one at 2 minutes must both be readable. Only the busiest queues are drawn (a legend of 200 lines
helps nobody); the summary table lists them all.

The table has a row only for a minute with events, so a queue's minutes are filled in before drawing: a minute
without a row is 0 messages/s (the line drops to zero; markers stay on the minutes that have rows) and has no
latency (the latency lines break there). Drawn as they came, a line crossed an idle gap straight from the last
busy minute to the next, showing ~50 msg/s for minutes in which nothing happened.
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


RATE_COLUMNS = ("published", "delivered")


def minute_series(frame: pd.DataFrame, first: pd.Timestamp, last: pd.Timestamp) -> tuple[pd.DataFrame, list[int]]:
    """One queue's rows on every minute from ``first`` to ``last``: a minute without a row counts 0 messages
    (the rate columns) and no latency (NaN, where a line breaks). Also the positions of the minutes that had
    a row (where the markers go)."""
    minutes = pd.date_range(first.floor("min"), last.floor("min"), freq="min")
    series = frame.assign(minute=frame["minute"].dt.floor("min")).drop_duplicates("minute", keep="last")
    series = series.set_index("minute").reindex(minutes)
    had_row = [i for i, present in enumerate(series["queue"].notna()) if present]
    for column in RATE_COLUMNS:
        series[column] = series[column].fillna(0)
    return series.rename_axis("minute").reset_index(), had_row


def draw(rows: pa.Table, path: Path, top: int = 6, hours: float = 6.0) -> Path | None:
    """Draw the last ``hours`` of the traffic table ``rows`` (traffic.read_traffic's) to ``path``; None
    when there is nothing to draw."""
    import matplotlib.pyplot as plt

    fig = figure(rows, top, hours)
    if fig is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def figure(rows: pa.Table, top: int = 6, hours: float = 6.0) -> Any:
    """The matplotlib Figure :func:`draw` saves (its lines are what the tests read); None when there is
    nothing to draw."""
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
    first, last = frame["minute"].min(), frame["minute"].max()
    for i, (vhost, queue) in enumerate(busiest):
        series, had_row = minute_series(frame[(frame["vhost"] == vhost) & (frame["queue"] == queue)], first, last)
        colour, label = colours(i % 10), _label(vhost, queue, vhosts)
        style = {"color": colour, "marker": "o", "markersize": 3, "markevery": had_row}
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
    return fig
