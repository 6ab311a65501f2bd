"""The layering rules that hold today, checked on every import (module level, TYPE_CHECKING and inside
functions) by tests/import_graph.py: protocol/ and storage/ never import broker/ nor each other, and
neither has a cycle. (broker/ itself still has one knot; ``python tests/import_graph.py`` shows it.)"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import import_graph


def test_protocol_and_storage_import_neither_broker_nor_each_other():
    wrong = [(a, b, kind) for a, b, kind in import_graph.edges()
             if (a.startswith("protocol") and not b.startswith("protocol"))
             or (a.startswith("storage") and not b.startswith("storage"))]
    assert wrong == []


def test_protocol_and_storage_have_no_import_cycle():
    nodes = [m for m in import_graph.modules() if m.startswith(("protocol", "storage"))]
    arrows = [(a, b) for a, b, _ in import_graph.edges() if a in nodes and b in nodes]
    assert import_graph.strongly_connected(nodes, arrows) == []


def test_the_graph_tool_finds_a_cycle():
    # The tool itself can fail: a known two-module circle is reported.
    assert import_graph.strongly_connected(["a", "b", "c"], [("a", "b"), ("b", "a"), ("b", "c")]) == [["a", "b"]]
