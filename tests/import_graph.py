"""The project's import graph, from the source (``python tests/import_graph.py``).

Every intra-project import of broker/, protocol/ and storage/ is an arrow, of one of three kinds: made at
module level, under ``if TYPE_CHECKING:`` (a dependency even though it never runs), or inside a function
(runs late, often to dodge a cycle). The report lists each package's outgoing arrows and the strongly
connected components (modules that depend on each other in a circle) counting every kind of arrow:
those are the knots the layering has to untie. tests/unit/test_layers.py keeps the rules that hold.

    python tests/import_graph.py            # summary: arrows by kind, cycles
    python tests/import_graph.py --edges    # every arrow, "a -> b (kind)"
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "protocol", "storage")
KINDS = ("module", "type_checking", "local")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return dict(_modules())


# The source does not change while the tests run: parsing every module once per process, not once per call
# (tests/unit/test_layers.py asks for the graph ten times; parsed each time, that was ~40 s of the lane).
@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            out[module_name(path)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, kind: str = "module") -> Iterator[tuple[str, str]]:
    """(imported module, kind) for every import below ``tree``, the kind set by where it sits."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node, "type_checking")
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _imports(node, "local" if kind == "module" else kind)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, kind
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, kind
            for alias in node.names:  # "from broker.queues import delegate" imports the module broker.queues.delegate
                yield f"{node.module}.{alias.name}", kind
        else:
            yield from _imports(node, kind)


def edges() -> list[tuple[str, str, str]]:
    """(importer, imported, kind) between the project's own modules, each once per kind."""
    return list(_edges())


@functools.cache
def _edges() -> tuple[tuple[str, str, str], ...]:
    mods = _modules()
    out = set()
    for name, path in mods.items():
        for target, kind in _imports(ast.parse(path.read_text(), str(path))):
            if target in mods and target != name and not name.startswith(target + "."):
                out.add((name, target, kind))
    return tuple(sorted(out))


def strongly_connected(nodes: list[str], arrows: list[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components with more than one module."""
    graph: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in arrows:
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            recurse = False
            for j in range(i, len(graph[node])):
                nxt = graph[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recurse = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recurse:
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def main(argv: list[str]) -> int:
    all_edges = edges()
    if "--edges" in argv:
        for a, b, kind in all_edges:
            print(f"{a} -> {b} ({kind})")
        return 0
    nodes = sorted(modules())
    print(f"{len(nodes)} modules, {len(all_edges)} arrows: " + ", ".join(
        f"{sum(1 for e in all_edges if e[2] == k)} {k}" for k in KINDS))
    for label, kinds in (("module level", {"module"}), ("module level + local", {"module", "local"}),
                         ("every arrow", set(KINDS))):
        comps = strongly_connected(nodes, [(a, b) for a, b, k in all_edges if k in kinds])
        sizes = ", ".join(str(len(c)) for c in comps) or "none"
        print(f"cycles counting {label}: {sizes}")
        if label == "every arrow":
            for c in comps:
                print("  " + " ".join(c))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
