"""Imports run one way: no circle between modules, no import back up a layer, no builder on the runtime path.

Every module of edgert/ is parsed with ``ast`` (module-level and function-level imports alike, since a
function-level import is still a dependency), the imports are resolved to modules of the package, and the
graph is checked. The layer table below is the architecture (docs/architecture.md): a module may import
its own package and anything on a lower floor (or the same floor's foundation modules), never a higher one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "edgert"

#: Floors, lowest first. A "unit" is a subpackage of edgert (``vision``, ``config``) or a top-level module (``coco``).
#: A module may import units on its own floor or lower ones; its own unit always.
LAYERS: list[tuple[str, ...]] = [
    # foundation: no edgert imports beyond each other (errors at the very bottom)
    ("errors", "_version", "_lazy", "types", "config", "decoder_kinds", "coco", "atomic_file", "output_lock",
     "http_limits", "_package_data", "stats", "redact", "redact_stderr", "allocator", "onnx_file", "search_rules",
     "image_file", "demo_files", "tasks", "jsonl_uri", "onnx_dequantize"),
    # what machine this is; what build time and run time share about an engine file
    ("platform", "engine"),
    # inference sessions, power meters, ONNX rewriting
    ("backends", "power", "rewrite"),
    # the model-specific parts; the engine builder (build time, beside the runtime parts, never below them)
    ("vision", "io", "speech", "builder"),
    # what runs on detections (tracking, lines, zones); systemd, sd_notify and the metrics exporter, which
    # the pipeline's hooks call
    ("analytics", "service"),
    # the one orchestrator
    ("pipeline",),
    # reports (they observe a pipeline) and calibration (build time: it preprocesses like vision, reports)
    ("report", "calib"),
    # the faces: the command line (also as ``python -m edgert``) and the package's public API
    ("cli", "__init__", "__main__"),
]

#: The runtime path: it must never load the engine builder.
RUNTIME = ("backends", "pipeline", "vision", "io")
BUILDER = "edgert.builder.engine_builder"


def _modules() -> dict[str, tuple[Path, bool]]:
    mods: dict[str, tuple[Path, bool]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_package)
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of this package that importing ``name`` loads last (``edgert.x.y`` -> itself or its package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except what stands under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    nodes: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def _imports(module: str) -> dict[str, int]:
    """The modules of edgert that ``module`` imports, each with the first line that does."""
    path, is_package = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    here = module if is_package else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(name: str | None, line: int) -> None:
        if name is not None and name != module:
            found.setdefault(name, line)

    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "edgert":
                    add(_resolve(alias.name), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if source.split(".")[0] != "edgert":
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                add(full if full in MODULES else _resolve(source), node.lineno)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(unit: str) -> int:
    for floor, units in enumerate(LAYERS):
        if unit in units:
            return floor
    raise AssertionError(f"edgert/{unit} is on no floor of LAYERS in {__file__}: add it where it belongs")


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in GRAPH:
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def _loads(module: str) -> list[str]:
    """What importing ``module`` runs: its imports, and the ``__init__`` of every package above it."""
    parents = []
    name = module.rpartition(".")[0]
    while name:
        parents.append(name)
        name = name.rpartition(".")[0]
    return sorted(set(GRAPH[module]) | set(parents))


def _reaches(start: str, target: str) -> list[str] | None:
    """A path of imports from ``start`` to ``target``, or None."""
    seen = {start}
    queue: list[list[str]] = [[start]]
    while queue:
        path = queue.pop(0)
        if path[-1] == target:
            return path
        for nxt in _loads(path[-1]):
            if nxt not in seen:
                seen.add(nxt)
                queue.append([*path, nxt])
    return None


def test_the_graph_is_read() -> None:
    # the checks below mean nothing if the parser found no edges: a known import must be there
    assert "edgert.errors" in GRAPH["edgert.config.loader"]
    assert "edgert.io.sinks.base" in GRAPH["edgert.io.sinks.jsonl"]
    assert len(MODULES) > 100


def test_no_import_circle() -> None:
    circles = _cycles()
    lines = []
    for members in circles:
        ties = [f"{a} -> {b} (line {GRAPH[a][b]})" for a in members for b in GRAPH[a] if b in members]
        lines.append("; ".join(ties))
    assert not circles, "import circles:\n" + "\n".join(lines)


def test_every_unit_has_a_floor() -> None:
    for module in MODULES:
        _floor(_unit(module))


def test_no_import_runs_back_up() -> None:
    upward = []
    for module, imports in GRAPH.items():
        here = _unit(module)
        for target, line in imports.items():
            there = _unit(target)
            if there != here and _floor(there) > _floor(here):
                upward.append(f"{MODULES[module][0].relative_to(ROOT)}:{line}: {module} imports {target} "
                              f"(floor {_floor(here)} -> {_floor(there)})")
    assert not upward, "imports that run back up a floor:\n" + "\n".join(sorted(upward))


@pytest.mark.parametrize("unit", RUNTIME)
def test_the_runtime_path_never_reaches_the_builder(unit: str) -> None:
    reached = []
    for module in MODULES:
        if _unit(module) == unit:
            path = _reaches(module, BUILDER)
            if path is not None:
                reached.append(" -> ".join(path))
    assert not reached, "runtime modules that load the engine builder:\n" + "\n".join(reached)
