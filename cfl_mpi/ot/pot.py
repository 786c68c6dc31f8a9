"""POT (Python Optimal Transport; Flamary et al., JMLR 2021) as this package loads it.

The package hands POT numpy arrays only, so the backends POT would otherwise import for other
array types (PyTorch, JAX, CuPy, TensorFlow) are disabled before it loads: those imports are
most of `import ot` on a machine that has them installed. A variable the environment already
sets is left as it is. Import POT through this module, or name it in a strategy half's
`modules()`, so that it loads before the rounds start, never in one.
"""

from __future__ import annotations

import os
import sys
import types

UNUSED_BACKENDS = (
    "POT_BACKEND_DISABLE_PYTORCH",
    "POT_BACKEND_DISABLE_JAX",
    "POT_BACKEND_DISABLE_CUPY",
    "POT_BACKEND_DISABLE_TENSORFLOW",
)

# POT also imports scikit-learn (k-means starts for its low-rank solver) and networkx (graph
# partitions for its Gromov solvers) where it finds them, each in a try/except ImportError;
# the package calls neither, and the two are a third of `import ot` on every solving rank.
# While POT loads they read as not installed (a None entry in sys.modules fails the import),
# unless this process has already imported them.
UNUSED_OPTIONAL = ("sklearn", "networkx")
# POT's toy data sets (ot.datasets) import scipy.stats, another third of `import ot`, and
# nothing else of POT uses them: while POT loads, an empty module stands in for them.
UNUSED_SUBMODULES = ("ot.datasets",)

for _name in UNUSED_BACKENDS:
    os.environ.setdefault(_name, "1")
_hidden = [name for name in UNUSED_OPTIONAL if name not in sys.modules]
_stood_in = [name for name in UNUSED_SUBMODULES if "ot" not in sys.modules and name not in sys.modules]
for _name in _hidden:
    sys.modules[_name] = None  # type: ignore[assignment]  # the import system's "not installed"
for _name in _stood_in:
    sys.modules[_name] = types.ModuleType(_name, "not loaded: cfl_mpi never calls it (cfl_mpi/ot/pot.py)")
try:
    import ot  # noqa: E402 - after the variables, which POT reads as it loads
finally:
    for _name in (*_hidden, *_stood_in):
        del sys.modules[_name]  # a later `import ot.datasets` loads the real module

__all__ = ["ot"]
