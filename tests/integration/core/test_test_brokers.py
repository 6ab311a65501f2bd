"""The suite's own brokers are what a user's ``python -m broker serve`` would be (tests/broker_forks.py).

They are forked from a process that imported the broker once; these tests hold the fork to Popen's contract:
the broker is the test process's child (so kill -9, wait and the exit status mean what they do with Popen), it
runs in the repository with the environment and arguments the test gave, and ``LEVERET_TEST_FORK=0`` starts it
with Popen. Leveret only: it is about the suite's own processes.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from broker_forks import ROOT, ForkedBroker

pytestmark = pytest.mark.leveret_only


def _overview(b) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{b.management_port}/api/overview")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid in /proc/{pid}/status")


def test_forked_broker_is_our_child_with_our_environment_and_arguments(start_broker, monkeypatch):
    monkeypatch.setenv("LEVERET_NODENAME", "forked@test")
    b = start_broker("--set", "log.console.level=info")
    assert isinstance(b.process, ForkedBroker)
    assert _parent_of(b.pid) == os.getpid()
    assert Path(f"/proc/{b.pid}/cwd").resolve() == ROOT
    assert _overview(b)["node"] == "forked@test"  # the variable set for this start, not the fork server's
    first = b.log_text().splitlines()[0]
    assert json.loads(first)  # LEVERET_LOG_FORMAT=json, which conftest sets for the start only
    assert b.process.poll() is None
    b.process.send_signal(signal.SIGSTOP)
    with pytest.raises(subprocess.TimeoutExpired):
        b.process.wait(0.3)
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL
    assert b.process.returncode == -signal.SIGKILL


def test_forked_broker_exit_code_and_output_of_a_bad_start(start_broker):
    with pytest.raises(RuntimeError) as failed:
        start_broker("--set", "no.such.key=1")
    assert "broker exited with 2" in str(failed.value)
    assert "no.such.key" in str(failed.value)  # its stderr went to its log


def test_popen_when_the_fork_server_is_turned_off(start_broker, monkeypatch):
    monkeypatch.setenv("LEVERET_TEST_FORK", "0")
    b = start_broker()
    assert isinstance(b.process, subprocess.Popen)
    assert _overview(b)["product_name"] == "Leveret"


def test_a_variable_the_test_process_sets_for_good_gets_a_fork_server_of_its_own(start_broker, monkeypatch):
    """What tests/pipeline/conftest.py does with PYSPARK_PYTHON: later brokers still fork, and see it."""
    monkeypatch.setenv("UNRELATED_TOOL_HOME", "/opt/tool")
    for _ in range(2):
        b = start_broker()
        assert isinstance(b.process, ForkedBroker)
        environ = Path(f"/proc/{b.pid}/environ").read_bytes().split(b"\0")
        assert b"UNRELATED_TOOL_HOME=/opt/tool" in environ
        assert _overview(b)["product_name"] == "Leveret"
        b.stop()


@pytest.mark.parametrize("variable", ["LEVERET_NO_EXTENSIONS", "LD_PRELOAD"])
def test_popen_when_a_variable_is_read_before_the_fork(start_broker, monkeypatch, variable):
    """The codec is chosen at import, the preload by the loader: a fork would not see them (libfaketime's tests)."""
    monkeypatch.setenv(variable, "1" if variable.startswith("LEVERET") else "")
    b = start_broker()
    assert isinstance(b.process, subprocess.Popen)
