"""Install Leveret as users do, outside the checkout, and use it.

An editable install hid that ``pip install .`` left out ``broker.management`` (``leveret serve`` died with
ModuleNotFoundError) and the shipped configuration. Here:

- the wheel is built from the checkout, installed into a fresh virtual environment, and its ``leveret
  serve`` is started from an unrelated directory: a message round-trips with pika, the HTTP API answers,
  and the shipped configuration file is in the installation;
- the Dockerfile is replayed (no Docker engine runs on CI machines): exactly the paths of its ``COPY``
  lines go into an empty build context, its ``pip install .`` runs in a fresh virtual environment, its
  ``CMD`` is started (ports moved by ``LEVERET_*`` variables) and its ``HEALTHCHECK`` command passes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pika
import pytest
from built_wheels import built_wheel

from tests.conftest import ROOT, free_port

pytestmark = [pytest.mark.leveret_only, pytest.mark.slow, pytest.mark.timeout(600)]


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 400, env: dict | None = None) -> str:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert out.returncode == 0, f"{shlex.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def fresh_venv(path: Path) -> Path:
    """A new virtual environment that sees nothing of the test's own (no site packages, no checkout)."""
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(path)])
    return path / "bin"


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LEVERET_", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return env


def wait_listening(proc: subprocess.Popen, port: int, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the broker exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1))
            c.close()
            return
        except pika.exceptions.AMQPConnectionError:
            time.sleep(0.2)
    raise AssertionError(f"the broker did not listen on {port}:\n{log.read_text()[-4000:]}")


def round_trip(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        q = ch.queue_declare("install-check", durable=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"hello from an installed leveret", pika.BasicProperties(delivery_mode=2))
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert method is not None and body == b"hello from an installed leveret"
    finally:
        conn.close()


def http_get(port: int, path: str) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def stop(proc: subprocess.Popen) -> int:
    proc.terminate()
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def test_the_wheel_installs_into_a_fresh_venv_and_serves(tmp_path, tmp_path_factory):
    # Built from a copy (setuptools leaves build/ and *.egg-info in the tree it builds), once per run.
    wheels = [built_wheel(tmp_path_factory, ".").wheel]
    assert wheels[0].name.startswith("leveret-"), wheels
    # bench/ (the benchmark scenarios) stays in the checkout; `leveret perf` ships as broker/tools/perf.py.
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert not [n for n in names if n.split("/")[0] == "bench"], "bench/ is in the wheel"
    assert "broker/tools/perf.py" in names
    bin_dir = fresh_venv(tmp_path / "venv")
    run([str(bin_dir / "pip"), "install", "-q", str(wheels[0])], env=clean_env())
    perf_help = run([str(bin_dir / "leveret"), "perf", "--help"], cwd=tmp_path, env=clean_env())
    assert "--url" in perf_help

    site = run([str(bin_dir / "python"), "-c",
                "import broker, broker.management, os; print(os.path.dirname(broker.__file__))"],
               cwd=tmp_path, env=clean_env()).strip()
    assert not site.startswith(str(ROOT)), f"imported the checkout, not the installation: {site}"
    shipped = Path(site) / "leveret.conf"
    assert shipped.is_file() and not shipped.is_symlink(), "the shipped configuration is not in the wheel"
    assert "listeners.tcp.default" in shipped.read_text()

    port, mgmt, prom = free_port(), free_port(), free_port()
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "leveret"), "serve", "--config", str(shipped), "--port", str(port),
             "--management-port", str(mgmt), "--prometheus-port", str(prom), "--data-dir", str(tmp_path / "data")],
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=clean_env())
    try:
        wait_listening(proc, port, log)
        round_trip(port)
        status, body = http_get(mgmt, "/api/overview")
        assert status == 200 and json.loads(body)["product_name"] == "Leveret"
    finally:
        assert stop(proc) == 0, log.read_text()[-4000:]
    assert "Traceback" not in log.read_text()


def dockerfile_steps() -> tuple[list[tuple[str, str]], str, list[str], list[str]]:
    """The Dockerfile's COPY (source, destination) pairs, its pip command, CMD and HEALTHCHECK CMD."""
    text = (ROOT / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    copies, pip, cmd, health = [], "", [], []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "COPY":
            *sources, dest = words[1:]
            copies += [(s, dest) for s in sources]
        elif words[0] == "RUN" and "pip install" in line:
            pip = re.search(r"pip install[^&]*", line).group(0).strip()
        elif words[0] == "CMD":
            cmd = json.loads(line[len("CMD"):].strip())
        elif words[0] == "HEALTHCHECK":
            health = json.loads(line[line.index("CMD") + 3:].strip())
    assert copies and pip and cmd and health, "the Dockerfile's steps were not all found"
    return copies, pip, cmd, health


def test_the_dockerfile_steps_build_from_a_clean_context_and_the_healthcheck_passes(tmp_path):
    copies, pip, cmd, health = dockerfile_steps()
    context = tmp_path / "opt-leveret"  # the image's WORKDIR, holding only what COPY brought in
    context.mkdir()
    for source, dest in copies:
        src = ROOT / source
        target = context / dest if not dest.endswith("/") else context / dest / Path(source).name
        if dest in ("./", "."):
            target = context / Path(source).name
        if src.is_dir():
            shutil.copytree(src, target, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, target)
    bin_dir = fresh_venv(tmp_path / "venv")
    run([str(bin_dir / "pip"), *shlex.split(pip)[1:], "-q"], cwd=context, env=clean_env())

    port, mgmt, prom = free_port(), free_port(), free_port()
    env = clean_env()
    env.update(PATH=f"{bin_dir}:{env['PATH']}", LEVERET_LOG_FORMAT="json",
               LEVERET_LISTENERS_TCP_DEFAULT=str(port), LEVERET_MANAGEMENT_TCP_PORT=str(mgmt),
               LEVERET_PROMETHEUS_TCP_PORT=str(prom))
    data = tmp_path / "var-lib-leveret"
    argv = [str(data) if a == "/var/lib/leveret" else a for a in cmd]
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=context, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_listening(proc, port, log)
        round_trip(port)
        env["LEVERET_HEALTHCHECK_URL"] = f"http://127.0.0.1:{mgmt}/api/health/checks/virtual-hosts"
        check = subprocess.run(health, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False)
        assert check.returncode == 0, f"HEALTHCHECK failed: {check.stdout} {check.stderr}"
    finally:
        assert stop(proc) == 0, log.read_text()[-4000:]
    # The image installs a compiler for the build (this machine has one): the compiled codec must be what runs
    # (before setup.py was among the COPY lines, the image always ran the pure-Python one).
    assert '"codec": "compiled"' in log.read_text(), log.read_text()[:2000]
    # And it fails when the broker is gone: the check can fail.
    check = subprocess.run(health, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert check.returncode == 1


def test_make_run_takes_its_ports_and_data_dir_from_make_variables(tmp_path):
    """README: `make run PORT=… MANAGEMENT_PORT=… PROMETHEUS_PORT=… DATA_DIR=…`. It runs with the test's own
    environment (VENV=, its install step marked done with -o) so that it only starts the broker."""
    import signal

    port, mgmt, prom = free_port(), free_port(), free_port()
    data = tmp_path / "data"
    log = tmp_path / "make-run.log"
    env = dict(os.environ, LEVERET_LOG_FORMAT="json")
    with open(log, "wb") as out:
        proc = subprocess.Popen(["make", "run", f"VENV={sys.prefix}", "-o", f"{sys.prefix}/.installed",
                                 f"PORT={port}", f"MANAGEMENT_PORT={mgmt}",
                                 f"PROMETHEUS_PORT={prom}", f"DATA_DIR={data}"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_listening(proc, port, log)
        round_trip(port)
        assert http_get(mgmt, "/api/overview")[0] == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics", timeout=10) as r:
            assert b"rabbitmq_" in r.read()
        assert (data / "metadata.sqlite").exists(), "the data went somewhere else than DATA_DIR"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
