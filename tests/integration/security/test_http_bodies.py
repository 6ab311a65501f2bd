"""Issue 31, findings 1 and 4: HTTP request bodies are bounded before they are read, and bad JSON is a clean 400.

Before: four parallel 100 MiB bodies to ``POST /api/login`` (no credentials) were read whole (then answered 400)
and took the broker's RSS up by ~850 MB for good, with the memory alarm raised; a 100,000-deep JSON body answered
500 with a traceback in the log. Here a real broker process is attacked over raw sockets and its RSS is read from
``/proc/PID/status``."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess

from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(180)]

MiB = 1024 * 1024
MAX_BODY = 1 * MiB  # management.http.max_body_size for this broker


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[BrokerProcess, int]]:
    tmp: Path = tmp_path_factory.mktemp("bodies")
    b, mport, _ = start_mgmt_broker(tmp, "--set", f"management.http.max_body_size={MAX_BODY}",
                                    "--set", "vm_memory_high_watermark.absolute=400MB")
    try:
        yield b, mport
    finally:
        b.stop()
        assert "Traceback" not in b.log_text()


@pytest.fixture
def api(node) -> Http:
    return Http(node[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode()


def read_answer(sock: socket.socket, timeout: float = 10.0) -> tuple[int, bytes, bool]:
    """(status, whole answer, whether the server closed the connection after it)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            closed = True
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if sep and len(body) >= length:
            sock.settimeout(2)
            try:
                closed = sock.recv(1) == b""
            except ConnectionResetError:
                closed = True
            except TimeoutError:
                closed = False
            break
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data, closed


def blast(port: int, path: str, size: int, chunked: bool, auth: str | None = None) -> int:
    """Send a ``size``-byte body as fast as the server takes it (declared, or chunked), then read the answer;
    the status (0: the server cut the connection before answering, which is allowed while we were sending)."""
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
    else:
        headers["Content-Length"] = str(size)
    piece = b"x" * MiB
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_head("POST", path, headers))
        try:
            sent = 0
            while sent < size:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            return read_answer(sock)[0]
        except OSError:
            return 0


def test_four_parallel_100_mib_logins_take_no_memory_and_raise_no_alarm(node, api):
    b, port = node
    time.sleep(1.0)  # let start-up settle
    before = rss_kib(b.pid)
    statuses: list[int] = []
    for chunked in (False, True):
        threads = [threading.Thread(target=lambda c=chunked: statuses.append(blast(port, "/api/login", 100 * MiB, c)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    time.sleep(1.0)
    after = rss_kib(b.pid)
    assert set(statuses) <= {413, 0}, statuses
    assert after - before < 50 * 1024, f"RSS {before // 1024} MB -> {after // 1024} MB"
    status, _, _ = api("GET", "/api/overview")
    assert status == 200
    nodes = api("GET", "/api/nodes")[1]
    assert nodes[0]["mem_alarm"] is False
    print(f"RSS before {before // 1024} MB, after 8 x 100 MiB to /api/login: {after // 1024} MB")


def test_a_declared_oversized_login_body_is_413_at_once_and_the_connection_closed(node):
    _, port = node
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head("POST", "/api/login", {"Content-Type": "application/json",
                                                  "Content-Length": str(100 * MiB)}))
        status, data, closed = read_answer(sock)  # nothing of the body sent: the answer comes from the headers
    assert status == 413, data[:300]
    assert b"payload_too_large" in data and closed


def test_a_chunked_oversized_login_body_is_cut_off(node):
    _, port = node
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head("POST", "/api/login", {"Content-Type": "application/json",
                                                  "Transfer-Encoding": "chunked"}))
        piece = b"x" * 4096
        sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) * 3)  # 12 KiB, more than an unauthenticated request may
        status, data, closed = read_answer(sock)
    assert status == 413, data[:300]
    assert closed


def test_a_body_without_credentials_is_never_read(node):
    """Credentials first: 401 from the headers alone, and the connection closed instead of read to the end."""
    _, port = node
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head("POST", "/api/definitions", {"Content-Type": "application/json",
                                                        "Content-Length": str(50 * MiB)}))
        status, data, closed = read_answer(sock)
    assert status == 401, data[:300]
    assert closed


def test_authenticated_bodies_have_the_configured_limit(node, api, uid):
    _, port = node
    big = {"arguments": {"x-pad": "y" * (MAX_BODY + 10)}}
    status, body, _ = api("PUT", f"/api/queues/%2F/{uid}", big)
    assert status == 413 and body["error"] == "payload_too_large"
    assert api("GET", f"/api/queues/%2F/{uid}")[0] == 404
    # a chunked one is cut off at the limit as well
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    assert blast(port, "/api/definitions", 3 * MAX_BODY, chunked=True, auth=auth) in (413, 0)
    # below the limit: accepted, the definitions import included
    queues = [{"name": f"{uid}-{i}", "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}}
              for i in range(2000)]
    doc = {"queues": queues}
    assert len(json.dumps(doc)) < MAX_BODY
    assert api("POST", "/api/definitions", doc)[0] in (201, 204)
    assert api("GET", f"/api/queues/%2F/{uid}-1999")[0] == 200
    assert api("PUT", f"/api/queues/%2F/{uid}", {"durable": False})[0] in (201, 204)


@pytest.mark.parametrize("path,method,auth", [("/api/login", "POST", None),
                                              ("/api/queues/%2F/deep-q", "PUT", ("guest", "guest")),
                                              ("/api/definitions", "POST", ("guest", "guest"))])
def test_deep_or_malformed_json_is_a_400_with_one_line(node, api, path, method, auth):
    b, _ = node
    # /api/login takes 8 KiB without credentials: 4,000 levels fit (the decoder gives up after ~1,000)
    deep = b"[" * 4000 + b"]" * 4000 if auth is None else b"[" * 100_000 + b"]" * 100_000
    for raw in (deep, b'{"username": "a", ', b"\xff\xfe{}"):
        status, body, _ = api(method, path, raw=raw, auth=auth)
        assert status == 400, (path, status, body)
        assert body["error"] == "bad_request" and "\n" not in body["reason"], body
    assert "Traceback" not in b.log_text()


def test_a_100000_deep_login_is_refused_for_its_size(api):
    status, body, _ = api("POST", "/api/login", raw=b"[" * 100_000 + b"]" * 100_000, auth=None)
    assert status == 413 and body["error"] == "payload_too_large"
