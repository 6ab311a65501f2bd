"""The suite's own layout: pytest imports test modules by basename (no packages under tests/), so two test
files of the same name anywhere under tests/ stop the whole run at collection ("import file mismatch"), which
a run of one directory does not show. This catches it before the full run does."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
