"""The pure tables behind the login defences: broker/security/login_throttle.py (how long a login from an address waits)
and broker/security/handshake_guard.py (unfinished handshakes per address and in all), with the time passed in."""

from __future__ import annotations

import pytest

from broker.security.handshake_guard import HandshakeSlots, RefusalLog
from broker.security.login_throttle import LoginThrottle


def test_the_delay_starts_after_the_threshold_and_doubles_up_to_the_cap():
    t = LoginThrottle(after=3, window=60.0, delay=0.5, max_delay=3.0)
    waits = []
    for _ in range(7):
        waits.append(t.wait_before_login("10.0.0.1", 100.0))
        t.failed("10.0.0.1", 100.0)
    assert waits == [0.0, 0.0, 0.0, 0.5, 1.0, 2.0, 3.0]
    assert t.wait_before_login("10.0.0.1", 100.0) == 3.0
    # Another address is untouched by these failures.
    assert t.wait_before_login("10.0.0.2", 100.0) == 0.0


def test_failures_expire_a_window_after_the_last_one():
    t = LoginThrottle(after=2, window=10.0, delay=1.0, max_delay=8.0)
    for now in (0.0, 5.0, 9.0):
        t.failed("10.0.0.1", now)
    assert t.wait_before_login("10.0.0.1", 18.9) == 2.0  # 3 failures, the last 9.9 s ago
    assert t.wait_before_login("10.0.0.1", 19.1) == 0.0  # the window after the last one has passed
    assert len(t) == 0


def test_switched_off_exempt_loopback_and_bounded_memory():
    off = LoginThrottle(after=0, window=60.0, delay=1.0, max_delay=2.0)
    for _ in range(100):
        off.failed("10.0.0.1", 0.0)
    assert off.wait_before_login("10.0.0.1", 0.0) == 0.0 and len(off) == 0
    t = LoginThrottle(after=1, window=60.0, delay=1.0, max_delay=2.0, exempt_loopback=True, max_sources=100)
    for address in ("127.0.0.1", "127.0.0.2", "::1"):
        t.failed(address, 0.0)
        t.failed(address, 0.0)
        assert t.wait_before_login(address, 0.0) == 0.0
    t.failed("10.0.0.1", 0.0)
    t.failed("10.0.0.1", 0.0)
    assert t.wait_before_login("10.0.0.1", 0.0) == 2.0
    for i in range(1000):  # a flood of addresses: the oldest entries go first
        t.failed(f"10.1.{i // 256}.{i % 256}", 1.0)
    assert len(t) == 100
    assert t.failures("10.0.0.1", 1.0) == 0 and t.failures("10.1.3.231", 1.0) == 1


def test_handshake_slots_per_source_and_in_all():
    slots = HandshakeSlots(per_source=2, total=3)
    assert slots.acquire("a") is None and slots.acquire("a") is None
    assert "from a" in (slots.acquire("a") or "") and "handshake_max_per_source" in (slots.acquire("a") or "")
    assert slots.acquire("b") is None
    assert "leveret.handshake_max)" in (slots.acquire("c") or "")
    slots.release("a")
    assert slots.acquire("c") is None and slots.used == 3
    slots.release("zzz")  # never held: nothing changes
    assert slots.used == 3 and slots.held("a") == 1
    unlimited = HandshakeSlots(per_source=0, total=0)
    assert all(unlimited.acquire("x") is None for _ in range(10_000))


@pytest.mark.parametrize("gap, logged", [(0.1, 1), (1.5, 2)])
def test_refusals_are_logged_at_most_once_a_second(gap, logged):
    lines: list[dict] = []
    log = RefusalLog(lambda event, **kw: lines.append(kw))
    log.refused("per_source", 10.0, peer="a")
    for i in range(5):
        log.refused("per_source", 10.0 + gap * (i + 1) / 5, peer="a")
    log.refused("total", 10.0, peer="b")  # another kind has its own second
    from_a = [x for x in lines if x["peer"] == "a"]
    assert len(from_a) == logged and "refused_since_last_logged" not in from_a[0]
    if logged == 2:  # at 11.2 s, after three refusals (10.3, 10.6, 10.9) that were not logged
        assert from_a[1]["refused_since_last_logged"] == 3
    assert [x["peer"] for x in lines].count("b") == 1
