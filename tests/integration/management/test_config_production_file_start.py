"""The real broker with an operator's production rabbitmq.conf (tests/data/production-rabbitmq.conf): without
``leveret.unsupported_keys = warn`` it stops with one message naming every key it cannot use; with it, it starts,
logs one warning naming them, and its clients see the file's user, vhost and connection tuning, and its TLS
listener (verify_peer) once its certificate files exist; while they do not, start-up stops naming the file."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pika
import pytest
import trustme

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.leveret_only

PRODUCTION = Path(__file__).resolve().parents[2] / "data" / "production-rabbitmq.conf"
UNSUPPORTED_LINES = [7, 8, 40, 45, 46, 47, 48, 49, 65, 66, 67, 68]  # lines 6 and 12-15 (TLS) are read


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


def test_with_warn_but_without_the_files_certificates_start_up_stops_naming_the_file(tmp_path):
    # As RabbitMQ, which does not start a TLS listener whose certificate files it cannot read.
    out = subprocess.run([sys.executable, "-m", "broker", "serve", "--config", str(PRODUCTION), "--data-dir",
                          str(tmp_path / "data"), "--port", str(free_port()), "--set", "leveret.unsupported_keys=warn",
                          "--set", f"log.dir={tmp_path / 'logs'}", "--set", f"listeners.ssl.default={free_port()}"],
                         capture_output=True, text=True, timeout=30, check=False, cwd=ROOT, env=dict(os.environ))
    assert out.returncode == 1
    assert out.stderr.strip() == ("leveret: cannot start the AMQP-over-TLS listener: ssl_options.certfile = "
                                  "/etc/rabbitmq/tls/server_certificate.pem: cannot read it: No such file or directory")
    assert not (tmp_path / "data").exists()


def test_with_warn_the_broker_starts_with_the_files_settings(start_broker, tmp_path):
    logs = tmp_path / "logs"
    # The file's certificates, made here at the paths' names (the file's own paths are /etc/rabbitmq/tls/).
    ca = trustme.CA()
    tls = tmp_path / "tls"
    tls.mkdir()
    ca.cert_pem.write_to_path(str(tls / "ca_certificate.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(tls / "server_certificate.pem"))
    server.private_key_pem.write_to_path(str(tls / "server_key.pem"))
    tls_port = free_port()
    # Only what must differ on a test machine: the log directory, the HTTP API on loopback (its port is
    # the fixture's own; --bind and --port override the AMQP listener as on any test broker), the TLS port
    # and the certificate files' directory.
    b = start_broker("--config", str(PRODUCTION), "--set", "leveret.unsupported_keys=warn",
                     "--set", f"log.dir={logs}", "--set", "management.tcp.ip=127.0.0.1",
                     "--set", f"listeners.ssl.default={tls_port}",
                     *[arg for key, name in (("cacertfile", "ca_certificate.pem"), ("certfile", "server_certificate.pem"),
                                             ("keyfile", "server_key.pem"))
                       for arg in ("--set", f"ssl_options.{key}={tls / name}")])
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
    # The file's TLS listener: verify_peer without fail_if_no_peer_cert, so a client that trusts the CA gets
    # in without a certificate of its own (one from the CA would be checked).
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(ctx)
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", tls_port, "orders", pika.PlainCredentials(b.user, b.password), connection_attempts=1,
        socket_timeout=5, ssl_options=pika.SSLOptions(ctx, server_hostname="127.0.0.1")))
    try:
        assert conn._impl.params.heartbeat == 30
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"order 2 over TLS")
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert method is not None and body == b"order 2 over TLS"
    finally:
        conn.close()
    # log.console = false: the log is <log.dir>/rabbit.log (JSON lines), with the one warning
    records = [json.loads(line) for line in (logs / "rabbit.log").read_text().splitlines() if line.strip()]
    [warning] = [r for r in records if "leveret.unsupported_keys = warn" in r.get("event", "")]
    assert warning["level"] == "warning"
    assert f"ignoring {len(UNSUPPORTED_LINES)} configuration keys" in warning["event"]
    for key in ("cluster_formation.peer_discovery_backend (line 45)", "tcp_listen_options.backlog (line 7)",
                "mqtt.listeners.tcp.default (line 65)", "cluster_partition_handling (line 49)"):
        assert key in warning["event"]
    assert "ssl" not in warning["event"]
    assert {"protocol": "amqp/ssl", "address": f"127.0.0.1:{tls_port}"} in [
        li for r in records if r.get("event") == "Leveret started" for li in r["listeners"]]
