"""POT (Python Optimal Transport; Flamary et al., JMLR 2021) as this package loads it.

The package hands POT numpy arrays only, so the backends POT would otherwise import for other
array types (PyTorch, JAX, CuPy, TensorFlow) are disabled before it loads: those imports are
most of `import ot` on a machine that has them installed. A variable the environment already
sets is left as it is. Import POT through this module, or name it in a strategy half's
`modules()`, so that it loads before the rounds start, never in one.
"""

from __future__ import annotations

import os

UNUSED_BACKENDS = (
    "POT_BACKEND_DISABLE_PYTORCH",
    "POT_BACKEND_DISABLE_JAX",
    "POT_BACKEND_DISABLE_CUPY",
    "POT_BACKEND_DISABLE_TENSORFLOW",
)

for _name in UNUSED_BACKENDS:
    os.environ.setdefault(_name, "1")

import ot  # noqa: E402 - after the variables, which POT reads as it loads

__all__ = ["ot"]
