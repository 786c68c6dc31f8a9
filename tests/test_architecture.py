"""The layering docs/architecture/layers.md states, checked on the source (by `ast`, so an import
inside a function counts too, and one under `if TYPE_CHECKING:`: a type a module names is a
module it depends on)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
from jobs import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "cfl_mpi"

# cfl_mpi's layers, from the bottom: a module imports modules of its own layer and of those
# below, never above (docs/architecture/layers.md draws them). An entry covers the module it names
# and the modules under it, `*` standing for any one name; the most specific entry decides
# (`strategies.*` is a strategy's light parameters package, `strategies.*.*` its halves and
# their helpers, which sit on top of the config, the data and the models).
LAYERS = (
    (
        "cfl_mpi",
        "wire",
        "privacy",
        "ot",
        "clustering",
        "aggregation.weighted_sum",
        "console",
        "settings",
        "aggregation",  # the folders' own modules: a docstring, no import
        "backends",
        "reporting",
        "training",
    ),  # formats, maths, keys, words
    ("channel", "backends.mpi", "backends.mpi.frames", "backends.mpi.channel", "backends.mpi.liveness"),  # how
    # messages travel
    (
        "strategies",
        "strategies.spec",
        "strategies.*",  # the registries, the parameters,
        "data",
        "data.*",
        "models.params",
        "aggregation.rules",  # each data set's silos, the model, training,
        "aggregation.masked_sums",
        "training.params",
    ),  # aggregation sections
    ("models", "training.local", "training.batched"),  # the model and local training: their sections
    ("config",),  # YAML into typed settings
    ("reporting.results", "reporting.plots"),
    ("strategies.base", "strategies.*.*"),  # the strategies' halves
    ("runtime", "backends.mpi.placement"),  # rounds, silos, placement, checkpoints
    (
        "main",
        "cli",
        "commands",
        "experiments",
        "backends.simulate",
        "backends.job",
        "backends.sockets",
        "backends.mpi.backend",
        "backends.mpi.srun",
    ),  # entry points: the job, the other commands, experiments of many jobs, the backends
)

# The package's front hall: what a newcomer sees in cfl_mpi/ before opening a folder.
TOP_LEVEL_MODULES = 8


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    """The layer of a cfl_mpi module: that of the most specific entry covering it (the most
    names, then the fewest `*`)."""
    parts = module.split(".")[1:] or ["cfl_mpi"]
    covering = [
        (len(entry.split(".")), -entry.count("*"), i)
        for i, names in enumerate(LAYERS)
        for entry in names
        if len(entry.split(".")) <= len(parts) and all(e in ("*", p) for e, p in zip(entry.split("."), parts))
    ]
    assert covering, f"{module} is in no layer of LAYERS: add it where it belongs"
    return max(covering)[2]


def imports(name: str, source: str | None = None) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in the module's source."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.append((target, [alias.name for alias in node.names]))
    return found


def imported_modules(name: str, source: str | None = None) -> set[str]:
    """The cfl_mpi modules a module imports (`from pkg import mod` imports the module pkg.mod)."""
    return {
        t
        for target, names in imports(name, source)
        for t in (target, *(f"{target}.{n}" for n in names))
        if t in MODULES and t != name
    }


def upward_imports(name: str, source: str | None = None) -> list[str]:
    return sorted(t for t in imported_modules(name, source) if layer(t) > layer(name))


def test_the_front_hall_has_few_modules_and_folders_hold_the_rest():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} modules at cfl_mpi's top level: {top}"
    for folder in (p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), (
            f"{folder.name}/ says what lives there"
        )


def test_the_runtime_s_functions_fit_on_a_screen():
    """The runtime's loops read as steps: no function or method in runtime/ over 60 lines."""
    long = [f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in (PACKAGE / "runtime").glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 60]  # fmt: skip
    assert long == []


def test_every_module_has_a_layer():
    for name in MODULES:
        layer(name)


def test_imports_point_down():
    upward = {name: found for name in MODULES if (found := upward_imports(name))}
    assert not upward, f"imports of a higher layer (LAYERS): {upward}"


def test_an_upward_import_for_type_checking_only_is_found():
    """A type named under `if TYPE_CHECKING:` is a dependency too: planted in the strategy
    base, an import of the runtime is reported."""
    name = "cfl_mpi.strategies.base"
    planted = MODULES[name].read_text() + "\nif TYPE_CHECKING:\n    from ..runtime.server import Server\n"
    assert upward_imports(name) == []
    assert upward_imports(name, planted) == ["cfl_mpi.runtime.server"]


def test_no_import_cycle():
    graph = nx.DiGraph()
    for name in MODULES:
        graph.add_edges_from((name, t) for t in imported_modules(name))
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_every_import_of_the_package_names_a_module_it_has():
    """A relative import inside a function runs only when called: one left behind by a move
    would fail in a run, not at import; found here on the source."""
    missing = [(name, target) for name in MODULES for target, _ in imports(name)
               if target.startswith("cfl_mpi") and target not in MODULES]  # fmt: skip
    assert missing == []


def test_no_cycle_among_the_folders():
    """Drawn by folder (cfl_mpi/<folder>/ and each top-level module one node), the imports
    form no cycle either: a section that config composes lives below every module that reads
    the whole config (the runtime's in config/runtime.py), the commands' shared arguments
    below the backends (cli.py)."""
    graph = nx.DiGraph()
    for name in MODULES:
        graph.add_edges_from((name.split(".")[:2][-1], t.split(".")[:2][-1]) for t in imported_modules(name))
    graph.remove_edges_from(nx.selfloop_edges(graph))
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles between folders: {cycles[:5]}"


@pytest.mark.parametrize("layer", ["strategies", "clustering", "ot", "aggregation"])
def test_the_maths_and_the_strategies_know_no_mpi(layer):
    """A strategy addresses silos by index through `ctx.channel`; which rank or transport
    carries a message is the channel's business."""
    banned = ("mpi4py", "cfl_mpi.backends.mpi", "cfl_mpi.channel.layout", "cfl_mpi.runtime.placement")
    for name in (n for n in MODULES if n == f"cfl_mpi.{layer}" or n.startswith(f"cfl_mpi.{layer}.")):
        for target, _ in imports(name):
            assert not target.startswith(banned), f"{name} imports {target}"


def test_only_the_mpi_backend_imports_mpi4py():
    """MPI is one backend: its code lives in cfl_mpi/backends/mpi/, and nothing else loads mpi4py (the
    entry points reach the backend through it)."""
    outside = [
        name
        for name in MODULES
        if not (name == "cfl_mpi.backends.mpi" or name.startswith("cfl_mpi.backends.mpi."))
        and any(target == "mpi4py" or target.startswith("mpi4py.") for target, _ in imports(name))
    ]
    assert outside == []


def test_the_data_section_is_read_through_what_it_declares():
    """DataConfig declares every key a caller reads of any data set; no caller probes a
    section for a key it may lack (`getattr(cfg.data, "root", None)`)."""
    probe = re.compile(r"getattr\([\w.]*data, *[\"']")
    found = [f"{path.relative_to(PROJECT_ROOT)}:{n}" for path in PACKAGE.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]  # fmt: skip
    assert found == []


def test_no_private_name_is_imported_from_another_module():
    for name in MODULES:
        for target, names in imports(name):
            private = [n for n in names if n.startswith("_") and n != "__future__" and target.startswith("cfl_mpi")]
            assert not private, f"{name} imports {private} from {target}"


def test_the_strategy_registry_is_light():
    """Config parsing and compare read the registry; neither may load a strategy's halves,
    numpy or torch (each rank of a 41-rank job, and every `compare` call, would pay for it)."""
    code = (
        "import sys, cfl_mpi.strategies, cfl_mpi.experiments.compare; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
        "or m.endswith('.halves') or m == 'cfl_mpi.strategies.base'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    assert "torch" not in loaded and ".halves" not in loaded and "strategies.base" not in loaded, loaded


def test_each_default_cut_is_written_once():
    """The cluster rules' default cuts live in clustering/defaults.py; the config and the
    extraction functions read them there, so changing one changes every use."""
    from cfl_mpi.clustering.defaults import EPSILON, NOISE_MULTIPLE
    from cfl_mpi.strategies.emdcfl import EmdCflConfig

    assert (EmdCflConfig.noise_multiple, EmdCflConfig.epsilon) == (NOISE_MULTIPLE, EPSILON)
    written = re.compile(r"(?<![.\w])(noise_multiple|epsilon|NOISE_MULTIPLE|EPSILON)\s*(:\s*float\s*)?=\s*[0-9.]+")
    found = [f"{path.relative_to(PROJECT_ROOT)}:{n}" for path in PACKAGE.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if written.search(line)]  # fmt: skip
    assert found == ["cfl_mpi/clustering/defaults.py:7", "cfl_mpi/clustering/defaults.py:9"]
