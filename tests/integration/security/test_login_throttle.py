"""Hardening against clients that never log in (issue 17): a per-address delay after repeated failed logins
(broker/security/login_throttle.py) and a cap on connections that have not finished their handshake, per
address and in all (broker/security/handshake_guard.py).

The clients come from different loopback addresses (127.0.0.2, .3, ...: Linux routes all of 127/8 to lo), so one
broker sees several sources; loopback addresses are exempt from the delay by default (the operator's own tools and
this suite), so the broker here sets ``leveret.login_throttle.exempt_loopback = false``."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from pamqp import commands
from rawamqp import ConnectionClosedError, RawAMQPClient, plain_response

from tests.conftest import BrokerProcess, free_port

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(120)]

DELAY, MAX_DELAY, AFTER = 0.5, 2.0, 5
PER_SOURCE, TOTAL = 4, 6


@pytest.fixture(scope="module")
def guarded(tmp_path_factory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("guarded")
    keys = {"leveret.login_throttle.exempt_loopback": "false", "leveret.login_throttle.after_failures": AFTER,
            "leveret.login_throttle.delay": int(DELAY * 1000), "leveret.login_throttle.max_delay": int(MAX_DELAY * 1000),
            "leveret.handshake_max_per_source": PER_SOURCE, "leveret.handshake_max": TOTAL}
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log",
                      extra_args=[a for k, v in keys.items() for a in ("--set", f"{k}={v}")])
    b.start()
    try:
        yield b
    finally:
        b.stop()
        assert "Traceback" not in b.log_text()


def connect_from(b: BrokerProcess, source: str, password: str = "guest") -> RawAMQPClient:
    c = RawAMQPClient(b.host, b.port, connect=False, password=password, timeout=10)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect((b.host, b.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sock = sock
    return c


def send_start_ok(c: RawAMQPClient) -> None:
    """Protocol header, connection.start, and a PLAIN start-ok (authentication_failure_close: a refusal is a
    connection.close 403)."""
    c.send_protocol_header()
    c.expect_method(commands.Connection.Start, 0)
    c.send_method(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism="PLAIN",
        response=plain_response(c.user, c.password), locale="en_US"))


def login_answer(c: RawAMQPClient) -> tuple[str, float]:
    """Wait for the answer to start-ok: "tune" (logged in) or "refused"; and when it came (monotonic)."""
    f = c.wait_for(lambda f: f.is_method(commands.Connection.Tune) or f.is_method(commands.Connection.Close))
    return ("tune" if f.is_method(commands.Connection.Tune) else "refused"), time.monotonic()


def timed_login(b: BrokerProcess, source: str, password: str) -> tuple[str, float]:
    with connect_from(b, source, password) as c:
        send_start_ok(c)
        sent = time.monotonic()
        answer, at = login_answer(c)
        return answer, at - sent


def test_repeated_failures_delay_logins_from_that_address_only(guarded):
    took = []
    for _ in range(9):
        answer, seconds = timed_login(guarded, "127.0.0.2", "wrong")
        assert answer == "refused"
        took.append(seconds)
    # The first AFTER failures are answered at once; then 0.5, 1, 2, 2 s.
    assert all(t < DELAY for t in took[:AFTER]), took
    for t, expected in zip(took[AFTER:], (0.5, 1.0, 2.0, 2.0), strict=True):
        assert t >= expected - 0.05, took
    # The 10th wrong password from 127.0.0.2 waits the full delay; while it waits, a correct login from
    # another address is answered at once (the wait is a timer, not a blocked loop).
    with connect_from(guarded, "127.0.0.2", "wrong") as attacker:
        send_start_ok(attacker)
        sent = time.monotonic()
        answer, seconds = timed_login(guarded, "127.0.0.3", "guest")
        assert answer == "tune" and seconds < DELAY, seconds
        answer, at = login_answer(attacker)
        assert answer == "refused" and at - sent >= MAX_DELAY - 0.05
    # A correct password from the throttled address waits too (else a fast answer would tell a guesser it won).
    answer, seconds = timed_login(guarded, "127.0.0.2", "guest")
    assert answer == "tune" and seconds >= MAX_DELAY - 0.05
    # A wrong password from a third address is not delayed by the second one's failures.
    answer, seconds = timed_login(guarded, "127.0.0.4", "wrong")
    assert answer == "refused" and seconds < DELAY
    warned = [json.loads(line) for line in guarded.log_text().splitlines()
              if "repeated failed logins" in line]
    assert [w["peer"] for w in warned] == ["127.0.0.2"]


def test_unfinished_handshakes_are_capped_per_address_and_in_all(guarded):
    def silent_from(source: str) -> socket.socket:
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(5)
        s.connect((guarded.host, guarded.port))
        return s

    def closed_at_once(s: socket.socket) -> bool:
        s.settimeout(2)
        try:
            return s.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    held = [silent_from("127.0.0.5") for _ in range(PER_SOURCE)]
    try:
        # One more from the same address is closed at once; another address still gets in.
        extra = silent_from("127.0.0.5")
        assert closed_at_once(extra)
        extra.close()
        with connect_from(guarded, "127.0.0.6") as c:
            c.handshake()  # a finished handshake gives its slot back
        held += [silent_from("127.0.0.6"), silent_from("127.0.0.7")]  # TOTAL unfinished now
        extra = silent_from("127.0.0.8")
        assert closed_at_once(extra)
        extra.close()
        # A socket that goes frees its slot: the next one from that address is served.
        held.pop(0).close()
        deadline = time.monotonic() + 5
        while True:  # until the broker has seen that close
            try:
                with connect_from(guarded, "127.0.0.5") as c:
                    c.handshake()
                break
            except ConnectionClosedError:
                assert time.monotonic() < deadline, "the closed socket's slot was not given back"
                time.sleep(0.05)
        for s in held:  # the admitted ones are alive: they get connection.start once they speak
            s.sendall(b"AMQP\x00\x00\x09\x01")
            assert s.recv(7)[:1] == b"\x01"
    finally:
        for s in held:
            s.close()
    refusals = [json.loads(line) for line in guarded.log_text().splitlines() if "before its handshake" in line]
    assert {r["peer"] for r in refusals} == {"127.0.0.5", "127.0.0.8"}
    assert any("handshake_max_per_source" in r["reason"] for r in refusals)
    assert any("(leveret.handshake_max)" in r["reason"] for r in refusals)


def test_a_login_storm_from_one_address_leaves_others_served(guarded):
    """Many concurrent wrong logins from one address (those past its PER_SOURCE unfinished handshakes closed at
    once, the others refused, later ones after a delay): a login from elsewhere is served meanwhile at once."""
    outcomes: list[str] = []
    lock = threading.Lock()

    def guess() -> None:
        try:
            with connect_from(guarded, "127.0.0.9", "wrong") as c:
                send_start_ok(c)
                result = login_answer(c)[0]
        except (ConnectionClosedError, OSError):
            result = "closed"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=guess) for _ in range(12)]
    for t in threads:
        t.start()
    answer, seconds = timed_login(guarded, "127.0.0.10", "guest")
    for t in threads:
        t.join(30)
    assert answer == "tune" and seconds < DELAY
    assert len(outcomes) == 12 and set(outcomes) <= {"refused", "closed"} and "refused" in outcomes, outcomes
