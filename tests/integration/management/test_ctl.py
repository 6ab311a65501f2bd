"""``leveret ctl``: rabbitmqctl's verbs against a real broker, through its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pika
import pytest

from tests.conftest import ROOT
from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = pytest.mark.leveret_only


@pytest.fixture(scope="module")
def ctl():
    tmp = Path(tempfile.mkdtemp(prefix="leveret-ctl-"))
    b, mport, _ = start_mgmt_broker(tmp)

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{mport}", *args],
                             capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
        if ok:
            assert out.returncode == 0, out.stderr
        return out

    try:
        yield b, Http(mport), run, tmp
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_list_queues_with_columns_table_and_json(ctl):
    b, _api, run, _ = ctl
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare("ctl.q")
    for _ in range(2):
        ch.basic_publish("", "ctl.q", b"x")
    ch.basic_get("ctl.q")
    time.sleep(0.1)
    out = run("list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers").stdout
    lines = out.splitlines()
    assert lines[0] == "Listing queues for vhost / ..."
    assert lines[1].split() == ["name", "messages_ready", "messages_unacknowledged", "consumers"]
    row = next(line for line in lines[2:] if line.startswith("ctl.q "))
    assert row.split() == ["ctl.q", "1", "1", "0"]
    assert lines[1].index("messages_ready") == row.index("1")  # aligned columns
    data = json.loads(run("--formatter", "json", "list_queues", "name", "messages").stdout)
    assert {"name": "ctl.q", "messages": 2} in data
    quiet = run("-q", "list_queues", "name").stdout.split()
    assert "ctl.q" in quiet and "Listing" not in quiet
    conns = json.loads(run("--formatter", "json", "list_connections", "user", "vhost", "state").stdout)
    assert {"user": "guest", "vhost": "/", "state": "running"} in conns
    chans = json.loads(run("--formatter", "json", "list_channels", "pid", "messages_unacknowledged").stdout)
    assert any(c["messages_unacknowledged"] == 1 for c in chans)
    ch.basic_consume("ctl.q", lambda *a: None, consumer_tag="ctl-tag")
    time.sleep(0.1)
    consumers = json.loads(run("--formatter", "json", "list_consumers").stdout)
    assert any(c["consumer_tag"] == "ctl-tag" and c["queue_name"] == "ctl.q" for c in consumers)
    name = conns and json.loads(run("--formatter", "json", "list_connections", "pid").stdout)[0]["pid"]
    run("close_connection", name, "go away")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.process_data_events(time_limit=2)
        conn.process_data_events(time_limit=2)
    assert info.value.reply_code == 320 and "go away" in info.value.reply_text


def test_exchanges_and_bindings(ctl):
    _b, api, run, _ = ctl
    api("PUT", "/api/exchanges/%2F/ctl.x", {"type": "topic"})
    api("PUT", "/api/queues/%2F/ctl.bq", {})
    api("POST", "/api/bindings/%2F/e/ctl.x/q/ctl.bq", {"routing_key": "a.*"})
    xs = json.loads(run("--formatter", "json", "list_exchanges", "name", "type").stdout)
    assert {"name": "ctl.x", "type": "topic"} in xs
    bs = json.loads(run("--formatter", "json", "list_bindings").stdout)
    assert {"source_name": "ctl.x", "source_kind": "exchange", "destination_name": "ctl.bq",
            "destination_kind": "queue", "routing_key": "a.*", "arguments": {}} in bs


def test_users_vhosts_permissions_policies(ctl):
    _b, api, run, _ = ctl
    run("add_user", "ctl-user", "pw1")
    assert "already exists" in run("add_user", "ctl-user", "pw1", ok=False).stderr
    assert api("GET", "/api/whoami", auth=("ctl-user", "pw1"))[0] == 401  # no tags yet
    run("set_user_tags", "ctl-user", "monitoring", "policymaker")
    assert api("GET", "/api/whoami", auth=("ctl-user", "pw1"))[1]["tags"] == ["monitoring", "policymaker"]
    run("change_password", "ctl-user", "pw2")
    assert api("GET", "/api/whoami", auth=("ctl-user", "pw2"))[0] == 200
    assert api("GET", "/api/whoami", auth=("ctl-user", "pw1"))[0] == 401
    run("add_vhost", "ctl-vh")
    run("-p", "ctl-vh", "set_permissions", "ctl-user", "^a", "^b", "^c")
    assert api("GET", "/api/permissions/ctl-vh/ctl-user")[1]["write"] == "^b"
    run("-p", "ctl-vh", "set_policy", "--priority", "3", "--apply-to", "queues", "lim", "^q", '{"max-length":5}')
    assert api("GET", "/api/policies/ctl-vh/lim")[1]["priority"] == 3
    assert json.loads(run("-p", "ctl-vh", "--formatter", "json", "list_policies", "name").stdout) == [{"name": "lim"}]
    run("-p", "ctl-vh", "clear_policy", "lim")
    assert api("GET", "/api/policies/ctl-vh/lim")[0] == 404
    users = json.loads(run("--formatter", "json", "list_users").stdout)
    assert {"user": "ctl-user", "tags": ["monitoring", "policymaker"]} in users
    run("delete_vhost", "ctl-vh")
    assert api("GET", "/api/vhosts/ctl-vh")[0] == 404
    run("delete_user", "ctl-user")
    assert run("delete_user", "ctl-user", ok=False).returncode == 1


def test_purge_and_delete_queue(ctl):
    _b, api, run, _ = ctl
    api("PUT", "/api/queues/%2F/ctl.pq", {})
    api("POST", "/api/exchanges/%2F/amq.default/publish",
        {"routing_key": "ctl.pq", "payload": "x", "payload_encoding": "string", "properties": {}})
    assert run("delete_queue", "--if-empty", "ctl.pq", ok=False).returncode == 1
    run("purge_queue", "ctl.pq")
    assert api("GET", "/api/queues/%2F/ctl.pq")[1]["messages"] == 0
    run("delete_queue", "ctl.pq")
    assert api("GET", "/api/queues/%2F/ctl.pq")[0] == 404


def test_export_import_definitions_and_status(ctl):
    _b, api, run, tmp = ctl
    api("PUT", "/api/queues/%2F/ctl.defs", {"durable": True})
    path = tmp / "defs.json"
    run("export_definitions", str(path))
    data = json.loads(path.read_text())
    assert any(q["name"] == "ctl.defs" for q in data["queues"])
    data["queues"].append({"name": "ctl.imported", "vhost": "/", "durable": True, "auto_delete": False,
                           "arguments": {}})
    path.write_text(json.dumps(data))
    run("import_definitions", str(path))
    assert api("GET", "/api/queues/%2F/ctl.imported")[0] == 200
    status = json.loads(run("--formatter", "json", "status").stdout)
    assert status["product_name"] == "Leveret" and status["alarms"] == []
    assert "Status of node" in run("status").stdout


def test_unreachable_broker_and_usage_errors(ctl):
    _b, _api, run, _ = ctl
    out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", "http://127.0.0.1:1", "status"],
                         capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    assert out.returncode == 69 and "cannot reach" in out.stderr
    assert run("add_user", "only-one-arg", ok=False).returncode == 64  # rabbitmqctl's EX_USAGE (issue 32)
