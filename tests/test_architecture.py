"""The layering docs/ARCHITECTURE.md states, checked on the source (by `ast`, so an import
inside a function counts too; an `if TYPE_CHECKING:` block never runs and does not)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from jobs import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "cfl_mpi"


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import the module runs."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.append((target, [alias.name for alias in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_no_import_cycle():
    graph = nx.DiGraph()
    for name in MODULES:
        for target, names in imports(name):
            # `from pkg import mod` imports the module pkg.mod
            targets = [target, *(f"{target}.{n}" for n in names)]
            graph.add_edges_from((name, t) for t in targets if t in MODULES and t != name)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


@pytest.mark.parametrize("layer", ["strategies", "clustering", "ot", "aggregation"])
def test_the_maths_and_the_strategies_know_no_mpi(layer):
    """A strategy addresses silos by index through `ctx.channel`; which rank or transport
    carries a message is the channel's business."""
    banned = ("mpi4py", "cfl_mpi.channel.mpi", "cfl_mpi.channel.layout", "cfl_mpi.runtime.placement")
    for name in (n for n in MODULES if n == f"cfl_mpi.{layer}" or n.startswith(f"cfl_mpi.{layer}.")):
        for target, _ in imports(name):
            assert not target.startswith(banned), f"{name} imports {target}"


def test_no_private_name_is_imported_from_another_module():
    for name in MODULES:
        for target, names in imports(name):
            private = [n for n in names if n.startswith("_") and n != "__future__" and target.startswith("cfl_mpi")]
            assert not private, f"{name} imports {private} from {target}"


def test_the_strategy_registry_is_light():
    """Config parsing and compare read the registry; neither may load a strategy's halves,
    numpy or torch (each rank of a 41-rank job, and every `compare` call, would pay for it)."""
    code = ("import sys, cfl_mpi.strategies, cfl_mpi.compare; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
            "or m.endswith('.halves') or m == 'cfl_mpi.strategies.base'))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=120, check=True).stdout.strip()
    assert "torch" not in loaded and ".halves" not in loaded and "strategies.base" not in loaded, loaded
