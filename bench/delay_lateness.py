"""Issue 14, target 2: dispatch lateness (receive time − due time) while ~5k msg/s come due.

What is measured: for every delayed message, the time from its due time to its arrival at a consumer of the
queue bound to the delayed exchange; reported as p50 / p99 / p99.9 / max, and the count of messages that
arrived early (before their due time) or never.

How: one Leveret (this tree, fresh data dir, started like bench/run_bench.py) with a durable
``x-delayed-message`` exchange (``x-delayed-type: direct``) and a durable queue bound. ``--count`` messages
(default 100,000, 256 B, persistent) are published with confirms (window 1000), each with an absolute due time
``x-deliver-at`` (ms since the epoch; so the due time is exact, not the broker's receive time + x-delay),
spread evenly over ``--spread`` seconds (default 20 s → 5,000/s) starting ``--lead`` seconds after the start
(default 30 s, so the whole publish finishes before the first is due; the script prints how long it took),
published in shuffled order. The body's first 8 bytes are CLOCK_MONOTONIC (ns) of the due time minus an
offset of 1 s, so broker/tools/amqp_client.py's consumer (no-ack, latency histogram in µs, 0.1 % precision) records
lateness + 1 s and an early arrival is still visible; the offset is subtracted in the report. The consumer
runs in the same process as the publisher (publishing ends before dispatch begins).

    .venv/bin/python -m bench.delay_lateness [--count 100000] [--spread 20] [--lead 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import time

from pamqp import commands

from bench.delay_publish import X_DELIVER_AT, Broker, ConfirmPublisher, Encoder, declare_delayed, loadavg
from broker.tools.amqp_client import connect, hist_percentiles, hist_value

EXCHANGE, QUEUE, KEY = "bench.lateness", "bench.lateness.q", "k"
OFFSET_NS = 1_000_000_000


async def bench(url: str, count: int, spread: float, lead: float, size: int) -> dict:
    ctl = await connect(url, name="lateness-control")
    await declare_delayed(ctl, EXCHANGE, QUEUE, KEY)
    await ctl.rpc(commands.Queue.Purge(queue=QUEUE))

    cons = await connect(url, name="lateness-consumer")
    cons.start_consuming_state(manual_ack=False, record_latency=True)
    await cons.rpc(commands.Basic.Consume(queue=QUEUE, consumer_tag="lateness", no_ack=True))

    pubc = await connect(url, name="lateness-publisher")
    wall0_ms = time.time_ns() // 1_000_000
    mono0_ns = time.monotonic_ns()
    first_due_ms = wall0_ms + int(lead * 1000)
    step_ms = spread * 1000 / count
    order = list(range(count))
    random.Random(14).shuffle(order)
    enc = Encoder(EXCHANGE, KEY, size)

    def make(i: int) -> bytes:
        due_ms = first_due_ms + int(order[i] * step_ms)
        due_mono = mono0_ns + (due_ms - wall0_ms) * 1_000_000 - OFFSET_NS
        return enc.encode(((X_DELIVER_AT, due_ms),), due_mono)

    pub = ConfirmPublisher(pubc, make, 1000)
    await pub.enable()
    t0 = time.monotonic()
    await pub.run(total=count)
    pub_s = time.monotonic() - t0
    print(json.dumps({"published": pub.confirmed, "nacked": pub.nacked, "publish_s": round(pub_s, 2),
                      "publish_rate": round(pub.confirmed / pub_s), "lead_s": lead,
                      "received_before_first_due": cons.consumed, "loadavg": loadavg()}), flush=True)
    if pub_s > lead:
        print("WARNING: publishing outlasted the lead; the first messages were due before all were published",
              flush=True)
    await pubc.close()
    # wait for the last due time + up to 30 s
    last_due_mono = mono0_ns / 1e9 + lead + spread
    deadline = last_due_mono + 30
    la_during = None
    while cons.consumed < count and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        if la_during is None and time.monotonic() > mono0_ns / 1e9 + lead + spread / 2:
            la_during = loadavg()
    hist = cons.hist
    assert hist is not None  # the consumer was made to record latencies
    received = cons.consumed
    await cons.close()
    await ctl.close()
    # lateness in ms (histogram values are lateness + OFFSET, in µs)
    off_us = OFFSET_NS / 1000
    early = sum(n for i, n in enumerate(hist) if n and hist_value(i) < off_us)
    pct = hist_percentiles(hist, (0.5, 0.9, 0.99, 0.999))
    min_idx = next((i for i, n in enumerate(hist) if n), 0)

    def ms(v: float | None) -> float | None:
        return None if v is None else round((v - off_us) / 1000, 2)
    return {"count": count, "received": received, "missing": count - received, "early": early,
            "come_due_per_s": round(count / spread), "lateness_ms": {
                "min": ms(hist_value(min_idx)), "p50": ms(pct["p50"]), "p90": ms(pct["p90"]),
                "p99": ms(pct["p99"]), "p99.9": ms(pct["p999"]), "max": ms(pct["max"]),
                "mean": ms(pct["mean"])},
            "target": "p99 <= 100 ms", "met": (ms(pct["p99"]) or 0.0) <= 100 and pct["p99"] is not None
            and received == count, "loadavg_during_dispatch": la_during, "loadavg_end": loadavg()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--spread", type=float, default=20.0)
    ap.add_argument("--lead", type=float, default=30.0)
    ap.add_argument("--size", type=int, default=256)
    a = ap.parse_args(argv)
    print(f"loadavg at start {loadavg()}", flush=True)
    broker = Broker()
    broker.start()
    try:
        import uvloop
        res = uvloop.run(bench(broker.url, a.count, a.spread, a.lead, a.size))
    finally:
        broker.stop()
        shutil.rmtree(broker.data_dir, ignore_errors=True)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
