"""The compiled solvers exact W1 and FedWaD's plans call into: scipy's assignment, LAPJV
(lapx), POT's network simplex. Imported together by a party that solves (its strategy half's
`modules()`), when it starts: their imports take seconds on a busy node, where no round should
wait on them; the ranks and runs that never solve an assignment never load them."""

from __future__ import annotations

from lap import lapjv
from scipy.optimize import linear_sum_assignment

from .pot import ot

__all__ = ["lapjv", "linear_sum_assignment", "ot"]
