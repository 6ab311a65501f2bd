"""tests/leftovers.py: a test run killed with ``kill -9`` leaves a broker running and a tmpfs mounted; the
next run's start removes both, and never touches what a run that is still alive started; a SIGTERM of a
run cleans up as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.leveret_only

HOLDER = textwrap.dedent('''
    import os, subprocess, time
    from pathlib import Path

    def test_hold(start_broker, tmp_path):
        from leftovers import record_mount
        b = start_broker()
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        record_mount(mnt)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
        try:
            Path(os.environ["HOLD_REPORT"]).write_text(f"{b.pid} {mnt}")
            time.sleep(120)
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
''')


def _pytest(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} was not written")


def _running(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
def test_the_next_run_removes_what_a_killed_run_left_and_spares_a_live_one(tmp_path: Path) -> None:
    holder = ROOT / "tests" / "integration" / "install" / f"leftover_holder_{os.getpid()}.py"  # not test_*.py: never collected by a run of the folder
    holder.write_text(HOLDER)
    runs: list[subprocess.Popen] = []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "LEVERET_TEST_OWNER"))}
        reports = [tmp_path / "killed.txt", tmp_path / "alive.txt"]
        for report in reports:
            runs.append(_pytest(str(holder), "--basetemp", str(tmp_path / report.stem),
                                env=dict(env, HOLD_REPORT=str(report))))
        killed_broker, killed_mount = _wait_for(reports[0]).split()
        alive_broker, alive_mount = _wait_for(reports[1]).split()
        runs[0].send_signal(signal.SIGKILL)
        runs[0].wait(10)
        assert _running(int(killed_broker)) and os.path.ismount(killed_mount), "kill -9 of pytest left nothing?"

        # The next run, of anything: its start cleans up.
        nxt = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                              "tests/unit/test_suite_layout.py"], check=False, cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
        deadline = time.monotonic() + 10
        while _running(int(killed_broker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(int(killed_broker)), nxt.stdout
        assert not os.path.ismount(killed_mount), nxt.stdout
        assert f"killed {killed_broker}" in nxt.stdout and f"unmounted {killed_mount}" in nxt.stdout, nxt.stdout
        # The run that is still alive keeps its broker and its mount...
        assert _running(int(alive_broker)) and os.path.ismount(alive_mount)
        # ... and a SIGTERM of it runs its fixtures' clean-up: broker stopped, tmpfs unmounted.
        runs[1].send_signal(signal.SIGTERM)
        runs[1].wait(60)
        assert not _running(int(alive_broker)) and not os.path.ismount(alive_mount)
    finally:
        for r in runs:
            if r.poll() is None:
                r.send_signal(signal.SIGTERM)  # its fixtures clean up (tests/leftovers.py's handler)
                try:
                    r.wait(30)
                except subprocess.TimeoutExpired:
                    r.kill()
        holder.unlink(missing_ok=True)
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                        "tests/unit/test_suite_layout.py"], check=False, cwd=ROOT, capture_output=True, timeout=120)
