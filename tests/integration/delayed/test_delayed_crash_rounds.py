"""kill -9 rounds on one data directory while persistent delayed messages are published and dispatched
(issue 14; broker/exchanges/delayed_exchange.py, broker/delayed/delayed_dispatch.py, storage/delay/).

Each round starts the broker on the same data directory, publishes persistent messages with confirms to a
durable ``x-delayed-message`` exchange (``x-delayed-type`` direct) bound to a durable queue, with delays of
50-800 ms so that some come due and are dispatched while the round runs, and kills the broker with SIGKILL at
a seeded random point: either while publishing goes on, or after publishing stopped while the held messages
are being dispatched. A transient exclusive queue bound to the same exchange, consumed with auto-ack, sees
each dispatch as it happens: none may arrive before its due time (carried in the ``due-ms`` header). After a
final clean start, once every due time is past, the durable queue is drained: every confirmed message must be
there (0 lost) and none twice (0 duplicated: the dispatch is begun durably, the queues keep each dispatch's
origin id, and a dispatch in doubt after a crash goes only where it is missing; broker/delayed/delayed_dispatch.py).

22 rounds run in CI (marker ``slow``); the long run of 100 rounds is marked ``long`` and left out of the default
selection (pyproject's addopts): ``.venv/bin/python -m pytest -m long tests/integration/delayed/test_delayed_crash_rounds.py``.
"""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time

import pika
import pika.exceptions
import pytest
import soak_report

pytestmark = [pytest.mark.leveret_only]

SEED = 14_2024
ROUNDS = 22
EXCHANGE, QUEUE, KEY = "crash-dx", "crash-dq", "k"
DELAY_MIN_MS, DELAY_MAX_MS = 50, 800
EARLY_TOLERANCE_MS = 1.0  # clock reading granularity only: a dispatch is never allowed to be early


def _declare(ch) -> None:
    ch.exchange_declare(EXCHANGE, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_bind(QUEUE, EXCHANGE, KEY)


class Observer(threading.Thread):
    """Consumes a transient queue bound to the delayed exchange; records (message id, arrival ms, due ms)."""

    def __init__(self, params, seen: list) -> None:
        super().__init__(daemon=True)
        self.params, self.seen = params, seen
        self.ready = threading.Event()
        self.conn = None

    def run(self) -> None:
        try:
            self.conn = pika.BlockingConnection(self.params)
            ch = self.conn.channel()
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(q, EXCHANGE, KEY)

            def on_message(_ch, _method, props, _body):
                self.seen.append((props.message_id, time.time() * 1000, (props.headers or {}).get("due-ms")))

            ch.basic_consume(q, on_message, auto_ack=True)
            self.ready.set()
            ch.start_consuming()
        except (pika.exceptions.AMQPError, OSError):
            pass  # the broker was killed
        finally:
            self.ready.set()

    def stop(self) -> None:
        conn = self.conn
        if conn is not None and conn.is_open:
            with contextlib.suppress(Exception):  # already closing
                conn.add_callback_threadsafe(conn.close)
        self.join(10)


def _check_no_early(seen: list, where: str) -> int:
    early = [(mid, arr, due) for mid, arr, due in seen if due is not None and arr + EARLY_TOLERANCE_MS < due]
    assert not early, f"{len(early)} message(s) arrived before their due time ({where}): {early[:10]}"
    return len(seen)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("rounds", [pytest.param(ROUNDS, marks=pytest.mark.slow, id="22-rounds"),
                                    pytest.param(100, marks=pytest.mark.long, id="100-rounds")])
def test_kill9_rounds_during_publish_and_dispatch_lose_nothing_and_deliver_nothing_twice(start_broker, tmp_path,
                                                                                         rounds):
    rng = random.Random(SEED)
    data_dir = tmp_path / "shared-data"
    confirmed: dict[str, int] = {}  # message id -> due ms (wall clock)
    attempted: dict[str, int] = {}  # every message a publish was tried for
    observed_total = 0
    observed_in: dict[str, list[str]] = collections.defaultdict(list)  # message id -> rounds it was seen in
    round_log = []
    started = time.monotonic()

    for rnd in range(rounds):
        b = start_broker("--management-port", "0", "--prometheus-port", "0", data_dir=data_dir)
        conn = pika.BlockingConnection(b.pika_params())
        ch = conn.channel()
        _declare(ch)
        ch.confirm_delivery()
        seen: list = []
        obs = Observer(b.pika_params(), seen)
        obs.start()
        assert obs.ready.wait(10)

        mode = "publish" if rnd % 2 == 0 else "dispatch"
        kill_after = rng.uniform(0.2, 1.5)
        n_conf = n_fail = 0
        killed = threading.Event()
        if mode == "publish":  # the kill falls while messages are being published (and others dispatched)
            killer = threading.Timer(kill_after, lambda b=b, killed=killed: (b.kill9(), killed.set()))
            killer.start()
            deadline = time.monotonic() + kill_after + 5
            i = 0
            while time.monotonic() < deadline:
                mid = f"r{rnd:02d}-{i:05d}"
                delay = rng.randint(DELAY_MIN_MS, DELAY_MAX_MS)
                due = int(time.time() * 1000) + delay
                attempted[mid] = due
                i += 1
                try:
                    ch.basic_publish(EXCHANGE, KEY, mid.encode(), pika.BasicProperties(
                        delivery_mode=2, message_id=mid, headers={"x-delay": delay, "due-ms": due}))
                except (pika.exceptions.AMQPError, OSError):
                    n_fail += 1
                    break  # the broker is gone: this one is unconfirmed
                confirmed[mid] = due
                n_conf += 1
            killer.join()
        else:  # publish a batch, then kill while the held ones come due and are dispatched
            publish_for = rng.uniform(0.2, 0.8)
            end = time.monotonic() + publish_for
            i = 0
            while time.monotonic() < end:
                mid = f"r{rnd:02d}-{i:05d}"
                delay = rng.randint(DELAY_MIN_MS, DELAY_MAX_MS)
                due = int(time.time() * 1000) + delay
                attempted[mid] = due
                i += 1
                ch.basic_publish(EXCHANGE, KEY, mid.encode(), pika.BasicProperties(
                    delivery_mode=2, message_id=mid, headers={"x-delay": delay, "due-ms": due}))
                confirmed[mid] = due
                n_conf += 1
            time.sleep(rng.uniform(0.05, 0.6))
            b.kill9()
            killed.set()
        assert killed.is_set()
        assert b.process.returncode == -9
        obs.stop()
        observed_total += _check_no_early(seen, f"round {rnd}")
        for mid, _, _ in seen:
            observed_in[mid].append(f"r{rnd:02d}")
        round_log.append((rnd, mode, round(kill_after, 2), n_conf, n_fail, len(seen)))
        with contextlib.suppress(Exception):  # the connection died with the broker
            conn.close()

    # Final clean start: wait past the last due time, then drain the durable queue.
    b = start_broker("--management-port", "0", "--prometheus-port", "0", data_dir=data_dir)
    seen = []
    obs = Observer(b.pika_params(), seen)
    obs.start()
    assert obs.ready.wait(10)
    last_due = max(attempted.values())
    time.sleep(max(0.0, (last_due - time.time() * 1000) / 1000) + 2.0)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    _declare(ch)
    counts: collections.Counter[str] = collections.Counter()

    def drain() -> int:
        n = 0
        while True:
            method, props, _ = ch.basic_get(QUEUE, auto_ack=True)
            if method is None:
                return n
            counts[props.message_id] += 1
            n += 1

    drain()
    time.sleep(1.5)  # nothing more may come out later
    late = drain()
    obs.stop()
    observed_total += _check_no_early(seen, "final start")
    for mid, _, _ in seen:
        observed_in[mid].append("final")
    conn.close()
    b.stop()

    lost = sorted(set(confirmed) - set(counts))
    unknown = sorted(set(counts) - set(attempted))
    dups = {mid: n for mid, n in counts.items() if n > 1}
    dup_rounds = collections.Counter(mid.split("-")[0] for mid in dups)
    summary = (f"{rounds} kill -9 rounds in {time.monotonic() - started:.1f}s; attempted {len(attempted)}, "
               f"confirmed {len(confirmed)}, delivered {sum(counts.values())} ({len(counts)} distinct), "
               f"observed on time {observed_total}, after the final drain {late}; lost {len(lost)}, "
               f"duplicated {len(dups)} by round {dict(dup_rounds)}; rounds (round, mode, kill_after, "
               f"confirmed, failed, observed): {round_log}")
    print(summary)
    soak_report.record(f"kill -9, delayed messages ({rounds} rounds)", rounds, len(confirmed), len(lost), len(dups))
    assert len(confirmed) >= rounds * 5, summary  # the rounds did publish
    assert not unknown, f"messages nobody published: {unknown[:10]}; {summary}"
    assert not lost, f"{len(lost)} confirmed message(s) lost: {lost[:20]}; {summary}"
    assert late == 0, f"{late} message(s) came out after the drain; {summary}"
    dup_seen = {mid: observed_in.get(mid, []) for mid in sorted(dups)}
    assert not dups, (f"{len(dups)} message(s) delivered twice (id: rounds whose observer saw a dispatch of it): "
                      f"{dup_seen}; {summary}")
