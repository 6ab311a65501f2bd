"""Start-up with configuration: a bad file stops the broker with one clear message on stderr; a good one
(and the command line over it) sets the listeners."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.leveret_only


def serve(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "serve", "--data-dir", str(tmp_path / "data"), *args],
                          capture_output=True, text=True, timeout=30, check=False, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("text, fragments", [
    ("heartbeat = 5\nbogus.key = 1\n", [":2: unknown configuration key 'bogus.key'"]),
    ("channel_max = lots\n", [":1: bad value 'lots' for 'channel_max'", "allowed: a number of channels"]),
    ("prometheus.tcp.port = -1\n", [":1:", "'prometheus.tcp.port'", "allowed: a port number"]),
])
def test_bad_config_file_stops_startup(tmp_path, text, fragments):
    conf = tmp_path / "bad.conf"
    conf.write_text(text)
    out = serve(tmp_path, "--config", str(conf), "--port", str(free_port()))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("leveret: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_unreadable_config_file_and_bad_env_and_bad_flag(tmp_path):
    out = serve(tmp_path, "--config", str(tmp_path / "nope.conf"))
    assert out.returncode == 2 and "cannot read configuration file" in out.stderr
    out = serve(tmp_path, env={"LEVERET_HEARTBEAT": "often"})
    assert out.returncode == 2 and "environment variable LEVERET_HEARTBEAT" in out.stderr
    out = serve(tmp_path, "--management-port", "99999")
    assert out.returncode == 2 and "'management.tcp.port'" in out.stderr
    out = serve(tmp_path, "--set", "no.such=1")
    assert out.returncode == 2 and "unknown configuration key 'no.such'" in out.stderr


def test_amqp_port_in_use_is_one_clear_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = serve(tmp_path, "--port", str(port), "--management-port", "0", "--prometheus-port", "0")
    assert out.returncode == 1 and f"cannot listen for AMQP on 127.0.0.1:{port}" in out.stderr


def test_ports_from_file_with_command_line_over_it(start_broker, tmp_path):
    mport, pport, other = free_port(), free_port(), free_port()
    conf = tmp_path / "good.conf"
    conf.write_text(f"management.tcp.port = {other}\nprometheus.tcp.port = {pport}\nheartbeat = 30\n")
    b = start_broker("--config", str(conf), "--management-port", str(mport), own_http_ports=False)
    import time

    deadline = time.monotonic() + 10
    while True:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{pport}/metrics", timeout=1).read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert "rabbitmq_identity_info" in text
    req = urllib.request.Request(f"http://127.0.0.1:{mport}/api/whoami",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    assert b'"guest"' in urllib.request.urlopen(req, timeout=5).read()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{other}/api/whoami", timeout=1)
    assert b.process.poll() is None


def test_a_misspelled_environment_variable_is_logged_at_start(start_broker, monkeypatch):
    monkeypatch.setenv("LEVERET_LISTENERS_TCP_DEFAUT", "5999")
    b = start_broker("--management-port", "0", "--prometheus-port", "0")
    text = b.log_text()
    assert "LEVERET_LISTENERS_TCP_DEFAUT is not a Leveret setting" in text
    assert "did you mean LEVERET_LISTENERS_TCP_DEFAULT?" in text
