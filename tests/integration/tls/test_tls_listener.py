"""AMQP over TLS (amqps) as RabbitMQ's keys set it up: ``listeners.ssl.default`` with ``ssl_options.*``, certificates
made here by trustme (a CA, a server certificate for 127.0.0.1 and localhost, a client certificate).

With verify_peer and fail_if_no_peer_cert: pika and aio-pika with a client certificate get in; a client that does
not trust the server's CA, a client without a certificate and a TLS 1.1 client do not. A plaintext AMQP client on
the TLS port and a client that never finishes its handshake are closed (the latter after ssl_handshake_timeout)
and the broker goes on serving. A certificate file that cannot be read stops start-up with one line."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import selectors
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pika
import pytest
import trustme

from broker.config import ConfigError, Settings, load_settings, rabbitmq_only_feature
from broker.security.tls import TLSSetupError, connection_tls_info, server_context
from tests.conftest import ROOT, BrokerProcess, free_port

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(120)]

SSL_HANDSHAKE_TIMEOUT_MS = 1500
# What pika's BlockingConnection raises when TLS fails: the SSL error itself (the client's verification) or
# its connection error (the server's alert, read as a closed connection).
PIKA_REFUSED = (pika.exceptions.AMQPConnectionError, ssl.SSLError, ConnectionError)


@pytest.fixture(scope="module")
def certs() -> Iterator[SimpleNamespace]:
    ca = trustme.CA(organization_name="Leveret test CA")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.leveret.test", common_name="leveret-test-client",
                           organization_name="Leveret tests")
    other_ca = trustme.CA(organization_name="Some other CA")
    with tempfile.TemporaryDirectory(prefix="leveret-tls-") as d:
        root = Path(d)
        paths = SimpleNamespace(dir=root, ca=root / "ca.pem", cert=root / "server.pem", key=root / "server.key",
                                client=client, ca_obj=ca, other_ca=other_ca)
        ca.cert_pem.write_to_path(str(paths.ca))
        server.private_key_pem.write_to_path(str(paths.key))
        with open(paths.cert, "wb") as f:  # the server's certificate alone: the chain is the CA itself
            f.write(server.cert_chain_pems[0].bytes())
        yield paths


def tls_keys(certs: SimpleNamespace, port: int, **extra: str) -> list[str]:
    keys = {"listeners.ssl.default": f"127.0.0.1:{port}", "ssl_options.cacertfile": str(certs.ca),
            "ssl_options.certfile": str(certs.cert), "ssl_options.keyfile": str(certs.key),
            "ssl_options.verify": "verify_peer", "ssl_options.fail_if_no_peer_cert": "true",
            "ssl_handshake_timeout": str(SSL_HANDSHAKE_TIMEOUT_MS), **extra}
    return [arg for key, value in keys.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def tls_broker(certs) -> Iterator[BrokerProcess]:
    tmp = Path(tempfile.mkdtemp(prefix="leveret-tls-broker-"))
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log")
    b.tls_port = free_port()  # type: ignore[attr-defined]
    b.extra_args = tls_keys(certs, b.tls_port)
    b.start()
    try:
        yield b
    finally:
        b.stop()
        assert "Traceback" not in b.log_text()


def client_context(certs: SimpleNamespace, *, ca=None, with_cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    (ca or certs.ca_obj).configure_trust(ctx)
    if with_cert:
        certs.client.configure_cert(ctx)
    return ctx


def pika_params(b: BrokerProcess, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", b.tls_port, credentials=pika.PlainCredentials("guest", "guest"),
                                     ssl_options=pika.SSLOptions(ctx, server_hostname="127.0.0.1"),
                                     connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5)


def round_trip_over_tls(b: BrokerProcess, ctx: ssl.SSLContext, body: bytes) -> None:
    conn = pika.BlockingConnection(pika_params(b, ctx))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
        method, _props, got = ch.basic_get(q, auto_ack=True)
        assert method is not None and got == body
    finally:
        conn.close()


def handshake(b: BrokerProcess, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS handshake with the broker's TLS port, and a read: with TLS 1.3 the server checks the client's
    certificate after the client has finished, so a refusal may only show on the first read."""
    raw = socket.create_connection(("127.0.0.1", b.tls_port), timeout=5)
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    s.sendall(b"AMQP\x00\x00\x09\x01")
    data = s.recv(7)  # the frame header of connection.start
    if not data:
        raise ConnectionResetError("closed by the broker")
    return s


def test_pika_over_amqps_with_a_client_certificate(tls_broker, certs):
    round_trip_over_tls(tls_broker, client_context(certs), b"over TLS")
    s = handshake(tls_broker, client_context(certs))
    try:
        assert s.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        s.close()
    # The listener is RabbitMQ's amqp/ssl in the HTTP API's overview, and the plain one still serves.
    req = urllib.request.Request(f"http://127.0.0.1:{tls_broker.management_port}/api/overview",
                                 headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        listeners = json.load(resp)["listeners"]
    assert {"protocol": "amqp/ssl", "port": tls_broker.tls_port} in [
        {"protocol": li["protocol"], "port": li["port"]} for li in listeners]
    conn = pika.BlockingConnection(tls_broker.pika_params(connection_attempts=1, socket_timeout=5))
    conn.close()


def test_the_http_api_shows_a_connection_over_tls_and_its_client_certificate(tls_broker, certs):
    conn = pika.BlockingConnection(pika_params(tls_broker, client_context(certs)))
    try:
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        deadline = time.monotonic() + 10
        tls_conns: list = []
        while not tls_conns and time.monotonic() < deadline:
            req = urllib.request.Request(f"http://127.0.0.1:{tls_broker.management_port}/api/connections",
                                         headers=auth)
            with urllib.request.urlopen(req, timeout=10) as resp:
                tls_conns = [c for c in json.load(resp) if c["port"] == tls_broker.tls_port]
            time.sleep(0.1)
        [info] = tls_conns
        assert info["ssl"] is True and info["ssl_protocol"] in ("tlsv1.2", "tlsv1.3") and info["ssl_cipher"]
        assert info["peer_cert_subject"] and info["peer_cert_issuer"]
    finally:
        conn.close()


async def test_aio_pika_over_amqps(tls_broker, certs):
    import aio_pika

    conn = await aio_pika.connect(f"amqps://guest:guest@127.0.0.1:{tls_broker.tls_port}/",
                                  ssl_context=client_context(certs), timeout=10)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue("", exclusive=True)
        await ch.default_exchange.publish(aio_pika.Message(b"aio over TLS"), routing_key=q.name)
        msg = await q.get(timeout=5)
        assert msg is not None and msg.body == b"aio over TLS"
        await msg.ack()
    finally:
        await conn.close()


def test_a_client_that_does_not_trust_the_servers_ca_is_refused(tls_broker, certs):
    ctx = client_context(certs, ca=certs.other_ca)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        handshake(tls_broker, ctx)
    with pytest.raises(PIKA_REFUSED):
        pika.BlockingConnection(pika_params(tls_broker, ctx))
    round_trip_over_tls(tls_broker, client_context(certs), b"still serving")


def test_a_client_without_a_certificate_is_refused(tls_broker, certs):
    ctx = client_context(certs, with_cert=False)
    # The server's alert (certificate required) ends the handshake (TLS 1.2) or the first read (TLS 1.3).
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        handshake(tls_broker, ctx)
    with pytest.raises(PIKA_REFUSED):
        pika.BlockingConnection(pika_params(tls_broker, ctx))
    # A certificate from another CA is no better than none.
    stranger = certs.other_ca.issue_cert("stranger.test")
    ctx = client_context(certs, with_cert=False)
    stranger.configure_cert(ctx)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        handshake(tls_broker, ctx)
    round_trip_over_tls(tls_broker, client_context(certs), b"still serving")


def test_tls_1_1_is_refused(tls_broker, certs):
    # The client offers TLS 1.1 at most. The local OpenSSL may refuse that itself (its default security
    # level has no TLS 1.1 cipher): SECLEVEL=0 lets it try, and the handshake fails either way, the server
    # offering TLS 1.2 and 1.3 only ("unsupported protocol" or a protocol version alert).
    ctx = client_context(certs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the versions themselves are deprecated
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with pytest.raises(ssl.SSLError):
        handshake(tls_broker, ctx)
    # TLS 1.2 alone and TLS 1.3 alone are served.
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        ctx = client_context(certs)
        ctx.minimum_version = ctx.maximum_version = version
        s = handshake(tls_broker, ctx)
        assert s.version() == version.name.replace("_", ".")
        s.close()


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Read until the broker closes the socket; how long that took (fails past ``seconds``)."""
    start = time.monotonic()
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the broker did not close the connection within {seconds}s")
    # Nothing of AMQP: at most a TLS alert record (content type 21).
    assert received == b"" or received[0] == 21, received[:16]
    return time.monotonic() - start


def test_a_plaintext_amqp_client_on_the_tls_port_is_closed(tls_broker, certs):
    with socket.create_connection(("127.0.0.1", tls_broker.tls_port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        closed_within(sock, SSL_HANDSHAKE_TIMEOUT_MS / 1000 + 3)
    round_trip_over_tls(tls_broker, client_context(certs), b"after a plaintext client")


def test_a_handshake_that_does_not_finish_is_closed_after_ssl_handshake_timeout(tls_broker, certs):
    timeout = SSL_HANDSHAKE_TIMEOUT_MS / 1000
    connected = time.monotonic()
    silent = socket.create_connection(("127.0.0.1", tls_broker.tls_port), timeout=5)
    # Half a ClientHello: a record header promising 512 bytes, and 5 of them.
    partial = socket.create_connection(("127.0.0.1", tls_broker.tls_port), timeout=5)
    partial.sendall(b"\x16\x03\x01\x02\x00" + b"\x01\x00\x01\xfc\x03")
    closed_at: dict[socket.socket, float] = {}
    # The round trip runs beside the watch, not before it: on a loaded CI machine a TLS round trip can take
    # longer than the timeout, and a close seen only after it would be timed late.
    meanwhile = concurrent.futures.ThreadPoolExecutor(1)
    try:
        served = meanwhile.submit(round_trip_over_tls, tls_broker, client_context(certs), b"while two handshakes hang")
        with selectors.DefaultSelector() as sel:
            for sock in (silent, partial):
                sock.setblocking(False)
                sel.register(sock, selectors.EVENT_READ)
            while len(closed_at) < 2 and time.monotonic() - connected < timeout + 5:
                for key, _ in sel.select(0.1):
                    sock = key.fileobj
                    try:
                        data = sock.recv(4096)  # type: ignore[union-attr]
                    except ConnectionResetError:
                        data = b""
                    if not data:
                        closed_at[sock] = time.monotonic() - connected  # type: ignore[index]
                        sel.unregister(sock)
        served.result(timeout=60)
    finally:
        meanwhile.shutdown(wait=True)
        silent.close()
        partial.close()
    assert set(closed_at) == {silent, partial}, "the broker did not close a stalled handshake"
    for took in closed_at.values():
        assert timeout - 0.3 <= took <= timeout + 5, took  # not at once: when the timeout is up
    round_trip_over_tls(tls_broker, client_context(certs), b"after them")


# -- start-up: the files and keys a TLS listener needs -------------------------------------------------------------

def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "broker", "serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
           "--management-port", str(free_port()), "--prometheus-port", str(free_port()), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
                          env=dict(os.environ, LEVERET_LOG_FORMAT="json"))


@pytest.mark.parametrize("override, fragment", [
    ({"ssl_options.certfile": "/nonexistent/server.pem"},
     "ssl_options.certfile = /nonexistent/server.pem: cannot read it: No such file or directory"),
    ({"ssl_options.cacertfile": "/nonexistent/ca.pem"},
     "ssl_options.cacertfile = /nonexistent/ca.pem: cannot read it: No such file or directory"),
])
def test_a_certificate_file_that_cannot_be_read_stops_start_up(tmp_path, certs, override, fragment):
    out = serve(tmp_path, *tls_keys(certs, free_port(), **override))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr + out.stdout
    [line] = [line for line in out.stderr.splitlines() if line.startswith("leveret:")]
    assert line == f"leveret: cannot start the AMQP-over-TLS listener: {fragment}"
    assert not (tmp_path / "data").exists()  # refused before the data directory is touched


def test_settings_that_cannot_work_are_refused(certs, tmp_path):
    def context(**kw):
        s = Settings(ssl_port=5671, ssl_cacertfile=certs.ca, ssl_certfile=certs.cert, ssl_keyfile=certs.key)
        for k, v in kw.items():
            setattr(s, k, v)
        return server_context(s)

    with pytest.raises(TLSSetupError, match="ssl_options.keyfile is not"):
        context(ssl_keyfile=None)
    with pytest.raises(TLSSetupError, match="verify_peer needs ssl_options.cacertfile"):
        context(ssl_verify="verify_peer", ssl_cacertfile=None)
    with pytest.raises(TLSSetupError, match="fail_if_no_peer_cert = true needs ssl_options.verify = verify_peer"):
        context(ssl_fail_if_no_peer_cert=True)
    with pytest.raises(TLSSetupError, match="not a PEM certificate and its private key"):
        context(ssl_certfile=certs.ca)  # the CA's certificate with the server's key
    (tmp_path / "empty.pem").write_text("")
    with pytest.raises(TLSSetupError, match="ssl_options.cacertfile = .*empty.pem: no PEM certificate"):
        context(ssl_cacertfile=tmp_path / "empty.pem")
    encrypted = tmp_path / "encrypted.key"
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(certs.key.read_bytes(), password=None)
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"s3cret")))
    with pytest.raises(TLSSetupError, match="is encrypted: give its ssl_options.password"):
        context(ssl_keyfile=encrypted)
    context(ssl_keyfile=encrypted, ssl_password="s3cret")


def test_what_the_keys_make_of_the_context(certs):
    keys = {"listeners.ssl.default": "5671", "ssl_options.cacertfile": str(certs.ca),
            "ssl_options.certfile": str(certs.cert), "ssl_options.keyfile": str(certs.key)}
    s = load_settings(None, overrides=list(keys.items()), environ={})
    ctx, warnings = server_context(s)
    assert (s.ssl_bind, s.ssl_port, s.ssl_handshake_timeout) == (None, 5671, 5.0)
    assert ctx.verify_mode == ssl.CERT_NONE and warnings == []  # RabbitMQ's default: verify_none
    assert (ctx.minimum_version, ctx.maximum_version) == (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)
    s = load_settings(None, overrides=[*keys.items(), ("ssl_options.verify", "verify_peer")], environ={})
    assert server_context(s)[0].verify_mode == ssl.CERT_OPTIONAL  # a client without a certificate gets in
    s = load_settings(None, overrides=[*keys.items(), ("ssl_options.verify", "verify_peer"),
                                       ("ssl_options.fail_if_no_peer_cert", "true")], environ={})
    assert server_context(s)[0].verify_mode == ssl.CERT_REQUIRED
    s = load_settings(None, overrides=[*keys.items(), ("ssl_options.versions.1", "tlsv1.3")], environ={})
    ctx = server_context(s)[0]
    assert (ctx.minimum_version, ctx.maximum_version) == (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)
    s = load_settings(None, overrides=[*keys.items(), ("ssl_options.ciphers.1", "ECDHE-RSA-AES256-GCM-SHA384"),
                                       ("ssl_options.ciphers.2", "TLS_AES_256_GCM_SHA384")], environ={})
    ctx, [warning] = server_context(s)
    assert "TLS 1.3 suites are not restricted" in warning
    tls12 = [c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-RSA-AES256-GCM-SHA384"]
    with pytest.raises(ConfigError, match="'ssl_options.versions.1 = tlsv1.1' asks for tlsv1.1"):
        load_settings(None, overrides=[("ssl_options.versions.1", "tlsv1.1")], environ={})
    with pytest.raises(ConfigError, match="bad value 'NOT-A-CIPHER' for 'ssl_options.ciphers.1'"):
        load_settings(None, overrides=[("ssl_options.ciphers.1", "NOT-A-CIPHER")], environ={})
    s = load_settings(None, overrides=[("listeners.ssl.default", "5671"), ("listeners.ssl", "none")], environ={})
    assert s.ssl_port is None
    for key in ("listeners.ssl.default", "ssl_options.cacertfile", "ssl_options.verify", "ssl_options.versions.1",
                "ssl_options.ciphers.1", "ssl_options.fail_if_no_peer_cert", "ssl_handshake_timeout"):
        assert rabbitmq_only_feature(key) is None, key  # Leveret's keys now, not "a feature Leveret does not have"
    assert rabbitmq_only_feature("ssl_options.depth") == "a TLS option Leveret does not have"


def test_a_second_tls_listener_in_a_file_is_unsupported(tmp_path):
    p = tmp_path / "rabbitmq.conf"
    p.write_text("listeners.ssl.default = 5671\nlisteners.ssl.other = 10.0.0.5:5671\n")
    with pytest.raises(ConfigError, match=r":2: 'listeners.ssl.other' asks for a second AMQP-over-TLS listener"):
        load_settings(p, environ={})
    p.write_text("listeners.ssl.1 = [::1]:5671\n")
    assert load_settings(p, environ={}).ssl_bind == "::1"


def test_the_connection_tls_fields(certs):
    # What the HTTP API can show of a connection (RabbitMQ's ssl, ssl_protocol, ssl_cipher, peer_cert_*):
    # a real TLS session between two sockets of this process, seen from the server side.
    s = Settings(ssl_cacertfile=certs.ca, ssl_certfile=certs.cert, ssl_keyfile=certs.key, ssl_verify="verify_peer",
                 ssl_fail_if_no_peer_cert=True)
    server_ctx = server_context(s)[0]
    a, b = socket.socketpair()
    server_side = server_ctx.wrap_socket(a, server_side=True, do_handshake_on_connect=False)
    client_side = client_context(certs).wrap_socket(b, server_hostname="127.0.0.1", do_handshake_on_connect=False)
    import threading

    t = threading.Thread(target=client_side.do_handshake)
    t.start()
    server_side.do_handshake()
    t.join(5)
    info = connection_tls_info(SimpleNamespace(get_extra_info=lambda name: server_side if name == "ssl_object"
                                               else None))
    assert info["ssl"] is True and info["ssl_protocol"] == "tlsv1.3"
    assert info["ssl_cipher"] in ("TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256")
    assert info["peer_cert_subject"].startswith("CN=leveret-test-client,")
    assert "O=Leveret tests" in info["peer_cert_subject"]
    assert "Leveret test CA" in info["peer_cert_issuer"] and " - " in info["peer_cert_validity"]
    server_side.close()
    client_side.close()
    assert connection_tls_info(SimpleNamespace(get_extra_info=lambda name: None))["ssl"] is False


# -- EXTERNAL: the user named by the client's certificate (rabbitmq_auth_mechanism_ssl) ----------------------
CLIENT_CN = "leveret-test-client"


def _client_dn(certs) -> str:
    """The client certificate's subject in RFC 4514 form (the most specific part first), as the cryptography
    package writes it: trustme adds an OU of its own, so it is read from the certificate."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(certs.client.cert_chain_pems[0].bytes()).subject.rfc4514_string()


def _external_broker(start_broker, certs, user: str, *mechanisms: str, **extra: str) -> BrokerProcess:
    port = free_port()
    mech = {f"auth_mechanisms.{i}": m for i, m in enumerate(mechanisms, 1)}
    b = start_broker(*tls_keys(certs, port, default_user=user, **mech, **extra))
    b.tls_port = port  # type: ignore[attr-defined]
    return b


def _external_params(b: BrokerProcess, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", b.tls_port, credentials=pika.credentials.ExternalCredentials(),
                                     ssl_options=pika.SSLOptions(ctx, server_hostname="127.0.0.1"),
                                     connection_attempts=1, socket_timeout=5)


def _api_connections(b: BrokerProcess, user: str) -> list[dict]:
    auth = base64.b64encode(f"{user}:guest".encode()).decode()  # default_pass stays guest
    req = urllib.request.Request(f"http://127.0.0.1:{b.management_port}/api/connections",
                                 headers={"Authorization": "Basic " + auth})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


@pytest.mark.leveret_only
def test_external_logs_in_as_the_certificates_common_name(start_broker, certs):
    b = _external_broker(start_broker, certs, CLIENT_CN, "PLAIN", "AMQPLAIN", "EXTERNAL",
                         ssl_cert_login_from="common_name")
    conn = pika.BlockingConnection(_external_params(b, client_context(certs)))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue  # the default vhost, the default user's rights
        ch.basic_publish("", q, b"as the certificate")
        assert ch.basic_get(q, auto_ack=True)[2] == b"as the certificate"
        [info] = [c for c in _api_connections(b, CLIENT_CN) if c["port"] == b.tls_port]
        assert (info["user"], info["auth_mechanism"]) == (CLIENT_CN, "EXTERNAL")
    finally:
        conn.close()
    # No certificate to name anyone on the plain port: EXTERNAL is not even offered there.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port, connection_attempts=1,
                                                          credentials=pika.credentials.ExternalCredentials()))


@pytest.mark.leveret_only
def test_external_by_distinguished_name_and_only_external(start_broker, certs):
    dn = _client_dn(certs)
    assert dn.startswith(f"CN={CLIENT_CN},") and dn.endswith(",O=Leveret tests")
    b = _external_broker(start_broker, certs, dn, "EXTERNAL")
    conn = pika.BlockingConnection(_external_params(b, client_context(certs)))
    conn.close()
    # PLAIN is not among the mechanisms offered (pika gives up before answering): a right password is no use.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika_params(b, client_context(certs)))


@pytest.mark.leveret_only
def test_external_refuses_a_certificate_naming_no_user(start_broker, certs):
    b = _external_broker(start_broker, certs, "someone-else", "PLAIN", "EXTERNAL", ssl_cert_login_from="common_name")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(_external_params(b, client_context(certs)))
    assert f"EXTERNAL login refused: user '{CLIENT_CN}'" in b.log_text()


# -- a shovel whose source is this TLS listener (issue 37: amqps URIs with RabbitMQ's TLS options) -------------

def _shovel_over_amqps(start_broker, tls_broker, certs, uid: str, ca: Path) -> tuple[BrokerProcess, str, str]:
    """A second Leveret runs a shovel from a queue of the TLS broker (amqps, a client certificate, the CA given
    by ``cacertfile``, the host name checked through ``server_name_indication``) into a local queue."""
    from tests.integration.shovel.conftest import api

    client_pem, client_key = certs.dir / "client.pem", certs.dir / "client.key"
    certs.client.cert_chain_pems[0].write_to_path(str(client_pem))
    certs.client.private_key_pem.write_to_path(str(client_key))
    query = "&".join(f"{k}={urllib.parse.quote(str(v), safe='/')}" for k, v in {
        "cacertfile": ca, "certfile": client_pem, "keyfile": client_key, "verify": "verify_peer",
        "server_name_indication": "localhost"}.items())
    down = start_broker()
    name = f"{uid}-amqps"
    status, body = api(down, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": f"amqps://guest:guest@127.0.0.1:{tls_broker.tls_port}/%2F?{query}", "src-queue": f"{uid}-src",
        "dest-uri": "amqp://", "dest-queue": f"{uid}-dst"}})
    assert status in (201, 204), body
    return down, name, query


def _shovel_state(down: BrokerProcess, name: str) -> dict | None:
    from tests.integration.shovel.conftest import api

    return next((s for s in api(down, "GET", "/api/shovels")[1] if s["name"] == name), None)


def test_a_shovel_moves_from_an_amqps_source_with_a_client_certificate(tls_broker, certs, start_broker, uid):
    conn = pika.BlockingConnection(pika_params(tls_broker, client_context(certs)))
    try:
        ch = conn.channel()
        ch.queue_declare(f"{uid}-src", durable=True)
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("", f"{uid}-src", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()
    down, name, _query = _shovel_over_amqps(start_broker, tls_broker, certs, uid, certs.ca)
    local = pika.ConnectionParameters("127.0.0.1", down.port, credentials=pika.PlainCredentials("guest", "guest"))
    deadline = time.monotonic() + 30
    while True:
        with pika.BlockingConnection(local) as c:
            try:
                moved = c.channel().queue_declare(f"{uid}-dst", passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:
                moved = 0
        if moved == 200:
            break
        assert time.monotonic() < deadline, f"{moved} of 200 moved over amqps: {_shovel_state(down, name)}"
        time.sleep(0.2)
    state = _shovel_state(down, name)
    assert state is not None and state["state"] == "running", state
    assert state["src_uri"].startswith("amqps://127.0.0.1:") and "guest" not in state["src_uri"]  # no credentials


def test_a_shovel_to_an_amqps_source_signed_by_another_ca_is_terminated_with_the_reason(
        tls_broker, certs, start_broker, uid):
    other = certs.dir / "other-ca.pem"
    certs.other_ca.cert_pem.write_to_path(str(other))
    down, name, _query = _shovel_over_amqps(start_broker, tls_broker, certs, uid, other)
    deadline = time.monotonic() + 20
    while (state := _shovel_state(down, name)) is None or state["state"] != "terminated":
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert "certificate" in state["reason"].lower(), state  # the verification failure, said so
