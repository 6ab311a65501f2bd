"""Delayed messages against time itself (issue 14), on a real broker process with pika: time buckets that roll
over and are deleted once drained (``delayed_message.bucket_size`` made small), buckets of a deleted exchange,
and the broker's wall clock jumping backwards and forwards while messages are pending.

The clock jumps use libfaketime (Debian's ``faketime`` package; ``make test-tools`` installs it), preloaded
into the broker only: its offset is read from a file the test rewrites (``FAKETIME_TIMESTAMP_FILE`` with
``FAKETIME_NO_CACHE``), so the jump happens while the broker runs. The monotonic clock is left real
(``FAKETIME_DONT_FAKE_MONOTONIC``): the event loop's timers and every interval run on it, as on a machine whose
wall clock is stepped by an operator or NTP. Times below are the test's monotonic clock, which ticks with the
broker's (real) wall clock; the broker's wall clock is that plus the offset in force.

What the delay store promises for a clock that jumps (storage/delay/store.py): it reads the wall clock through a
ratchet ``max(previous, now)``, so a record comes out only once the wall clock has read its due time at least
once (it was stated in the broker's wall clock when published), and never twice."""

from __future__ import annotations

import glob
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(60)]

DELAYED = "x-delayed-message"
CHECKPOINT_EVERY = 5.0  # broker/delayed/delayed_dispatch.py: the dispatcher's checkpoint, which deletes drained buckets
EARLY_TOLERANCE = 0.005  # due times are whole ms (truncated); the test's and the broker's clocks tick alike
LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))


# -- helpers ------------------------------------------------------------------------------------------------
@dataclass
class Sent:
    body: bytes
    delay_s: float
    at: float  # monotonic, just before the publish: the broker's receipt (and so its due time) is later

    @property
    def due(self) -> float:
        """The earliest real time it may come out, if the broker's wall clock does not jump."""
        return self.at + self.delay_s


@dataclass
class Consumer:
    """A consumer on a connection of its own, pumped by :meth:`pump`: arrival times are taken as pika hands
    each message over, so they are at most one pump step (20 ms) late."""

    conn: pika.BlockingConnection
    got: list[tuple[bytes, float]] = field(default_factory=list)

    @classmethod
    def on(cls, b, queue: str) -> Consumer:
        c = cls(pika.BlockingConnection(b.pika_params()))
        ch = c.conn.channel()
        ch.basic_consume(queue, lambda _ch, _m, _p, body: c.got.append((body, time.monotonic())), auto_ack=True)
        return c

    def pump(self, until: Callable[[], bool], timeout: float, each: Callable[[], None] | None = None) -> bool:
        """Deliver until ``until()`` or ``timeout`` seconds; ``each()`` runs at every step. True if ``until()``."""
        deadline = time.monotonic() + timeout
        while True:
            if each is not None:
                each()
            if until():
                return True
            if time.monotonic() >= deadline:
                return False
            self.conn.process_data_events(time_limit=0.02)

    def arrived(self, body: bytes) -> list[float]:
        return [t for b, t in self.got if b == body]

    def bodies(self) -> list[bytes]:
        return [b for b, _ in self.got]


def setup_delayed(b, exchange: str = "dx", queue: str = "dq") -> pika.adapters.blocking_connection.BlockingChannel:
    """A durable delayed exchange bound to a durable queue; a confirming publisher channel."""
    ch = pika.BlockingConnection(b.pika_params()).channel()
    ch.exchange_declare(exchange, DELAYED, durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, exchange, "k")
    ch.confirm_delivery()
    return ch


def publish(ch, body: bytes, delay_s: float, exchange: str = "dx") -> Sent:
    """A persistent delayed message, confirmed (so its record is fsynced) when this returns."""
    at = time.monotonic()
    ch.basic_publish(exchange, "k", body, pika.BasicProperties(delivery_mode=2,
                                                               headers={"x-delay": round(delay_s * 1000)}))
    return Sent(body, delay_s, at)


def bucket_starts(b) -> set[int]:
    """Start (ms) of every bucket with a file under ``<data_dir>/delayed/buckets/``."""
    d = b.data_dir / "delayed" / "buckets"
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return set()
    return {int(n.partition(".")[0]) for n in names if n.partition(".")[0].isdigit()}


def lateness_histogram(b) -> dict[str, float]:
    """``leveret_delayed_dispatch_lateness_seconds``: its ``le`` buckets, ``count`` and ``sum``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.prometheus_port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "leveret_delayed_dispatch_lateness_seconds":
            for s in family.samples:
                key = s.labels["le"] if s.name.endswith("_bucket") else s.name.rsplit("_", 1)[1]
                out[key] = s.value
    return out


class FakeClock:
    """The broker's wall-clock offset, in a file libfaketime reads at every clock read (no cache)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0.0
        self.set(0)

    def set(self, offset_s: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        os.replace(tmp, self.path)  # atomic: the library never reads a half-written file
        self.offset = offset_s


@pytest.fixture
def fake_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Brokers started after this (start_broker) run with libfaketime preloaded, on an offset the test sets."""
    if not LIBFAKETIME:
        pytest.skip("libfaketime is not installed (Debian's faketime package; `make test-tools` installs it)")
    clock = FakeClock(tmp_path / "faketime.rc")
    # Only the broker process is started after these are set; the test process itself is not affected.
    monkeypatch.setenv("LD_PRELOAD", LIBFAKETIME[0])
    monkeypatch.setenv("FAKETIME_TIMESTAMP_FILE", str(clock.path))
    monkeypatch.setenv("FAKETIME_NO_CACHE", "1")
    monkeypatch.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
    monkeypatch.delenv("FAKETIME", raising=False)  # it would win over the file
    return clock


# -- buckets ------------------------------------------------------------------------------------------------
def test_buckets_roll_over_in_due_order_and_drained_ones_are_deleted(start_broker):
    b = start_broker("--set", "delayed_message.bucket_size=2000")
    ch = setup_delayed(b)
    consumer = Consumer.on(b, "dq")
    delays = [0.5, 0.9, 1.6, 2.2, 2.9, 3.5, 4.1, 4.8, 5.4, 6.1, 6.6, 7.0]
    order = [6, 0, 11, 3, 8, 1, 10, 5, 2, 9, 4, 7]  # not published in due order
    sent = [publish(ch, b"m%02d" % i, delays[i]) for i in order]
    seen: list[set[int]] = []  # the bucket files at each step, while they drain
    finished = consumer.pump(lambda: len(consumer.got) >= len(sent), 7.0 + 5.0, lambda: seen.append(bucket_starts(b)))
    assert finished, f"{len(consumer.got)} of {len(sent)} arrived: {consumer.bodies()}"

    by_due = sorted(sent, key=lambda s: s.due)
    assert consumer.bodies() == [s.body for s in by_due]  # in due order, each once so far
    for s in sent:
        (at,) = consumer.arrived(s.body)
        assert at >= s.due - EARLY_TOLERANCE, f"{s.body!r} came {s.due - at:.3f}s early"
        assert at <= s.due + 2.0, f"{s.body!r} came {at - s.due:.3f}s late"

    # Several 2 s buckets were made (an hour-long bucket would hold them all), UTC-aligned on 2000 ms...
    made = set().union(*seen)
    assert all(start % 2000 == 0 for start in made), made
    assert len(made) >= 4, made
    # ...and they rolled over: while the last ones still held messages, the first ones were already deleted.
    first, last = min(made), max(made)
    assert any(first not in now and last in now for now in seen), "no drained bucket was deleted before the end"

    # After the next checkpoint every drained bucket is gone; nothing arrives twice meanwhile.
    assert consumer.pump(lambda: not bucket_starts(b), CHECKPOINT_EVERY + 3.0), \
        f"bucket files left after the checkpoint: {sorted(bucket_starts(b))}"
    consumer.pump(lambda: False, 0.3)
    assert sorted(consumer.bodies()) == sorted(s.body for s in sent)


def test_deleting_the_exchange_deletes_its_buckets_and_a_namesake_gets_none(start_broker):
    b = start_broker("--set", "delayed_message.bucket_size=1000")
    ch = setup_delayed(b)
    # Due over 8-11.2 s (>= 4 buckets): all must still be held after the restart below, which took over 3 s on a
    # loaded machine (the first one, due at 3 s then, had been delivered).
    sent = [publish(ch, b"gone%d" % i, 8.0 + 0.8 * i) for i in range(5)]
    # Records reach their bucket files at a checkpoint; a clean stop makes one (quicker than waiting for the
    # dispatcher's), and the recovered exchange holds them from its files.
    ch.connection.close()
    b.restart()
    held = bucket_starts(b)
    assert len(held) >= 4 and all(start % 1000 == 0 for start in held), held
    ch = pika.BlockingConnection(b.pika_params()).channel()
    assert ch.queue_declare("dq", durable=True, passive=True).method.message_count == 0  # all still held

    ch.exchange_delete("dx")
    consumer = Consumer.on(b, "dq")
    assert consumer.pump(lambda: not (bucket_starts(b) & held), CHECKPOINT_EVERY + 2.0), \
        f"buckets of the deleted exchange left: {sorted(bucket_starts(b) & held)} of {sorted(held)}"

    # A namesake, bound to the same queue, gets its own messages and none of the dropped ones.
    ch.exchange_declare("dx", DELAYED, durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_bind("dq", "dx", "k")
    ch.confirm_delivery()
    own = publish(ch, b"own", 0.3)
    last_due = max(s.due for s in sent)
    consumer.pump(lambda: False, max(0.0, last_due - time.monotonic()) + 0.5)
    assert consumer.bodies() == [own.body]


# -- wall-clock jumps ---------------------------------------------------------------------------------------
def test_a_backward_jump_delays_pending_messages_by_the_jump_and_never_delivers_early_or_twice(start_broker,
                                                                                                fake_clock):
    b = start_broker()
    ch = setup_delayed(b)
    consumer = Consumer.on(b, "dq")
    probe = publish(ch, b"probe", 0.3)  # once it is out, the store's clock has read the wall clock after it
    before = [publish(ch, b"before%d" % i, d) for i, d in enumerate((2.0, 3.0, 4.0))]
    assert consumer.pump(lambda: bool(consumer.got), 3.0) and consumer.bodies() == [b"probe"]
    assert consumer.arrived(b"probe")[0] >= probe.due - EARLY_TOLERANCE

    jump = 3.0
    jumped_at = time.monotonic()
    assert jumped_at < min(s.due for s in before) - 0.5, "too slow a start: the jump must come before the dues"
    fake_clock.set(-jump)
    # Published after the jump: due times stated in the broker's wall clock, which reads `jump` s earlier. The
    # store's clock had read it up to about jumped_at; after0 and after1 fall due (in those terms) before that.
    after = [publish(ch, b"after%d" % i, d) for i, d in enumerate((1.0, 2.0, 5.0))]

    every = before + after
    assert consumer.pump(lambda: len(consumer.got) >= 1 + len(every), max(s.due for s in before) + jump + 3.0
                         - time.monotonic()), f"arrived: {consumer.got}"
    consumer.pump(lambda: False, 0.5)  # a duplicate would come out at once
    assert sorted(consumer.bodies()) == sorted([probe.body] + [s.body for s in every])  # each exactly once

    # Pending when the clock went back: held until the wall clock reads their due time again, i.e. late by
    # the jump in real time (never early), and not much later than that.
    for s in before:
        (at,) = consumer.arrived(s.body)
        assert at >= s.due + jump - EARLY_TOLERANCE, f"{s.body!r} came {s.due + jump - at:.3f}s before the " \
                                                      "wall clock read its due time again"
        assert at <= s.due + jump + 1.5, f"{s.body!r} came {at - s.due - jump:.3f}s after its due time + jump"

    # Published after the jump: due at `at + delay - jump` in pre-jump terms. The ratchet lets one out once the
    # wall clock has read that time at least once: before the jump (up to jumped_at) or after it.
    for s in after:
        (at,) = consumer.arrived(s.body)
        wall_due = s.due - jump  # on the test's (= the pre-jump wall clock's) time line
        reached = jumped_at if jumped_at >= wall_due else wall_due + jump
        assert at >= reached - EARLY_TOLERANCE, f"{s.body!r} came before the wall clock read its due time"
    (at,) = consumer.arrived(b"after2")  # due after anything read before the jump: as asked, in real time
    assert after[2].due - EARLY_TOLERANCE <= at <= after[2].due + 1.5


def test_a_message_published_after_a_backward_jump_is_not_delivered_before_its_delay(start_broker, fake_clock):
    """Issue 14: "a wall clock that jumps backwards never delivers early". A message published after the jump
    is due by the jumped-back wall clock and comes out then (an earlier store clock was a ratchet kept at the
    highest reading, which let such a message out as soon as the dispatcher next woke, before its x-delay had
    passed: 2 s asked, 0.83-1.13 s seen)."""
    b = start_broker()
    ch = setup_delayed(b)
    consumer = Consumer.on(b, "dq")
    publish(ch, b"probe", 0.3)
    assert consumer.pump(lambda: bool(consumer.got), 3.0)  # the store's clock has read the wall clock now
    fake_clock.set(-3.0)
    first = publish(ch, b"first", 1.0)  # wakes the dispatcher 1 s later (in real time)...
    second = publish(ch, b"second", 2.0)  # ...when this one is due by the store's clock, not by the wall clock
    assert consumer.pump(lambda: len(consumer.got) >= 3, 5.0), f"arrived: {consumer.got}"
    consumer.pump(lambda: False, 0.3)
    assert consumer.bodies() == [b"probe", b"first", b"second"]  # each once
    (at1,) = consumer.arrived(b"first")
    assert at1 >= first.due - EARLY_TOLERANCE
    (at2,) = consumer.arrived(b"second")
    assert at2 >= second.due - EARLY_TOLERANCE, (
        f"x-delay {second.delay_s}s published after a 3 s backward jump came after {at2 - second.at:.3f}s, "
        f"{at2 - at1:.3f}s after the one published just before it with x-delay {first.delay_s}s")
    assert at2 <= second.due + 1.0


def test_a_forward_jump_delivers_what_became_due_promptly_once_and_reports_it(start_broker, fake_clock):
    """Forward: messages that became due are delivered at once, each once, and their lateness is reported.
    The dispatcher's timer runs on the loop's monotonic clock; it sleeps at most a second (MAX_SLEEP) so that
    a jump of the wall clock is seen (once it was armed for the whole distance and never re-armed, so 0 of 5
    messages came out within 5 s of a one-day jump)."""
    b = start_broker()
    ch = setup_delayed(b)
    consumer = Consumer.on(b, "dq")
    sent = [publish(ch, b"hour%d" % i, 3600.0 + i) for i in range(5)]
    assert not consumer.pump(lambda: bool(consumer.got), 0.3)  # held: an hour to go
    before = lateness_histogram(b)

    day = 86_400.0
    fake_clock.set(day)
    jumped_at = time.monotonic()
    assert consumer.pump(lambda: len(consumer.got) >= len(sent), 5.0), (
        f"{len(consumer.got)} of {len(sent)} messages due an hour ahead delivered within 5 s of a one-day "
        "forward jump of the wall clock")
    consumer.pump(lambda: False, 0.3)
    assert consumer.bodies() == [s.body for s in sent]  # in due order, each once
    assert all(at - jumped_at < 5.0 for _, at in consumer.got)
    # Reported: the dispatch lateness histogram has them, about a day (minus the hour) late each.
    after = lateness_histogram(b)
    assert after["count"] - before.get("count", 0) == len(sent)
    assert after["+Inf"] - after["300.0"] - (before.get("+Inf", 0) - before.get("300.0", 0)) == len(sent)
    assert after["sum"] - before.get("sum", 0) >= len(sent) * (day - 3600 - 10)
