"""Issue 32, defect 7: every install printed setuptools' licence deprecation warning three times
(``project.license`` as a TOML table). Both distributions are built as pip builds them (isolated, the
[build-system] requirements of their pyproject.toml; tests/built_wheels.py): no licence warning, and the wheel's metadata carries the
SPDX expression."""

from __future__ import annotations

import zipfile

import pytest
from built_wheels import built_wheel


@pytest.mark.parametrize("project", [".", "pipeline"])
def test_the_build_gives_no_licence_warning(tmp_path_factory: pytest.TempPathFactory, project: str) -> None:
    built = built_wheel(tmp_path_factory, project)
    warnings = [line for line in built.output.splitlines() if "license" in line.lower() and "warn" in line.lower()]
    assert warnings == [], "\n".join(warnings)
    with zipfile.ZipFile(built.wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in metadata
