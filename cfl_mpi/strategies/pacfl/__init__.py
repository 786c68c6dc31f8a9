"""PACFL: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in halves.py, beside it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..spec import ConfigFacts, Cut, Pairwise, PairwiseView, StrategyConfig, StrategySpec, setting


@dataclass(frozen=True)
class PacflConfig(StrategyConfig):
    """PACFL (Vahidian et al., AAAI 2023): one-shot clustering on principal angles between
    data subspaces."""

    name: Literal["pacfl"] = "pacfl"
    # Left singular vectors per class (the PACFL paper's appendix: p = 3 for its main tables).
    p: int = 3
    # Per class and stacked, as the authors' code does; false: top p of the whole data matrix.
    per_class: bool = True
    # Proximity A[i][j] in degrees: "sum" of the principal angles (Eq. 3) or the "smallest" (Eq. 2).
    measure: Literal["sum", "smallest"] = "sum"
    # Distance threshold of average-linkage clustering on A, in degrees. It depends on the
    # data (dimension, samples per class) and is tuned per data set, as the EMD-CFL authors
    # did (Appendix D.3). 600 suits the rotated digits (seeds 0-4: within-cluster A <= 536,
    # between >= 694); summary.json lists the merge heights to choose it from elsewhere.
    beta: float = 600.0

    def problems(self, facts: ConfigFacts) -> Iterator[str]:
        if self.p < 1:
            yield f"strategy.p: must be at least 1, got {self.p}"
        if self.beta <= 0:
            yield f"strategy.beta: must be positive (degrees), got {self.beta}"


def a_view(artifacts: Mapping[str, Any], strategy: Any) -> PairwiseView:
    """A in degrees of the run's measure, cut at beta."""
    smallest = setting(strategy, PacflConfig, "measure") == "smallest"
    label = "smallest principal angle (degrees)" if smallest else "sum of principal angles (degrees)"
    beta = float(setting(strategy, PacflConfig, "beta"))
    return PairwiseView(None, Cut(beta, f"cut β = {beta:g}°"), f"{label}, cut at β = {beta:g}°")


SPEC = StrategySpec(
    PacflConfig,
    "PACFL",
    f"{__name__}.halves",
    pairwise={"A": Pairwise("sum of principal angles (degrees)", view=a_view)},
)
