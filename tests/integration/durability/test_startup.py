"""Start-up as operators meet it: one broker per data directory, listeners on both loopbacks (a
``localhost`` that resolves to ::1), every address when told so, and a refused start — one clear line,
no traceback — when a port is taken or the data directory can't be written."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest
from leftovers import record_mount

from tests.conftest import ROOT, BrokerProcess, free_port

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(90)]


def serve(data_dir: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """``leveret serve`` expected to refuse: returns once it exits (a broker that listens instead is killed
    by the timeout and fails the test)."""
    cmd = [sys.executable, "-m", "broker", "serve", "--port", str(free_port()), "--data-dir", str(data_dir),
           "--management-port", str(free_port()), "--prometheus-port", str(free_port()), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
                          env=dict(os.environ, LEVERET_LOG_FORMAT="json"))


def refused_with_one_line(out: subprocess.CompletedProcess, *fragments: str) -> None:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr + out.stdout
    lines = [line for line in out.stderr.splitlines() if line.startswith("leveret:")]
    assert len(lines) == 1, out.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def round_trip(host: str, port: int) -> None:
    c = pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=1, socket_timeout=5))
    try:
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x")
        assert ch.basic_get(q, auto_ack=True)[2] == b"x"
    finally:
        c.close()


def test_a_second_broker_on_the_same_data_directory_is_refused_naming_the_first(start_broker, tmp_path):
    first = start_broker(data_dir=tmp_path / "shared")
    out = serve(tmp_path / "shared")
    refused_with_one_line(out, "in use by another Leveret process", f"pid {first.pid}")
    round_trip("127.0.0.1", first.port)  # the first one is unharmed
    first.kill9()  # the kernel drops the lock with the process: a restart is not blocked by a stale file
    first.start()
    round_trip("127.0.0.1", first.port)


def test_a_taken_http_port_stops_the_start_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = serve(tmp_path / "d", "--management-port", str(port))
        refused_with_one_line(out, "HTTP API", str(port))
        out = serve(tmp_path / "d", "--prometheus-port", str(port))
        refused_with_one_line(out, "Prometheus", str(port))


def test_an_unusable_data_directory_is_one_clear_line(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    out = serve(not_a_dir / "data")
    refused_with_one_line(out, str(not_a_dir / "data"))


def test_a_read_only_data_directory_is_one_clear_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    record_mount(ro)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        out = serve(ro / "data")
        refused_with_one_line(out, str(ro / "data"), "Read-only file system")
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True, check=False)


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_the_default_listens_on_both_loopbacks(start_broker):
    if not ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    b = start_broker()
    round_trip("127.0.0.1", b.port)
    round_trip("::1", b.port)  # where localhost resolves to ::1
    assert any("::1" in line for line in b.log_text().splitlines() if '"listening"' in line or "listening" in line)


def test_binding_all_addresses_listens_on_ipv4_and_ipv6(tmp_path):
    if not ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp_path / "d", log_path=tmp_path / "b.log",
                      extra_args=["--bind", "0.0.0.0"])
    b.start()
    try:
        round_trip("127.0.0.1", b.port)
        round_trip("::1", b.port)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("::1", b.management_port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the HTTP API does not listen on IPv6 when bound to all addresses")
    finally:
        b.stop()
