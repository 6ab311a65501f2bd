"""``leveret ctl``'s shovel verbs as an operator moving from rabbitmqctl types them: set_parameter shovel,
shovel_status, restart_shovel, clear_parameter, against a Leveret of the test's own with a local shovel
(``amqp://`` to ``amqp://``, no RabbitMQ needed). Exit codes and words are rabbitmqctl 3.10.8's, measured on
Debian's node (tests/integration/shovel/rabbit_node.py): a refused parameter, a value that is not JSON, a
restart or a clear of a shovel that is not there all exit 69; shovel_status prints its columns in
rabbitmqctl's (alphabetical) order."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.shovel.conftest import api, wait_for
from tests.integration.shovel.helpers import count, params, publish

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(180)]

EX_UNAVAILABLE = 69
# rabbitmqctl 3.10.8's shovel_status header for a running queue-to-queue shovel (measured).
RABBITMQ_HEADER = ["destination", "destination_protocol", "destination_queue", "last_changed", "name", "source",
                   "source_protocol", "source_queue", "state", "termination_reason", "type", "vhost"]


def ctl(broker, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "ctl", "--url",
                           f"http://127.0.0.1:{broker.management_port}", *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


def ok(broker, *args: str) -> str:
    out = ctl(broker, *args)
    assert out.returncode == 0, (args, out.returncode, out.stdout, out.stderr)
    return out.stdout


def status_rows(broker) -> list[dict]:
    return json.loads(ok(broker, "shovel_status", "--formatter", "json"))


def test_set_status_restart_and_clear_a_local_shovel(start_broker, uid):
    b = start_broker()
    lp = params("127.0.0.1", b.port)
    src, dst = f"{uid}-src", f"{uid}-dst"
    publish(lp, src, 500)
    value = {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://", "dest-queue": dst,
             "src-prefetch-count": 100}
    text = json.dumps(value)
    out = ok(b, "set_parameter", "shovel", "mv", text)
    assert out.strip() == f'Setting runtime parameter "mv" for component "shovel" to "{text}" in vhost "/" ...'
    assert api(b, "GET", "/api/parameters/shovel/%2F/mv")[1]["value"] == value
    wait_for(lambda: count(lp, dst) == 500, 60, "500 messages moved")
    assert count(lp, src) == 0

    rows = wait_for(lambda: (r := status_rows(b)) and r[0]["state"] == "running" and r, 30, "running")
    assert rows == [{"destination": "amqp://", "destination_protocol": "amqp091", "destination_queue": dst,
                     "last_changed": rows[0]["last_changed"], "name": "mv", "source": "amqp://",
                     "source_protocol": "amqp091", "source_queue": src, "state": "running",
                     "termination_reason": "", "type": "dynamic", "vhost": "/"}]
    table = ok(b, "shovel_status").splitlines()
    assert table[0].startswith("Shovel status on node ")
    assert table[1].split() == RABBITMQ_HEADER
    assert table[2].split()[:3] == ["amqp://", "amqp091", dst] and "running" in table[2].split()

    before = api(b, "GET", "/api/shovels")[1][0]
    out = ok(b, "restart_shovel", "mv")
    assert out.strip() == "Restarting dynamic Shovel mv in virtual host /"
    wait_for(lambda: (s := api(b, "GET", "/api/shovels")[1][0])["state"] == "running"
             and s["messages_acked"] == 0 and s["timestamp"] >= before["timestamp"], 30, "restarted")
    publish(lp, src, 50, start=500)
    wait_for(lambda: count(lp, dst) == 550, 60, "the restarted shovel moves what comes")

    out = ok(b, "clear_parameter", "shovel", "mv")
    assert out.strip() == 'Clearing runtime parameter "mv" for component "shovel" on vhost "/" ...'
    assert api(b, "GET", "/api/parameters/shovel/%2F/mv")[0] == 404
    wait_for(lambda: status_rows(b) == [], 10, "the shovel gone from shovel_status")
    publish(lp, src, 10, start=550)
    assert count(lp, src) == 10 and count(lp, dst) == 550

    # What is not there: rabbitmqctl's words and exit 69.
    gone = ctl(b, "restart_shovel", "mv")
    assert gone.returncode == EX_UNAVAILABLE, (gone.stdout, gone.stderr)
    assert "Shovel with the given name was not found on the target node" in gone.stderr
    assert "virtual host '/'" in gone.stderr
    gone = ctl(b, "clear_parameter", "shovel", "mv")
    assert gone.returncode == EX_UNAVAILABLE and gone.stderr.strip() == "Error: Parameter does not exist"


def test_bad_shovel_parameters_exit_69_with_rabbitmqs_reason(start_broker):
    b = start_broker()
    bogus = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "bogus": 1}
    out = ctl(b, "set_parameter", "shovel", "s1", json.dumps(bogus))
    assert out.returncode == EX_UNAVAILABLE, (out.stdout, out.stderr)
    assert out.stderr == "Error: Validation failed\n\nUnrecognised terms [{<<\"bogus\">>,1}] in s1\n"
    out = ctl(b, "set_parameter", "shovel", "s1", json.dumps({"src-uri": "amqp://", "dest-uri": "amqp://"}))
    assert out.returncode == EX_UNAVAILABLE
    assert "Must specify 'src-exchange' or 'src-queue'" in out.stderr
    out = ctl(b, "set_parameter", "shovel", "s1", "not json")
    assert out.returncode == EX_UNAVAILABLE and out.stderr.startswith("Error: JSON decoding error. Reason: ")
    assert api(b, "GET", "/api/parameters/shovel/%2F/s1")[0] == 404
    assert status_rows(b) == []
    assert ok(b, "shovel_status").splitlines()[1:] == [
        "destination  last_changed  name  source  state  termination_reason  type  vhost"]
