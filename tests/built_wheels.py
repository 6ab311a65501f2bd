"""Wheels of the checkout's distributions built as pip builds them (isolated, from a copy holding what a fresh
clone holds), once per test run: the licence test reads the build's output, the install test installs the
wheel, and each build compiles the codec (~30 s of CPU). Under xdist the first worker to ask builds, the
others wait on a lock in the run's shared temporary folder and take the same wheel."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What a fresh clone does not hold: build outputs, the environment, caches.
_NOT_IN_A_CLONE = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", "*.so",
                                         "leveret-data", ".pytest_cache", ".hypothesis", ".mypy_cache")


@dataclass(frozen=True)
class BuiltWheel:
    wheel: Path
    output: str  # pip's verbose output of the build (stdout and stderr)


def _shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's temporary folder all xdist workers share (each worker's own is a folder inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_wheel(tmp_path_factory: pytest.TempPathFactory, project: str) -> BuiltWheel:
    """The wheel of ``project`` ("." or "pipeline"), built by ``pip wheel -v --no-deps`` the first time any
    worker of this run asks for it. A failed build is not kept: the next test to ask builds again, and fails
    with the same output."""
    name = "root" if project == "." else project
    folder = _shared_folder(tmp_path_factory) / f"wheel-{name}"
    with open(_shared_folder(tmp_path_factory) / f"wheel-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "output.txt"
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            source = folder / "src"
            shutil.copytree(ROOT / project, source, symlinks=True, ignore=_NOT_IN_A_CLONE)
            build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w",
                                    str(folder / "out"), str(source)],
                                   capture_output=True, text=True, timeout=600, check=False)
            output = build.stdout + build.stderr
            assert build.returncode == 0, output[-4000:]
            done.write_text(output)
        (wheel,) = (folder / "out").glob("*.whl")
        return BuiltWheel(wheel, done.read_text())
