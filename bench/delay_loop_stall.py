"""How long a client that never touches delayed messages waits while others publish them (the delay store's
checkpoint wrote its buckets on the event loop until fd90b54; its snapshot still runs there).

What is measured: a probe connection sends a passive ``queue.declare`` of a plain queue every 20 ms and times the
answer, first for ``--quiet`` seconds with nothing else going on, then while ``--conns`` publishers send delayed
messages (100 B, persistent, confirm window 1,000 each, ``x-delay`` uniform over 1 min .. 365 days, so that every
hour-long bucket of the year takes some) until ``--count`` are confirmed or ``--budget`` seconds pass. For each
phase: the probes' p50 / p99 / max round trip and how many took over 100 ms, and each answer over 50 ms with
when it came (seconds into the phase). The broker is this tree's (``python -m broker serve``, own data dir, free
port, as bench/delay_pending.py). The probe is a thread of this process, beside the publishers' loop: its round
trips include this process's own GIL waits (up to the 5 ms switch interval), not only the broker's.

    .venv/bin/python -m bench.delay_loop_stall [--count 600000] [--budget 60] [--conns 2] [--json-out FILE]
        [--baseline REF]

``--baseline REF`` runs the same phases first against Leveret at commit REF (a git worktree with this tree's
compiled codec, as run_bench's ``--baseline``), then against this tree, one after the other in one run.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import pika
import pika.exceptions

from bench.delay_pending import publish, setup
from bench.delay_publish import Broker, free_port, loadavg

PROBE_QUEUE = "bench.stall.probe"
PROBE_EVERY = 0.02  # seconds between two probes


class Probe(threading.Thread):
    """Round trips of a passive queue.declare, on a connection of its own, until stopped."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.rtts_ms: list[tuple[float, float]] = []  # (seconds since the phase began, round trip)
        self.phase_start = time.monotonic()
        self._stop_event = threading.Event()
        self.error: str | None = None

    def new_phase(self) -> list[tuple[float, float]]:
        """The probes of the phase that ends now; a new one begins."""
        done, self.rtts_ms = self.rtts_ms, []
        self.phase_start = time.monotonic()
        return done

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0))
            ch = conn.channel()
            ch.queue_declare(PROBE_QUEUE)
            while not self._stop_event.is_set():
                t = time.monotonic()
                ch.queue_declare(PROBE_QUEUE, passive=True)
                self.rtts_ms.append((t - self.phase_start, (time.monotonic() - t) * 1000))
                self._stop_event.wait(PROBE_EVERY)
            conn.close()
        except (pika.exceptions.AMQPError, OSError) as e:  # reported with the figures: it measured nothing after
            self.error = f"{type(e).__name__}: {e}"


def summary(probes: list[tuple[float, float]]) -> dict:
    rtts = sorted(r for _, r in probes)
    if not rtts:
        return {"probes": 0}
    return {"probes": len(rtts), "p50_ms": round(rtts[len(rtts) // 2], 2),
            "p99_ms": round(rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))], 1), "max_ms": round(rtts[-1], 1),
            "over_100ms": sum(r > 100 for r in rtts),
            "over_50ms_at_s": [[round(at, 1), round(r)] for at, r in probes if r > 50]}


def one_run(broker: Broker, a: argparse.Namespace) -> dict:
    """The quiet phase, then the publishing one, against ``broker`` (started and stopped here)."""
    import uvloop
    out: dict = {"loadavg_at_start": loadavg()}
    broker.start()
    probe = Probe(broker.port)
    try:
        uvloop.run(setup(broker.url))
        probe.start()
        time.sleep(a.quiet)
        out["quiet"] = summary(probe.new_phase())
        published = uvloop.run(publish(broker.url, a.count, a.budget, a.conns, 100, broker))
        out["publishing"] = summary(probe.new_phase())
        out["publish"] = {k: published[k] for k in ("confirmed", "nacked", "publish_s", "rate")}
        probe.stop()
        out["probe_error"] = probe.error
    finally:
        probe.stop()
        broker.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=600_000)
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of publishing at most")
    ap.add_argument("--conns", type=int, default=2)
    ap.add_argument("--quiet", type=float, default=5.0, help="seconds probed before the publishers start")
    ap.add_argument("--baseline", metavar="REF", help="also run Leveret at this git commit (first)")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)
    out: dict = {}
    if a.baseline:
        from bench.run_bench import BaselineLeveret
        tree = BaselineLeveret(free_port(), a.baseline)  # (used for its worktree and codec build only)
        try:
            out[f"leveret@{a.baseline}"] = one_run(Broker(root=tree.worktree), a)
        finally:
            tree.remove_worktree()
    out["leveret"] = one_run(Broker(), a)
    result = out if a.baseline else out["leveret"]
    print(json.dumps(result, indent=2))
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
