"""IFCA: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in halves.py, beside it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ..spec import ConfigFacts, StrategyConfig, StrategySpec


@dataclass(frozen=True)
class IfcaConfig(StrategyConfig):
    """IFCA (Ghosh et al. 2020): K cluster models; every silo joins the one of lowest loss."""

    name: Literal["ifca"] = "ifca"
    # Number of cluster models K; null: the number of true clusters of the partition
    # (the EMD-CFL authors give every baseline the true number, Appendix D.3).
    k: int | None = None
    # "silos": round 1 trains from θ(0), then K of the trained silo models are picked by
    # farthest-first traversal of their losses on the silos' data, and the clusters are
    # formed from those. "random": K models drawn from the seed, as the IFCA authors' code
    # does (random models' losses on the silos barely differ, so the first assignment is noise
    # and IFCA rarely recovers: docs/methods/baselines.md, "IFCA initialisation").
    init: Literal["silos", "random"] = "silos"

    def problems(self, facts: ConfigFacts) -> Iterator[str]:
        if self.k is None and facts.known_clusters is None:
            yield "strategy.k: the data set knows no groups of silos to take the number of clusters from (set k)"
        if self.k is not None and not 1 <= self.k <= facts.silos:
            yield f"strategy.k: must lie between 1 and silos ({facts.silos}), got {self.k}"
        if self.init == "silos" and self.k is not None and self.k > facts.first_round:
            yield (
                f"strategy.init: 'silos' picks k = {self.k} models among the {facts.first_round} silos training "
                "in round 1 (use strategy.init: random, or more participants)"
            )


SPEC = StrategySpec(IfcaConfig, "IFCA", f"{__name__}.halves", own_aggregation=True)
