"""Issue 32, defect 1: docker/compose.yaml never turned healthy. Its environment replaces guest
(LEVERET_DEFAULT_USER/PASS, LEVERET_LOOPBACK_USERS=none) but the image's HEALTHCHECK logged in as guest: 401, exit
1, "unhealthy" forever. No Docker engine runs here, so the test meets it as a user does, piece by piece: the
Dockerfile's ENV and compose's environment (both parsed from the files) applied to a real broker process started
with the Dockerfile's CMD, then the image's HEALTHCHECK command (parsed too) run with the same environment."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"


def dockerfile() -> tuple[str, dict[str, str], list[str], list[str]]:
    """The Dockerfile's WORKDIR, ENV, CMD and HEALTHCHECK command (exec form)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    workdir, env, cmd, health = "/", {}, [], []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "WORKDIR":
            workdir = words[1]
        elif words[0] == "ENV":
            env.update(w.split("=", 1) for w in shlex.split(line[len("ENV"):]))
        elif words[0] == "CMD":
            cmd = json.loads(line[len("CMD"):].strip())
        elif words[0] == "HEALTHCHECK":
            health = json.loads(line[line.index("CMD") + 3:].strip())
    assert cmd and health, "the Dockerfile's CMD and HEALTHCHECK were not found"
    return workdir, env, cmd, health


def compose_environment(service: str = "leveret") -> dict[str, str]:
    """services.<service>.environment of docker/compose.yaml (a mapping, as the file writes it)."""
    env: dict[str, str] = {}
    in_service = in_env = False
    for raw in COMPOSE.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip())
        if indent == 2:
            in_service, in_env = raw.strip() == f"{service}:", False
        elif in_service and indent == 4:
            in_env = raw.strip() == "environment:"
        elif in_env and indent == 6:
            key, _, value = raw.strip().partition(":")
            env[key.strip()] = value.strip().strip("'\"")
    assert env, f"no environment for {service} in {COMPOSE}"
    return env


def container(tmp_path: Path, extra: dict[str, str]) -> tuple[dict[str, str], list[str], list[str]]:
    """The environment, CMD and HEALTHCHECK of the container, mapped to this machine: the image's WORKDIR is the
    checkout, its ``leveret`` / ``python`` this interpreter's, the data volume a temporary directory."""
    workdir, image_env, cmd, health = dockerfile()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERET_")}
    for key, value in {**image_env, **compose_environment(), **extra}.items():
        env[key] = value.replace(workdir, str(ROOT), 1) if value.startswith(workdir) else value
    env["PYTHONUNBUFFERED"] = "1"

    def local(argv: list[str]) -> list[str]:
        head = {"leveret": [sys.executable, "-m", "broker"], "python": [sys.executable]}[argv[0]]
        return head + [str(tmp_path / "data") if a == "/var/lib/leveret" else a for a in argv[1:]]

    return env, local(cmd), local(health)


def wait_port(proc: subprocess.Popen, port: int, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}: {log.read_text()[-3000:]}")


def run_health(health: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(health, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.leveret_only
@pytest.mark.parametrize("ports_from", ["environment", "config file"])
def test_the_compose_container_turns_healthy_as_configured(tmp_path, ports_from):
    """compose's user and a broker on ports other than the defaults (the machine is shared; a user moves them
    with LEVERET_* variables or a mounted config file): the health check finds the broker and logs in as the
    configured user, with no variable of its own; with a wrong password it fails."""
    amqp, mgmt, prom = free_port(), free_port(), free_port()
    if ports_from == "environment":
        extra = {"LEVERET_LISTENERS_TCP_DEFAULT": str(amqp), "LEVERET_MANAGEMENT_TCP_PORT": str(mgmt),
                 "LEVERET_PROMETHEUS_TCP_PORT": str(prom)}
    else:
        conf = tmp_path / "leveret.conf"
        conf.write_text(f"listeners.tcp.default = {amqp}\nmanagement.tcp.port = {mgmt}\n"
                        f"prometheus.tcp.port = {prom}\n")
        extra = {"LEVERET_CONFIG_FILE": str(conf)}
    env, cmd, health = container(tmp_path, extra)
    assert "LEVERET_HEALTHCHECK_USER" not in env and env["LEVERET_DEFAULT_USER"] != "guest"
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_port(proc, mgmt, log)
        healthy = run_health(health, env)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert "Traceback" not in healthy.stdout + healthy.stderr
        wrong = run_health(health, {**env, "LEVERET_DEFAULT_PASS": "not-the-password"})
        assert wrong.returncode == 1, wrong.stdout + wrong.stderr
        assert "401" in wrong.stdout and "Traceback" not in wrong.stdout + wrong.stderr
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, log.read_text()[-3000:]
    gone = run_health(health, env)
    assert gone.returncode == 1 and str(mgmt) in gone.stdout, gone.stdout


@pytest.mark.leveret_only
def test_the_health_check_uses_the_amqp_port_when_the_http_api_is_off(tmp_path):
    amqp = free_port()
    env, cmd, health = container(tmp_path, {"LEVERET_LISTENERS_TCP_DEFAULT": str(amqp),
                                            "LEVERET_MANAGEMENT_TCP_PORT": "0",
                                            "LEVERET_PROMETHEUS_TCP_PORT": "0"})
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_port(proc, amqp, log)
        healthy = run_health(health, env)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert run_health(health, env).returncode == 1
