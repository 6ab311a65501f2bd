"""The scenarios of issue 6 (S1–S7), issue 17 (S1-TLS) and issue 12 (S8–S10, stream queues), their sizes in
quick and full mode, and the targets they are judged by.

Each scenario is one or more load-generator runs (PerfConfig keyword arguments, the URL and broker PID
are filled in by the runner) and a list of checks. A check names a metric of one run, whether higher or
lower is better, and the ratio Leveret / RabbitMQ that meets the target. A Leveret-only scenario (S10:
consumer groups, which RabbitMQ does not have) runs against Leveret alone; its check compares with another
run of the same scenario on Leveret (``Check.ref``), e.g. S10's group rate against an S4 run's per-queue
consumer rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Check:
    label: str
    run: str            # key of the run in Scenario.runs
    metric: str         # dotted path into the perf result
    better: str         # "higher" or "lower"
    target: float | None  # ratio Leveret/RabbitMQ: ≥ target (higher) or ≤ target (lower)
    unit: str = ""
    # Instead of RabbitMQ's value: (run, metric, scale) of Leveret's own runs of this scenario, described by
    # ref_label — for a Leveret-only scenario.
    ref: tuple[str, str, float] | None = None
    ref_label: str = ""


@dataclass
class Scenario:
    id: str
    title: str
    runs: dict[str, dict]
    checks: list[Check]
    # Leveret-only absolute conditions, e.g. every consumer received something.
    conditions: list[tuple[str, str, str]] = field(default_factory=list)  # (label, run, expression)
    leveret_only: bool = False   # RabbitMQ lacks the feature: run against Leveret alone
    tls: bool = False            # over amqps: both brokers get a TLS listener with the same certificate


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
    stream = {"queue_type": "stream", "stream_offset": "first"}
    return [
        Scenario("S1", "1 producer → 1 queue → 1 consumer, 16 B, transient, auto-ack",
                 {"main": dict(size=16, **timed)},
                 [Check("consume rate", "main", "consume_rate", "higher", 1.5, "msg/s")]),
        # S1 over TLS (issue 17): the same load through amqps://, both brokers with the same trustme CA and
        # server certificate (run_bench.TLSFiles). No target: the ratio is stated, and run_bench adds each
        # broker's TLS / plain ratio when S1 ran too.
        Scenario("S1-TLS", "S1 over TLS (amqps): 1 producer → 1 queue → 1 consumer, 16 B, auto-ack",
                 {"main": dict(size=16, **timed)},
                 [Check("publish rate", "main", "publish_rate", "higher", None, "msg/s"),
                  Check("consume rate", "main", "consume_rate", "higher", None, "msg/s"),
                  Check("broker CPU per message", "main", "broker.cpu_us_per_msg", "lower", None, "µs")],
                 tls=True),
        Scenario("S2", "1 KiB, manual ack, prefetch 100",
                 {"main": dict(size=kib, manual_ack=True, prefetch=100, **timed)},
                 [Check("consume rate", "main", "consume_rate", "higher", 1.5, "msg/s"),
                  Check("peak RSS", "main", "broker.rss_peak_kb", "lower", 0.5, "KiB")]),
        Scenario("S3", "1 KiB persistent → durable queue, confirms ≤ 100 outstanding, manual ack, prefetch 100",
                 {"main": dict(size=kib, persistent=True, confirm=100, manual_ack=True, prefetch=100, **timed)},
                 [Check("consume rate", "main", "consume_rate", "higher", 1.5, "msg/s")],
                 [("persistent messages reach the disk (≥ 1 KiB written per message)", "main", "disk>=1024")]),
        Scenario("S4", "fanout → 10 queues, one consumer each, 16 B, auto-ack",
                 {"main": dict(size=16, fanout=True, queues=10, consumers=10, **timed)},
                 [Check("total delivery rate", "main", "consume_rate", "higher", 2.0, "msg/s")]),
        Scenario("S5", f"backlog: publish {sz.backlog:,} × 1 KiB with no consumer, then drain (manual ack, prefetch 100)",
                 {"main": {"size": kib, "backlog": sz.backlog, "manual_ack": True, "prefetch": 100}},
                 [Check("publish rate", "main", "publish_rate", "higher", 2.0, "msg/s"),
                  Check("drain rate", "main", "drain_rate", "higher", 2.0, "msg/s"),
                  Check("peak RSS", "main", "broker.rss_peak_kb", "lower", 0.1, "KiB"),
                  Check("RSS once drained", "main", "broker.rss_end_kb", "lower", None, "KiB")]),
        Scenario("S6", "latency at a fixed 5,000 msg/s, 1 KiB, manual ack (prefetch 100)",
                 {"main": dict(size=kib, rate=5000, manual_ack=True, prefetch=100, **timed)},
                 [Check("latency p99", "main", "latency_us.p99", "lower", 1.0, "µs")]),
        Scenario("S7", f"{sz.s7_small} connections, a consumer each on its own queue, one producer at 1,000 msg/s; "
                       f"then {sz.s7_large:,}",
                 {"small": {"size": 16, "rate": 1000, "queues": sz.s7_small, "consumers": sz.s7_small,
                            "duration": sz.s7_duration, "warmup": 2},
                  "large": {"size": 16, "rate": 1000, "queues": sz.s7_large, "consumers": sz.s7_large,
                            "duration": max(sz.s7_duration, sz.s7_large / 1000 * 2), "warmup": 2}},
                 [Check(f"latency p99 at {sz.s7_small} conns", "small", "latency_us.p99", "lower", 1.0, "µs"),
                  Check(f"RSS at {sz.s7_small} conns", "small", "broker.rss_peak_kb", "lower", 1.0, "KiB"),
                  # issue 19's target is for 10,000 connections (full mode); quick mode's 2,000 is information
                  Check(f"RSS at {sz.s7_large} conns", "large", "broker.rss_peak_kb", "lower",
                        1.0 if sz.s7_large >= 10_000 else None, "KiB")],
                 [(f"{sz.s7_small:,}: every consumer receiving", "small", "consumers_all_receiving"),
                  (f"{sz.s7_large:,}: every consumer receiving", "large", "consumers_all_receiving")]),
        # Streams (issue 12). A stream consumer needs manual acks and a per-consumer prefetch (both brokers
        # refuse it otherwise); 1,000 is what RabbitMQ's stream guides use, and the confirm window matches it.
        Scenario("S8", "stream: 1 publisher with confirms (≤ 1,000 outstanding) → a stream, 1 consumer from "
                       "first (manual ack, prefetch 1,000), 1 KiB",
                 {"main": dict(size=kib, confirm=1000, manual_ack=True, prefetch=1000, **stream, **timed)},
                 [Check("publish rate", "main", "publish_rate", "higher", 1.5, "msg/s"),
                  Check("consume rate", "main", "consume_rate", "higher", 1.5, "msg/s"),
                  Check("peak RSS", "main", "broker.rss_peak_kb", "lower", 0.5, "KiB")]),
        Scenario("S9", f"stream: read {sz.backlog:,} × 1 KiB from first while the publisher "
                       "(confirms ≤ 1,000) goes on publishing; manual ack, prefetch 1,000",
                 {"main": dict(size=kib, confirm=1000, manual_ack=True, prefetch=1000, backlog=sz.backlog,
                               keep_publishing=True, **stream)},
                 [Check("read rate (first N offsets)", "main", "drain_rate", "higher", None, "msg/s"),
                  Check("publish rate while reading", "main", "drain_publish_rate", "higher", None, "msg/s"),
                  Check("peak RSS", "main", "broker.rss_peak_kb", "lower", None, "KiB")]),
        # S10 compares the group's total rate with S4's per-queue consumer rate: S4 (fanout → 10 classic
        # queues, a consumer each, 16 B, auto-ack) is run again in the same scenario on the same broker, and
        # its total delivery rate ÷ 10 is the reference. Same body size and unconfirmed publisher as S4.
        Scenario("S10", "stream consumer group: 4 consumers with x-stream-group on one stream, from first, "
                        "16 B, manual ack, prefetch 1,000 (Leveret only)",
                 {"main": dict(size=16, manual_ack=True, prefetch=1000, consumers=4,
                               consumer_args={"x-stream-group": "perf-group"}, **stream, **timed),
                  "s4": dict(size=16, fanout=True, queues=10, consumers=10, **timed)},
                 [Check("total delivery rate vs S4 per-queue consumer rate", "main", "consume_rate", "higher",
                        1.0, "msg/s", ref=("s4", "consume_rate", 0.1),
                        ref_label="S4 total ÷ 10, Leveret, same scenario")],
                 [("exactly once per group", "main", "stream_exactly_once")],
                 leveret_only=True),
    ]
