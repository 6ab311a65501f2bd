"""The scenarios of issue 6 (S1–S7), their sizes in quick and full mode, and the targets they are judged by.

Each scenario is one or more load-generator runs (PerfConfig keyword arguments, the URL and broker PID
are filled in by the runner) and a list of checks. A check names a metric of one run, whether higher or
lower is better, and the ratio Leveret / RabbitMQ that meets the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Check:
    label: str
    run: str            # key of the run in Scenario.runs
    metric: str         # dotted path into the perf result
    better: str         # "higher" or "lower"
    target: float       # ratio Leveret/RabbitMQ: ≥ target (higher) or ≤ target (lower)
    unit: str = ""


@dataclass
class Scenario:
    id: str
    title: str
    runs: dict[str, dict]
    checks: list[Check]
    # Leveret-only absolute conditions, e.g. every consumer received something.
    conditions: list[tuple[str, str, str]] = field(default_factory=list)  # (label, run, expression)


@dataclass
class Sizes:
    duration: float
    warmup: float
    backlog: int
    s7_small: int
    s7_large: int
    s7_duration: float


QUICK = Sizes(duration=8, warmup=2, backlog=100_000, s7_small=500, s7_large=2_000, s7_duration=10)
FULL = Sizes(duration=30, warmup=5, backlog=1_000_000, s7_small=500, s7_large=10_000, s7_duration=30)


def scenarios(sz: Sizes) -> list[Scenario]:
    timed = {"duration": sz.duration, "warmup": sz.warmup}
    kib = 1024
    return [
        Scenario("S1", "1 producer → 1 queue → 1 consumer, 16 B, transient, auto-ack",
                 {"main": dict(size=16, **timed)},
                 [Check("consume rate", "main", "consume_rate", "higher", 1.5, "msg/s")]),
        Scenario("S2", "1 KiB, manual ack, prefetch 100",
                 {"main": dict(size=kib, manual_ack=True, prefetch=100, **timed)},
                 [Check("consume rate", "main", "consume_rate", "higher", 1.5, "msg/s")]),
        Scenario("S3", "1 KiB persistent → durable queue, confirms ≤ 100 outstanding, manual ack, prefetch 100",
                 {"main": dict(size=kib, persistent=True, confirm=100, manual_ack=True, prefetch=100, **timed)},
                 [Check("consume rate", "main", "consume_rate", "higher", 1.5, "msg/s")],
                 [("persistent messages reach the disk (≥ 1 KiB written per message)", "main", "disk>=1024")]),
        Scenario("S4", "fanout → 10 queues, one consumer each, 16 B, auto-ack",
                 {"main": dict(size=16, fanout=True, queues=10, consumers=10, **timed)},
                 [Check("total delivery rate", "main", "consume_rate", "higher", 1.0, "msg/s")]),
        Scenario("S5", f"backlog: publish {sz.backlog:,} × 1 KiB with no consumer, then drain (manual ack, prefetch 100)",
                 {"main": dict(size=kib, backlog=sz.backlog, manual_ack=True, prefetch=100)},
                 [Check("publish rate", "main", "publish_rate", "higher", 1.0, "msg/s"),
                  Check("drain rate", "main", "drain_rate", "higher", 1.0, "msg/s"),
                  Check("peak RSS", "main", "broker.rss_peak_kb", "lower", 0.1, "KiB")]),
        Scenario("S6", "latency at a fixed 5,000 msg/s, 1 KiB, manual ack (prefetch 100)",
                 {"main": dict(size=kib, rate=5000, manual_ack=True, prefetch=100, **timed)},
                 [Check("latency p99", "main", "latency_us.p99", "lower", 1.0, "µs")]),
        Scenario("S7", f"{sz.s7_small} connections, a consumer each on its own queue, one producer at 1,000 msg/s; "
                       f"then {sz.s7_large:,}",
                 {"small": dict(size=16, rate=1000, queues=sz.s7_small, consumers=sz.s7_small,
                                duration=sz.s7_duration, warmup=2),
                  "large": dict(size=16, rate=1000, queues=sz.s7_large, consumers=sz.s7_large,
                                duration=max(sz.s7_duration, sz.s7_large / 1000 * 2), warmup=2)},
                 [Check(f"RSS at {sz.s7_small} conns", "small", "broker.rss_peak_kb", "lower", 1.0, "KiB"),
                  Check(f"RSS at {sz.s7_large} conns", "large", "broker.rss_peak_kb", "lower", None, "KiB")],
                 [(f"{sz.s7_small:,}: every consumer receiving", "small", "consumers_all_receiving"),
                  (f"{sz.s7_large:,}: every consumer receiving", "large", "consumers_all_receiving")]),
    ]
