"""The layering rules, checked on every import (module level, TYPE_CHECKING and inside functions) by
tests/import_graph.py: protocol/ and storage/ never import broker/ nor each other; no module of the three
packages is part of an import cycle; the bottom of the metrics stack (counters, OS probes) and the alarms
import nothing above them; the node does not know the reader nor the server; and import-linter keeps every
contract of pyproject.toml, the broker's layers included (``make lint`` runs it too)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import import_graph

ROOT = Path(__file__).resolve().parent.parent.parent


def _arrows_from(module: str) -> set[str]:
    return {b for a, b, _kind in import_graph.edges() if a == module}


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


def test_counters_and_os_probes_sit_at_the_bottom():
    # The hot path counts into broker.observability.counters and everything reads broker.resources.os_probes: neither may reach up.
    assert {"broker.observability.counters", "broker.resources.os_probes"} <= set(import_graph.modules())
    assert _arrows_from("broker.observability.counters") <= {"broker.errors", "protocol.constants"}
    assert _arrows_from("broker.resources.os_probes") == set()


def test_alarms_call_connections_through_a_protocol_not_an_import():
    # alarms -> reader (blocking publishers) and alarms -> memory_budget (malloc_trim) were upward and
    # sideways arrows; the alarms now declare BlockableConnection and use the OS probes.
    assert _arrows_from("broker.resources.alarms") <= {"broker.config", "broker.resources.os_probes", "broker.clock"}


def test_the_http_api_reads_the_os_probes_not_the_exporter():
    # broker.prometheus.metrics is the Prometheus exporter only: the HTTP API sits beside it and must not import it.
    importers = {a for a, b, _kind in import_graph.edges() if b == "broker.prometheus.metrics"}
    assert not {m for m in importers if m.startswith("broker.management")}
    assert "broker.resources.os_probes" in _arrows_from("broker.management.overview")


def _layers_contract() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c.get("id") == "broker-layers"]
    return contract["layers"]


def test_every_broker_module_has_a_layer():
    # A new module of broker/ must be placed in pyproject.toml's layers contract (or it escapes it).
    placed = set()
    for layer in _layers_contract():
        for name in layer.replace(":", "|").split("|"):
            placed.add(name.strip().strip("()"))
    top = {m.split(".")[1] for m in import_graph.modules() if m.startswith("broker.")}
    missing = sorted(f"broker.{m}" for m in top if f"broker.{m}" not in placed)
    assert missing == [], f"add these to a layer of [tool.importlinter] in pyproject.toml: {missing}"


def test_no_import_cycle_anywhere():
    # Counting every arrow, TYPE_CHECKING and function-local imports included (the issue measured a 26-module
    # knot in broker/ this way): calls back up go through Protocols declared in the lower module instead.
    arrows = [(a, b) for a, b, _ in import_graph.edges()]
    assert import_graph.strongly_connected(import_graph.modules(), arrows) == []


def test_the_node_knows_neither_the_reader_nor_the_server():
    # The node is shared state below the reader; starting listeners and storage is broker.server's job.
    assert not _arrows_from("broker.node") & {"broker.amqp.reader", "broker.server", "broker.amqp.channel",
                                               "broker.definitions", "broker.prometheus.metrics"}
    assert not any(b.startswith("broker.management") for b in _arrows_from("broker.node"))
    assert not any(b.startswith("broker.management") for b in _arrows_from("broker.definitions"))


def test_import_linter_keeps_every_contract():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.fail("import-linter is not installed (pip install -e '.[dev]' installs it)")
    result = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert f"{contracts} kept, 0 broken" in result.stdout
