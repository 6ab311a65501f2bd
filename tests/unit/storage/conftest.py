"""Fixtures for the storage tests (the harness itself is in storage_harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from storage_harness import Harness


@pytest.fixture
def harness(tmp_path: Path):
    made: list[Harness] = []

    def make(durable: bool = True, **kw: Any) -> Harness:
        h = Harness(tmp_path / f"node{len(made)}", durable, **kw)
        made.append(h)
        return h

    yield make
