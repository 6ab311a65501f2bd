"""The real broker with an operator's production rabbitmq.conf (tests/data/production-rabbitmq.conf): without
``leveret.unsupported_keys = warn`` it stops with one message naming every key it cannot use; with it, it starts,
logs one warning naming them, and its clients see the file's user, vhost and connection tuning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from conftest import ROOT, free_port

pytestmark = pytest.mark.leveret_only

PRODUCTION = Path(__file__).resolve().parents[1] / "data" / "production-rabbitmq.conf"
UNSUPPORTED_LINES = [6, 7, 8, 12, 13, 14, 15, 40, 45, 46, 47, 48, 49, 65, 66, 67, 68]


def test_without_warn_start_up_stops_naming_every_unsupported_key(tmp_path):
    out = subprocess.run([sys.executable, "-m", "broker", "serve", "--config", str(PRODUCTION), "--data-dir",
                          str(tmp_path / "data"), "--port", str(free_port())],
                         capture_output=True, text=True, timeout=30, check=False, cwd=ROOT, env=dict(os.environ))
    assert out.returncode == 2
    assert out.stderr.startswith(f"leveret: {len(UNSUPPORTED_LINES)} configuration problems:\n")
    for lineno in UNSUPPORTED_LINES:
        assert f"{PRODUCTION}:{lineno}: '" in out.stderr
    assert "leveret.unsupported_keys = warn" in out.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_with_warn_the_broker_starts_with_the_files_settings(start_broker, tmp_path):
    logs = tmp_path / "logs"
    # Only what must differ on a test machine: the log directory, and the HTTP API on loopback (its port is
    # the fixture's own; --bind and --port override the AMQP listener as on any test broker).
    b = start_broker("--config", str(PRODUCTION), "--set", "leveret.unsupported_keys=warn",
                     "--set", f"log.dir={logs}", "--set", "management.tcp.ip=127.0.0.1")
    b.user, b.password, b.vhost = "orders-admin", "S3cr3t#2024=ok", "orders"
    conn = pika.BlockingConnection(b.pika_params())
    try:
        assert conn._impl.params.heartbeat == 30
        assert conn._impl.params.channel_max == 128
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"order 1")
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert method is not None and body == b"order 1"
    finally:
        conn.close()
    # log.console = false: the log is <log.dir>/rabbit.log (JSON lines), with the one warning
    records = [json.loads(line) for line in (logs / "rabbit.log").read_text().splitlines() if line.strip()]
    [warning] = [r for r in records if "leveret.unsupported_keys = warn" in r.get("event", "")]
    assert warning["level"] == "warning"
    assert f"ignoring {len(UNSUPPORTED_LINES)} configuration keys" in warning["event"]
    for key in ("cluster_formation.peer_discovery_backend (line 45)", "ssl_options.verify (line 15)",
                "mqtt.listeners.tcp.default (line 65)", "cluster_partition_handling (line 49)"):
        assert key in warning["event"]
