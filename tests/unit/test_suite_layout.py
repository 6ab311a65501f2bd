"""The suite's own layout: every folder of tests/ that holds Python files is a package, so pytest imports
each test module under its dotted path (``tests.integration.core.test_basic``) and two test files may share a
basename. A folder without ``__init__.py`` would be imported by basename again (pytest's "rootdir" rule), and
a test file there named like another one anywhere would stop the whole run at collection ("import file
mismatch") — which a run of that one folder does not show. This catches it before the full run does."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_folder_with_python_files_is_a_package():
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f.relative_to(TESTS)) for f in folders if not (f / "__init__.py").exists()) == []


def test_integration_tests_sit_in_a_lane():
    """tests/integration/ holds lanes (core, management, cluster, ...), one folder an area: a test file left at
    its top would run in no lane of ``make test-fast`` and is easy to lose."""
    loose = sorted(p.name for p in (TESTS / "integration").glob("test_*.py"))
    assert loose == []
