"""Issue 32, defects 3 and 7: ``leveret ctl`` talked to whatever listened on 15672, not to the broker the same
environment configured (a user whose broker ran on another port listed another broker's queues without
noticing), ``ctl -p <missing vhost>`` printed a raw 404 and exited 1. ctl (and ``leveret diagnostics``) now
read the settings ``leveret serve`` reads; these tests run them as subprocesses with only the broker's own
environment or configuration file, as a user does in the shell that started the broker."""

from __future__ import annotations

import os
import subprocess
import sys

import pika
import pytest

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.leveret_only

USER, PASSWORD = "ops", "ops-secret"


def ctl(*args: str, env: dict[str, str], command: str = "ctl") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", command, *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd=ROOT, env=env)


def clean_env(**leveret: str) -> dict[str, str]:
    """This process's environment without any LEVERET_* variable (no LEVERET_CTL_URL to lean on), plus
    ``leveret``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERET_")}
    env.update(leveret)
    return env


@pytest.fixture
def configured(start_broker, monkeypatch):
    """A broker whose HTTP port and default user come from LEVERET_* variables (not 15672, not guest), and
    that environment."""
    mgmt = free_port()
    broker_env = {"LEVERET_MANAGEMENT_TCP_PORT": str(mgmt), "LEVERET_PROMETHEUS_TCP_PORT": str(free_port()),
                  "LEVERET_DEFAULT_USER": USER, "LEVERET_DEFAULT_PASS": PASSWORD}
    for key, value in broker_env.items():
        monkeypatch.setenv(key, value)
    b = start_broker(own_http_ports=False)
    b.user, b.password = USER, PASSWORD
    return b, mgmt, broker_env


def test_ctl_with_only_the_brokers_environment_finds_it(configured, uid):
    b, _mgmt, broker_env = configured
    with pika.BlockingConnection(b.pika_params()) as conn:
        conn.channel().queue_declare(f"{uid}.q")
    env = clean_env(**broker_env, LEVERET_LISTENERS_TCP_DEFAULT=str(b.port))
    out = ctl("list_queues", "name", env=env)
    assert out.returncode == 0, out.stderr
    assert f"{uid}.q" in out.stdout.split()
    diag = ctl("ping", env=env, command="diagnostics")
    assert diag.returncode == 0 and "Ping succeeded" in diag.stdout, diag.stderr


def test_ctl_reads_the_brokers_config_file(configured, uid, tmp_path):
    _b, mgmt, _ = configured
    conf = tmp_path / "broker.conf"
    conf.write_text(f"management.tcp.port = {mgmt}\ndefault_user = {USER}\ndefault_pass = {PASSWORD}\n")
    by_flag = ctl("--config", str(conf), "list_vhosts", env=clean_env())
    assert by_flag.returncode == 0 and "/" in by_flag.stdout.split(), by_flag.stderr
    by_env = ctl("list_vhosts", env=clean_env(LEVERET_CONFIG_FILE=str(conf)))
    assert by_env.returncode == 0 and "/" in by_env.stdout.split(), by_env.stderr


def test_an_unreachable_broker_is_named_in_one_line(tmp_path):
    port = free_port()  # nothing listens there
    out = ctl("list_queues", env=clean_env(LEVERET_MANAGEMENT_TCP_PORT=str(port)))
    assert out.returncode == 69, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"http://127.0.0.1:{port}" in lines[0] and "LEVERET_MANAGEMENT_TCP_PORT" in lines[0], lines[0]
    # HTTPS alone (management.ssl.*): the HTTP API is https on management.ssl.port, as the broker serves it.
    tls_port = free_port()
    conf = tmp_path / "tls.conf"
    conf.write_text(f"management.ssl.port = {tls_port}\nmanagement.ssl.certfile = /nonexistent.pem\n")
    out = ctl("--config", str(conf), "list_queues", env=clean_env())
    assert out.returncode == 69 and f"https://127.0.0.1:{tls_port}" in out.stderr, out.stderr


def test_missing_vhost_and_usage_errors_exit_as_rabbitmqctl(configured):
    _b, _mgmt, broker_env = configured
    env = clean_env(**broker_env)
    missing = ctl("-p", "no-such-vhost", "list_queues", env=env)
    assert missing.returncode == 65, missing.stderr
    assert missing.stderr.strip() == "Error: Virtual host 'no-such-vhost' does not exist", missing.stderr
    for args in (["add_user", "only-one-arg"], ["--no-such-option", "list_queues"]):
        usage = ctl(*args, env=env)
        assert usage.returncode == 64 and "Traceback" not in usage.stderr, (args, usage.stderr)


def test_ctl_help_names_no_python_constant():
    out = ctl("--help", env=clean_env())
    assert out.returncode == 0
    assert "DIAGNOSTICS_DOC" not in out.stdout and "leveret diagnostics --help" in out.stdout
