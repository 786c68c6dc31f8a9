"""The strategies' server and silo halves (each module's `HALVES`) and the clustering maths
they use. Strategies are registered by name in `cfl_mpi.strategies`; the runtime does not
change for a new one."""
from __future__ import annotations

from .base import Halves, SiloProtocol, Strategy

__all__ = ["Halves", "SiloProtocol", "Strategy"]
