"""An idle queue's footprint (issue 38: 100,000 durable queues in ≤ 8 KB each). CPython 3.11 shares one key
table among the instance dictionaries of a class up to 30 keys; one more and every instance carries a table of
its own (1.6 KB instead of 0.3 KB, measured in the first test). So the queue's two big objects, its queue
process and its variable queue, keep fewer than 30 instance attributes while idle, and an idle variable queue
holds one deque of its own (q4), not five (760 bytes each)."""

from __future__ import annotations

import sys
import tempfile
import tracemalloc
from collections import deque

import pytest

from broker.config import load_settings
from broker.node import Node
from storage import variable_queue
from storage.node_storage import NodeStorage

SHARED_KEYS_MAX = 30  # CPython 3.11's SHARED_KEYS_MAX_SIZE (Objects/dictobject.c)


def _per_instance_bytes(attributes: int) -> float:
    def init(self: object) -> None:
        for i in range(attributes):
            setattr(self, f"a{i}", None)

    cls = type(f"With{attributes}", (), {"__init__": init})  # a class of its own: its own shared key table
    cls()  # the first instance builds the shared key table
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    kept = [cls() for _ in range(2_000)]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert len(kept) == 2_000
    return sum(s.size_diff for s in after.compare_to(before, "filename")) / 2_000


def test_the_cliff_this_guards_against_is_real():
    """If a later CPython moves the cliff, this test says so (and SHARED_KEYS_MAX should follow)."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the 30-key limit measured is CPython 3.11's")
    assert _per_instance_bytes(SHARED_KEYS_MAX - 1) * 3 < _per_instance_bytes(SHARED_KEYS_MAX)


def test_an_idle_variable_queue_is_small(tmp_path):
    ns = NodeStorage(str(tmp_path))
    try:
        vq = ns.open_queue("/", "q", True)
        ns.finish_recovery()
        vq.set_ram_budget(1 << 20)  # what the registry gives every new queue
        vq.on_available = None  # what the queue process sets
        assert len(vq.__dict__) < SHARED_KEYS_MAX, sorted(vq.__dict__)
        own_deques = [name for name, v in vars(vq).items() if isinstance(v, deque) and v is not variable_queue.NONE_YET]
        assert own_deques == ["q4"]
    finally:
        ns.close()


def test_an_idle_queue_process_is_small():
    node = Node(load_settings(None, [("leveret.data_dir", tempfile.mkdtemp())]))
    q, created = node.vhosts["/"].queues.declare("q", False, True, False, False, {}, None)
    assert created
    assert len(q.__dict__) < SHARED_KEYS_MAX, sorted(q.__dict__)
