"""HTTPS for the HTTP API and Prometheus, with RabbitMQ's keys (``management.ssl.*``, ``prometheus.ssl.*``), and the
TLS listeners seen from outside: ``/api/overview``'s listeners, the protocol-listener health checks, ``leveret ctl``
and RabbitMQ's own ``rabbitmqadmin`` over HTTPS, and a failed TLS handshake on the AMQP-over-TLS port logged with
the client's address and the reason. Certificates are made here by trustme, as in test_tls_listener.py.

As RabbitMQ: with a management.ssl.* key HTTPS is served, and plain HTTP beside it only when a plain-listener key
(management.tcp.*; the fixture's ``--management-port`` is one) was given too."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trustme

from broker.config import ConfigError, load_settings, rabbitmq_only_feature
from tests.conftest import ROOT, BrokerProcess, free_port

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(120)]

AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


@pytest.fixture(scope="module")
def certs() -> Iterator[SimpleNamespace]:
    ca = trustme.CA(organization_name="Leveret HTTPS test CA")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.leveret.test", common_name="leveret-https-client")
    other_ca = trustme.CA(organization_name="Some other CA")
    with tempfile.TemporaryDirectory(prefix="leveret-https-") as d:
        root = Path(d)
        paths = SimpleNamespace(dir=root, ca=root / "ca.pem", cert=root / "server.pem", key=root / "server.key",
                                client_cert=root / "client.pem", client_key=root / "client.key",
                                ca_obj=ca, client=client, other_ca=other_ca)
        ca.cert_pem.write_to_path(str(paths.ca))
        server.private_key_pem.write_to_path(str(paths.key))
        paths.cert.write_bytes(server.cert_chain_pems[0].bytes())
        client.private_key_pem.write_to_path(str(paths.client_key))
        paths.client_cert.write_bytes(client.cert_chain_pems[0].bytes())
        yield paths


def sets(keys: dict[str, Any]) -> list[str]:
    return [arg for key, value in keys.items() for arg in ("--set", f"{key}={value}")]


def server_keys(certs: SimpleNamespace, prefix: str, **extra: Any) -> dict[str, Any]:
    return {f"{prefix}.cacertfile": certs.ca, f"{prefix}.certfile": certs.cert, f"{prefix}.keyfile": certs.key,
            **{f"{prefix}.{k}": v for k, v in extra.items()}}


@pytest.fixture(scope="module")
def https_broker(certs) -> Iterator[BrokerProcess]:
    """HTTPS for the API and Prometheus beside their plain listeners (the fixture gives --management-port and
    --prometheus-port), and AMQP over TLS."""
    tmp = Path(tempfile.mkdtemp(prefix="leveret-https-broker-"))
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log")
    b.https_port, b.prom_https_port, b.tls_port = free_port(), free_port(), free_port()  # type: ignore[attr-defined]
    b.extra_args = sets({**server_keys(certs, "management.ssl", port=b.https_port,  # type: ignore[attr-defined]
                                       password="s3cret-key-pw"),  # the key is not encrypted: never asked for
                         **server_keys(certs, "prometheus.ssl", port=b.prom_https_port, ip="127.0.0.1"),  # type: ignore[attr-defined]
                         **server_keys(certs, "ssl_options"), "listeners.ssl.default": b.tls_port,  # type: ignore[attr-defined]
                         "ssl_handshake_timeout": 2000})
    b.start()
    wait_until_serving(f"https://127.0.0.1:{b.https_port}/api/overview", client_context(certs))  # type: ignore[attr-defined]
    try:
        yield b
    finally:
        b.stop()
        assert "Traceback" not in b.log_text()
        shutil.rmtree(tmp, ignore_errors=True)


def client_context(certs: SimpleNamespace, *, with_cert: bool = False, ca=None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    (ca or certs.ca_obj).configure_trust(ctx)
    if with_cert:
        certs.client.configure_cert(ctx)
    return ctx


def get(url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers=AUTH)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_until_serving(url: str, ctx: ssl.SSLContext | None, timeout: float = 15.0) -> None:
    """The broker fixture waits for the AMQP port; the HTTP listeners come up just after it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url, ctx)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_api_and_prometheus_over_https_beside_plain_http(https_broker, certs):
    b = https_broker
    ctx = client_context(certs)
    status, overview = get(f"https://127.0.0.1:{b.https_port}/api/overview", ctx)
    assert status == 200
    listeners = {(li["protocol"], li["port"]) for li in overview["listeners"]}
    # RabbitMQ's protocol names: https for the API, https/prometheus, amqp/ssl.
    assert {("https", b.https_port), ("https/prometheus", b.prom_https_port), ("amqp/ssl", b.tls_port),
            ("http", b.management_port), ("http/prometheus", b.prometheus_port), ("amqp", b.port)} <= listeners
    # The plain listeners still serve (their keys were given), and only plain HTTP: TLS on them fails.
    assert get(f"http://127.0.0.1:{b.management_port}/api/overview")[0] == 200
    with pytest.raises(urllib.error.URLError, match="WRONG_VERSION_NUMBER"):
        get(f"https://127.0.0.1:{b.management_port}/api/overview", ctx)
    status, text = get(f"https://127.0.0.1:{b.prom_https_port}/metrics", ctx)
    assert status == 200 and "rabbitmq_connections" in text
    # A client that does not trust the server's CA is refused by its own check.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(f"https://127.0.0.1:{b.https_port}/api/overview", client_context(certs, ca=certs.other_ca))


def test_protocol_listener_health_checks_follow_the_listeners(https_broker, certs):
    b = https_broker
    base = f"https://127.0.0.1:{b.https_port}/api/health/checks/protocol-listener"
    ctx = client_context(certs)
    for name, protocol in (("amqps", "amqp/ssl"), ("https", "https"), ("http", "http"), ("amqp091", "amqp"),
                           ("https%2Fprometheus", "https/prometheus"), ("prometheus", "http/prometheus")):
        assert get(f"{base}/{name}", ctx) == (200, {"status": "ok", "protocol": protocol}), name
    status, body = get(f"{base}/stomp", ctx)
    assert status == 503 and body["reason"] == "No active listener" and body["missing"] == "stomp"
    assert {"amqp", "amqp/ssl", "http", "https", "http/prometheus", "https/prometheus"} == set(body["protocols"])


def ctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "ctl", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False, env=dict(os.environ, **(env or {})))


def test_leveret_ctl_over_https(https_broker, certs):
    url = f"https://127.0.0.1:{https_broker.https_port}"
    out = ctl("--url", url, "--cacert", str(certs.ca), "--formatter", "json", "list_vhosts", "name")
    assert out.returncode == 0, out.stderr
    assert {"name": "/"} in json.loads(out.stdout)
    out = ctl("--url", url, "-q", "list_vhosts", env={"LEVERET_CTL_CACERT": str(certs.ca)})
    assert out.returncode == 0 and "/" in out.stdout.split(), out.stderr
    # Without the CA the server's certificate is not trusted: the broker is unreachable (69), and says why.
    out = ctl("--url", url, "list_vhosts")
    assert out.returncode == 69 and "CERTIFICATE_VERIFY_FAILED" in out.stderr
    assert ctl("--url", url, "--insecure", "list_vhosts").returncode == 0
    out = ctl("--url", url, "--insecure", "environment")
    assert out.returncode == 0 and "management_ssl" in out.stdout and "s3cret-key-pw" not in out.stdout
    out = ctl("--url", url, "--cacert", str(certs.dir / "missing.pem"), "list_vhosts")
    assert out.returncode == 64 and "--cacert" in out.stderr
    diag = subprocess.run([sys.executable, "-m", "broker", "diagnostics", "--url", url, "--cacert", str(certs.ca),
                           "check_protocol_listener", "https"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert diag.returncode == 0 and "https is running" in diag.stdout, diag.stderr


def _rabbitmqadmin() -> str | None:
    found = shutil.which("rabbitmqadmin")
    if found:
        return found
    for path in sorted(Path("/usr/lib/rabbitmq/lib").glob("*/plugins/rabbitmq_management-*/priv/www/cli/"
                                                          "rabbitmqadmin")):
        return str(path)
    return None


def test_rabbitmqadmin_over_https(https_broker, certs):
    tool = _rabbitmqadmin()
    if tool is None:
        pytest.skip("rabbitmqadmin is not installed (apt-get install rabbitmq-server ships it)")
    name = f"https-q-{os.getpid()}"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, tool, "-H", "127.0.0.1", "-P", str(https_broker.https_port),
                               "-u", "guest", "-p", "guest", "--ssl", *args, "-f", "raw_json"],
                              capture_output=True, text=True, timeout=30, check=False)

    out = run("--ssl-ca-cert-file", str(certs.ca), "declare", "queue", f"name={name}", "durable=false")
    assert out.returncode == 0, out.stderr + out.stdout
    out = run("--ssl-ca-cert-file", str(certs.ca), "list", "queues", "name")
    assert out.returncode == 0, out.stderr + out.stdout
    assert {"name": name} in json.loads(out.stdout)
    out = run("--ssl-ca-cert-file", str(certs.ca), "delete", "queue", f"name={name}")
    assert out.returncode == 0, out.stderr + out.stdout


# -- a failed TLS handshake on the AMQP-over-TLS port is logged with the client's address and the reason -------------

def _failed_handshake_lines(b: BrokerProcess, client_port: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [entry for line in b.log_text().splitlines() if line.startswith("{")
                 for entry in [json.loads(line)]
                 if entry.get("event") == "TLS handshake failed"
                 and entry.get("connection", "").startswith(f"127.0.0.1:{client_port} ")]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _tls_client(b: BrokerProcess, ctx: ssl.SSLContext) -> int:
    """A TLS handshake (and a read) that the test expects to fail; the client's port."""
    raw = socket.create_connection(("127.0.0.1", b.tls_port), timeout=5)
    port = raw.getsockname()[1]
    try:
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            s.sendall(b"AMQP\x00\x00\x09\x01")
            if not s.recv(7):
                raise ConnectionResetError
    finally:
        raw.close()
    return port


def test_failed_tls_handshakes_are_logged_with_the_peer_and_the_reason(https_broker, certs):
    b = https_broker
    # A client that does not trust our certificate: it sends an alert, which the broker reports.
    port = _tls_client(b, client_context(certs, ca=certs.other_ca))
    [line] = _failed_handshake_lines(b, port)
    assert line["level"] == "warning" and line["peer"] == "127.0.0.1"
    assert "unknown ca" in line["reason"], line
    # Plaintext AMQP on the TLS port.
    with socket.create_connection(("127.0.0.1", b.tls_port), timeout=5) as sock:
        port = sock.getsockname()[1]
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        sock.settimeout(5)
        try:
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            pass
    [line] = _failed_handshake_lines(b, port)
    assert "wrong version number" in line["reason"] or "http request" in line["reason"], line
    # TLS 1.1 at most (SECLEVEL=0 so that the local OpenSSL itself lets the client try).
    ctx = client_context(certs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    port = _tls_client(b, ctx)
    lines = _failed_handshake_lines(b, port, timeout=3.0)
    # OpenSSL may refuse to send a TLS 1.1 ClientHello at all (then the broker saw the socket close).
    assert len(lines) == 1, lines
    assert any(r in lines[0]["reason"] for r in ("unsupported protocol", "closed by the client", "version")), lines
    # A handshake that never starts is logged once its ssl_handshake_timeout (2 s here) is up.
    with socket.create_connection(("127.0.0.1", b.tls_port), timeout=5) as silent:
        port = silent.getsockname()[1]
        [line] = _failed_handshake_lines(b, port, timeout=10.0)
    assert line["reason"] == "handshake timed out"
    # And the listener goes on serving.
    ctx = client_context(certs)
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", b.tls_port), timeout=5),
                         server_hostname="127.0.0.1") as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        assert s.recv(7)[:1] == b"\x01"  # connection.start's method frame


# -- HTTPS alone, with client certificates -------------------------------------------------------------------------

def test_https_alone_with_verify_peer(start_broker, certs):
    """management.ssl.* without a management.tcp.* key: HTTPS only (RabbitMQ's rule), on the configured port;
    with verify_peer and fail_if_no_peer_cert a client without a certificate is refused."""
    https_port = free_port()
    b = start_broker(*sets({**server_keys(certs, "management.ssl", port=https_port, verify="verify_peer",
                                          fail_if_no_peer_cert="true", **{"versions.1": "tlsv1.2"}),
                            "prometheus.tcp.port": free_port()}), own_http_ports=False)
    ctx = client_context(certs, with_cert=True)
    wait_until_serving(f"https://127.0.0.1:{https_port}/api/overview", ctx)
    status, overview = get(f"https://127.0.0.1:{https_port}/api/overview", ctx)
    assert status == 200
    protocols = {li["protocol"] for li in overview["listeners"]}
    assert "https" in protocols and "http" not in protocols, protocols
    status, body = get(f"https://127.0.0.1:{https_port}/api/health/checks/protocol-listener/http", ctx)
    assert status == 503 and body["missing"] == "http"
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
        get(f"https://127.0.0.1:{https_port}/api/overview", client_context(certs))  # no client certificate
    with socket.create_connection(("127.0.0.1", https_port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls_sock:
        assert tls_sock.version() == "TLSv1.2"  # management.ssl.versions.1
    out = ctl("--url", f"https://127.0.0.1:{https_port}", "--cacert", str(certs.ca), "--cert", str(certs.client_cert),
              "--key", str(certs.client_key), "-q", "list_vhosts")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in b.log_text()


def test_https_keys_and_start_up_refusals(certs, tmp_path):
    for key in ("management.ssl.port", "management.ssl.certfile", "management.ssl.verify",
                "management.ssl.versions.1", "management.ssl.ciphers.1", "prometheus.ssl.port",
                "prometheus.ssl.fail_if_no_peer_cert"):
        assert rabbitmq_only_feature(key) is None, key
    assert rabbitmq_only_feature("management.ssl.depth") == "an HTTPS listener option Leveret does not have"
    assert rabbitmq_only_feature("prometheus.ssl.honor_cipher_order") is not None
    s = load_settings(None, overrides=[("prometheus.ssl.certfile", str(certs.cert)),
                                       ("management.tcp.port", "15000")], environ={})
    assert s.prometheus_ssl.configured and s.prometheus_ssl.port is None  # served on RabbitMQ's 15691
    assert s.http_configured == {"management"} and not s.management_ssl.configured
    with pytest.raises(ConfigError, match="'management.ssl.versions.1 = tlsv1.1' asks for tlsv1.1"):
        load_settings(None, overrides=[("management.ssl.versions.1", "tlsv1.1")], environ={})
    cmd = [sys.executable, "-m", "broker", "serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "d"),
           "--set", f"management.ssl.port={free_port()}", "--set", f"prometheus.tcp.port={free_port()}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
                         env=dict(os.environ, LEVERET_LOG_FORMAT="json"))
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout
    [line] = [line for line in out.stderr.splitlines() if line.startswith("leveret:")]
    assert line == ("leveret: cannot start the HTTPS (HTTP API) listener: management.ssl.* is set but "
                    "management.ssl.certfile and management.ssl.keyfile are not: a TLS listener needs the "
                    "server's certificate and private key")
    assert not (tmp_path / "d").exists()
