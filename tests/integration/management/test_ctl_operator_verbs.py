"""The CLI verbs operators type daily (issue 16) against a real broker: ``leveret ctl`` permissions, topic
permissions, limits, parameters, environment, cluster_status, await_startup, rotate_logs, close_all_connections,
runtime limit changes seen at once everywhere, unknown info columns; and ``leveret diagnostics`` health
checks with rabbitmq-diagnostics' exit codes."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import ClassVar

import pika
import pytest

from broker.resources.os_probes import total_memory
from tests.conftest import ROOT
from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = pytest.mark.leveret_only


def _cli(tool: str, url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", tool, "--url", url, *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def node():
    tmp = Path(tempfile.mkdtemp(prefix="leveret-ctl-ops-"))
    b, mport, pport = start_mgmt_broker(tmp)
    url = f"http://127.0.0.1:{mport}"

    def ctl(*args: str, rc: int | None = 0) -> subprocess.CompletedProcess:
        out = _cli("ctl", url, *args)
        assert rc is None or out.returncode == rc, (out.returncode, out.stdout, out.stderr)
        return out

    def diag(*args: str, rc: int | None = 0) -> subprocess.CompletedProcess:
        out = _cli("diagnostics", url, *args)
        assert rc is None or out.returncode == rc, (out.returncode, out.stdout, out.stderr)
        return out

    try:
        yield b, Http(mport), ctl, diag, pport
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _connect(b, user="guest", password="guest", vhost="/"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=b.host, port=b.port, virtual_host=vhost, credentials=pika.PlainCredentials(user, password)))


def test_unknown_info_column_is_a_usage_error_naming_the_allowed_ones(node):
    b, _api, ctl, _diag, _ = node
    err = ctl("list_queues", "name", "no_such_column", rc=64).stderr
    assert "no_such_column" in err and "messages_ready" in err and "consumers" in err
    assert "bogus" in ctl("list_connections", "bogus", rc=64).stderr
    assert "user_provided_name" in ctl("list_connections", "bogus", rc=64).stderr
    # every allowed column of list_queues gives a value on a plain queue, never a silently empty column ...
    conn = _connect(b)
    conn.channel().queue_declare("ops.cols")
    for column in ("name", "messages_ready", "consumers", "memory", "type", "durable"):
        rows = json.loads(ctl("--formatter", "json", "list_queues", "name", column).stdout)
        row = next(r for r in rows if r["name"] == "ops.cols")
        assert row[column] is not None, column
    # ... and a field of an allowed column is read with a dot
    rows = json.loads(ctl("--formatter", "json", "list_connections", "client_properties.product").stdout)
    assert any(r["client_properties.product"] == "Pika Python Client Library" for r in rows)
    conn.close()


def test_permissions_and_topic_permissions_listed_and_enforced(node):
    b, api, ctl, _diag, _ = node
    ctl("add_user", "ops-u", "pw")
    ctl("set_permissions", "ops-u", ".*", ".*", ".*")
    out = ctl("list_user_permissions", "ops-u").stdout.splitlines()
    assert out[0] == 'Listing permissions for user "ops-u" ...'
    assert out[1].split() == ["vhost", "configure", "write", "read"] and out[2].split() == ["/", ".*", ".*", ".*"]
    assert ctl("list_user_permissions", "nobody", rc=67).stderr
    assert {"user": "ops-u", "configure": ".*", "write": ".*", "read": ".*"} in \
        json.loads(ctl("--formatter", "json", "list_permissions").stdout)

    ctl("set_topic_permissions", "ops-u", "amq.topic", "^allowed\\.", ".*")
    assert json.loads(ctl("--formatter", "json", "list_topic_permissions").stdout) == \
        [{"user": "ops-u", "exchange": "amq.topic", "write": "^allowed\\.", "read": ".*"}]
    assert json.loads(ctl("--formatter", "json", "list_user_topic_permissions", "ops-u").stdout) == \
        [{"vhost": "/", "exchange": "amq.topic", "write": "^allowed\\.", "read": ".*"}]
    table = ctl("list_topic_permissions").stdout.splitlines()
    assert table[0] == 'Listing topic permissions for vhost "/" ...' and table[2].split()[:2] == ["ops-u",
                                                                                                  "amq.topic"]
    assert ctl("-p", "no-such-vhost", "list_topic_permissions", rc=65).stderr

    conn = _connect(b, "ops-u", "pw")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "allowed.x", b"ok")  # confirmed: allowed
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("amq.topic", "denied.x", b"no")
    assert info.value.reply_code == 403
    conn.close()
    ctl("clear_topic_permissions", "ops-u")
    assert json.loads(ctl("--formatter", "json", "list_topic_permissions").stdout) == []
    api("DELETE", "/api/users/ops-u")


def test_vhost_and_user_limits_and_parameters(node):
    b, _api, ctl, _diag, _ = node
    ctl("add_vhost", "ops-vh")
    ctl("-p", "ops-vh", "set_permissions", "guest", ".*", ".*", ".*")
    assert ctl("-p", "ops-vh", "list_vhost_limits").stdout.strip() == 'Listing limits for vhost "ops-vh" ...'
    ctl("-p", "ops-vh", "set_vhost_limits", '{"max-connections": 1}')
    out = ctl("-p", "ops-vh", "list_vhost_limits").stdout.splitlines()
    assert out == ['Listing limits for vhost "ops-vh" ...', '{"max-connections":1}']
    assert json.loads(ctl("-p", "ops-vh", "--formatter", "json", "list_vhost_limits").stdout) == \
        {"max-connections": 1}
    assert {"vhost": "ops-vh", "limits": {"max-connections": 1}} in \
        json.loads(ctl("--global", "--formatter", "json", "list_vhost_limits").stdout)
    params = json.loads(ctl("-p", "ops-vh", "--formatter", "json", "list_parameters").stdout)
    assert params == [{"component": "vhost-limits", "name": "limits", "value": {"max-connections": 1}}]
    assert json.loads(ctl("--formatter", "json", "list_parameters").stdout) == []  # vhost / has none
    first = _connect(b, vhost="ops-vh")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        _connect(b, vhost="ops-vh")  # the limit holds
    first.close()

    ctl("add_user", "ops-lim", "pw")
    ctl("set_user_limits", "ops-lim", '{"max-channels": 1}')
    assert ctl("list_user_limits", "ops-lim").stdout.splitlines() == ['Listing limits for user "ops-lim" ...',
                                                                       '{"max-channels":1}']
    assert {"user": "ops-lim", "limits": {"max-channels": 1}} in \
        json.loads(ctl("--formatter", "json", "list_user_limits").stdout)
    ctl("delete_user", "ops-lim")
    ctl("delete_vhost", "ops-vh")


def test_close_all_connections_by_vhost_then_global(node):
    b, _api, ctl, _diag, _ = node
    ctl("add_vhost", "ops-other")
    ctl("-p", "ops-other", "set_permissions", "guest", ".*", ".*", ".*")
    in_root = [_connect(b) for _ in range(2)]
    other = _connect(b, vhost="ops-other")
    time.sleep(0.2)
    out = ctl("close_all_connections", "maintenance window").stdout
    assert "in vhost / on node" in out and "Closed 2 connection(s)" in out
    for conn in in_root:
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            conn.process_data_events(time_limit=2)
            conn.process_data_events(time_limit=2)
        assert info.value.reply_code == 320 and "maintenance window" in info.value.reply_text
    other.process_data_events(time_limit=0.5)
    assert other.is_open  # another vhost's connection stays
    assert "Closed 1 connection(s)" in ctl("--global", "close_all_connections", "everyone out").stdout
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        other.process_data_events(time_limit=2)
        other.process_data_events(time_limit=2)
    ctl("delete_vhost", "ops-other")


def test_await_startup_environment_cluster_status_rotate_logs(node):
    b, _api, ctl, _diag, _ = node
    ctl("await_startup", "-t", "10")
    started = time.monotonic()
    down = _cli("ctl", f"http://127.0.0.1:{_closed_port()}", "await_startup", "--timeout", "1")
    assert down.returncode == 69 and "did not start within 1 seconds" in down.stderr
    assert time.monotonic() - started >= 1.0

    env = json.loads(ctl("--formatter", "json", "environment").stdout)
    assert env["port"] == b.port and env["default_user"] == "guest" and "default_pass" not in env
    assert "vm_memory_high_watermark_relative" in env
    assert f"port: {b.port}" in ctl("environment").stdout.splitlines()

    status = json.loads(ctl("--formatter", "json", "cluster_status").stdout)
    (name,) = status["running_nodes"]
    assert status["disk_nodes"] == [name] and status["partitions"] == {} and status["alarms"] == []
    assert any(lst["port"] == b.port for lst in status["listeners"][name])
    text = ctl("cluster_status").stdout
    assert text.startswith(f"Cluster status of node {name} ...") and "Running Nodes" in text

    # set_cluster_name: the name every report of the node gives from then on (a cluster's: test_cluster_identity).
    assert ctl("set_cluster_name", "ops-cluster").stdout.strip() == "Setting cluster name to ops-cluster ..."
    assert _api("GET", "/api/cluster-name")[1] == {"name": "ops-cluster"}
    assert "Cluster name: ops-cluster" in ctl("cluster_status").stdout.splitlines()
    assert json.loads(ctl("--formatter", "json", "cluster_status").stdout)["cluster_name"] == "ops-cluster"
    assert "usage: leveret ctl set_cluster_name NAME" in ctl("set_cluster_name", rc=64).stderr
    assert ctl("-q", "set_cluster_name", "ops-cluster-2").stdout == ""
    assert _api("GET", "/api/cluster-name")[1] == {"name": "ops-cluster-2"}

    err = ctl("rotate_logs", rc=69).stderr
    assert "no on-demand log rotation" in err and "stderr only" in err


def _metric(pport: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{pport}/metrics", timeout=10).read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_runtime_limit_changes_show_at_once_in_status_nodes_and_prometheus(node):
    _b, api, ctl, _diag, pport = node

    def seen() -> tuple[int, int, int, int, float, float]:
        nodes = api("GET", "/api/nodes")[1][0]
        status = json.loads(ctl("--formatter", "json", "status").stdout)
        assert status["memory_limit"] == nodes["mem_limit"] and status["disk_free_limit"] == nodes["disk_free_limit"]
        return (nodes["mem_limit"], nodes["disk_free_limit"], status["memory_limit"], status["disk_free_limit"],
                _metric(pport, "rabbitmq_resident_memory_limit_bytes"),
                _metric(pport, "rabbitmq_disk_space_available_limit_bytes"))

    try:
        ctl("set_vm_memory_high_watermark", "absolute", "2GB")
        ctl("set_disk_free_limit", "123MB")
        mem, disk, smem, sdisk, pmem, pdisk = seen()
        assert mem == smem == pmem == 2_000_000_000 and disk == sdisk == pdisk == 123_000_000

        ctl("set_vm_memory_high_watermark", "0.3")  # the fraction form
        mem, _d, _sm, _sd, pmem, _pd = seen()
        assert mem == pmem == int(0.3 * total_memory())
        ctl("set_disk_free_limit", "mem_relative", "0.01")
        _m, disk, _sm, _sd, _pm, pdisk = seen()
        assert disk == pdisk == int(0.01 * total_memory())

        assert "fraction" in ctl("set_vm_memory_high_watermark", "1.5", rc=65).stderr
        assert ctl("set_vm_memory_high_watermark", "lots", rc=65).stderr
        assert ctl("set_vm_memory_high_watermark", "relative", "2GB", rc=64).stderr
    finally:
        ctl("set_vm_memory_high_watermark", "0.4")
        ctl("set_disk_free_limit", "50MB")
    assert seen()[0] == int(0.4 * total_memory())


def test_diagnostics_health_checks(node):
    b, _api, ctl, diag, _ = node
    assert "Ping succeeded" in diag("ping").stdout
    assert "fully booted and running" in diag("check_running").stdout
    assert "reported no local alarms" in diag("check_local_alarms").stdout
    assert json.loads(diag("--formatter", "json", "check_local_alarms").stdout) == {"result": "ok"}
    assert "Status of node" in diag("status").stdout
    listeners = json.loads(diag("--formatter", "json", "listeners").stdout)
    assert {"protocol": "amqp", "port": b.port} in [{k: v[k] for k in ("protocol", "port")} for v in listeners]
    out = diag("check_port_connectivity").stdout
    assert "Successfully connected to ports" in out and str(b.port) in out
    assert f"port {b.port} is running" in diag("check_port_listener", str(b.port)).stdout
    assert diag("check_port_listener", str(_closed_port()), rc=69).stderr
    assert diag("check_protocol_listener", "amqp").returncode == 0
    assert "queue_procs:" in diag("memory_breakdown", "--unit", "mb").stdout
    breakdown = json.loads(diag("--formatter", "json", "memory_breakdown").stdout)
    assert breakdown["total"]["rss"] >= breakdown["other"] > 0

    # a memory alarm fails check_local_alarms with 69, and clears with the watermark back
    try:
        ctl("set_vm_memory_high_watermark", "absolute", "1MB")
        assert "reported an alarm: memory" in diag("check_local_alarms", rc=69).stderr
        assert json.loads(diag("--formatter", "json", "check_local_alarms", rc=69).stdout)["local"][0]["resource"] \
            == "memory"
    finally:
        ctl("set_vm_memory_high_watermark", "0.4")
    deadline = time.monotonic() + 10
    while diag("check_local_alarms", rc=None).returncode != 0:
        assert time.monotonic() < deadline, "the memory alarm did not clear"
        time.sleep(0.2)

    # usage errors are 64, an unreachable broker 69
    assert diag("ping", "extra", rc=64).stderr
    assert diag("no_such_check", rc=64).stderr
    gone = _cli("diagnostics", f"http://127.0.0.1:{_closed_port()}", "ping")
    assert gone.returncode == 69 and "Failed to connect" in gone.stderr


class _FakeApi(http.server.BaseHTTPRequestHandler):
    """An HTTP API whose node reports a listener on a port nothing listens on (a listener that went down)."""

    listeners: ClassVar[list[dict]] = []

    def do_GET(self) -> None:
        body = json.dumps({"node": "fake@host", "listeners": self.listeners}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_check_port_connectivity_fails_when_a_listener_is_down(node):
    b, _api, _ctl, _diag, _ = node
    down = _closed_port()
    _FakeApi.listeners = [{"protocol": "amqp", "ip_address": "127.0.0.1", "port": b.port},
                          {"protocol": "http", "ip_address": "127.0.0.1", "port": down}]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = _cli("diagnostics", f"http://127.0.0.1:{server.server_address[1]}", "check_port_connectivity")
        assert out.returncode == 69, out
        assert f"port: {down}" in out.stderr and f"port: {b.port}," not in out.stderr
        out = _cli("diagnostics", f"http://127.0.0.1:{server.server_address[1]}", "--formatter", "json",
                   "check_port_connectivity")
        assert out.returncode == 69 and [f["port"] for f in json.loads(out.stdout)["failures"]] == [down]
    finally:
        server.shutdown()
        server.server_close()
