"""FedWaD clustering: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in halves.py, beside it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..spec import ConfigFacts, Pairwise, PairwiseView, StrategyConfig, StrategySpec, setting


@dataclass(frozen=True)
class FedWaDClusteringConfig(StrategyConfig):
    """FedWaD clustering (FedWaD paper, ICLR 2024, "Boosting FL methods", App. D.7): pairwise
    FedWaD distances between the silos' data, spectral clustering into K clusters, FedAvg inside."""

    name: Literal["fedwad"] = "fedwad"
    # K; null: the number of true clusters of the partition (as IFCA's k).
    clusters: int | None = None
    # "input": the raw model inputs (the paper's MNIST setting); "embedding": g of the common
    # θ(0), a fixed random feature map (the paper's random autoencoder code for CIFAR-10).
    space: Literal["input", "embedding"] = "input"
    # Points per silo (a sample of its training data) and the support S of ξ (null: sample_cap).
    sample_cap: int = 128
    support: int | None = None
    # Wp: 1 (Euclidean cost) or 2 (squared Euclidean, W2), and FedWaD's iterations K.
    p: int = 2
    iterations: int = 20

    @property
    def max_support(self) -> int:
        """S, the support of ξ: `support`, else a whole sample (a silo's ξ never holds more
        atoms than its sample: the bound its partner checks on the wire)."""
        return self.support or self.sample_cap

    def problems(self, facts: ConfigFacts) -> Iterator[str]:
        if self.clusters is None and facts.known_clusters is None:
            yield "strategy.clusters: the data set knows no groups of silos to take the number from (set clusters)"
        if self.clusters is not None and not 1 <= self.clusters <= facts.silos:
            yield f"strategy.clusters: must lie between 1 and silos ({facts.silos}) or be null, got {self.clusters}"
        if self.sample_cap < 2:
            yield f"strategy.sample_cap: must be at least 2, got {self.sample_cap}"
        if self.support is not None and not 1 <= self.support <= self.sample_cap:
            yield (
                f"strategy.support: must lie between 1 and sample_cap ({self.sample_cap}) or be null, "
                f"got {self.support}"
            )
        if self.p not in (1, 2):
            yield f"strategy.p: must be 1 (Euclidean cost) or 2 (squared Euclidean), got {self.p}"
        if self.iterations < 1:
            yield f"strategy.iterations: must be at least 1, got {self.iterations}"
        if not facts.all_from_start:
            yield (
                "strategy.name: fedwad clusters every silo once before round 1, so it needs every silo from the "
                "start (remove participation and late_silos, or use emdcfl or pacfl)"
            )


def d_view(artifacts: Mapping[str, Any], strategy: Any) -> PairwiseView:
    """D named by the run's p and space; no cut (spectral clustering into K)."""
    p = int(setting(strategy, FedWaDClusteringConfig, "p"))
    space = "embeddings" if setting(strategy, FedWaDClusteringConfig, "space") == "embedding" else "inputs"
    return PairwiseView(None, None, f"W{p} distance between the silos' {space}\n(FedWaD estimate)")


SPEC = StrategySpec(
    FedWaDClusteringConfig,
    "FedWaD clustering",
    f"{__name__}.halves",
    default=False,
    pairwise={"D": Pairwise("Wasserstein distance between the silos' data (FedWaD estimate)", view=d_view)},
)
