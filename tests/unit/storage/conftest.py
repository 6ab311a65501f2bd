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


@pytest.fixture(autouse=True)
def shared_empty_parts_stay_empty():
    """A variable queue's parts start as shared empty objects (storage/variable_queue.py NONE_YET,
    NONE_FAILED) and must get their own before anything is written to them: after every storage test they are
    still empty, or one queue's messages would have leaked into every other queue."""
    from storage import variable_queue

    yield
    assert not variable_queue.NONE_YET, "a message was written into the shared empty deque"
    assert not variable_queue.NONE_FAILED, "a confirm was written into the shared empty list"
