"""Issue 32, defect 7: every install printed setuptools' licence deprecation warning three times
(``project.license`` as a TOML table). Both distributions are built as pip builds them (isolated, the
[build-system] requirements of their pyproject.toml): no licence warning, and the wheel's metadata carries the
SPDX expression."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("project", [".", "pipeline"])
def test_the_build_gives_no_licence_warning(tmp_path: Path, project: str) -> None:
    source = tmp_path / "src"
    # A copy without build outputs, so the build starts from what a fresh clone holds.
    shutil.copytree(ROOT / project, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", "*.so", "tests", "leveret-data"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path / "out"),
                           str(source)], capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    warnings = [line for line in output.splitlines() if "license" in line.lower() and "warn" in line.lower()]
    assert warnings == [], "\n".join(warnings)
    (wheel,) = (tmp_path / "out").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in metadata
