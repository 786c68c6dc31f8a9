"""CFL: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in halves.py, beside it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ..spec import SEED_LIMIT, ConfigFacts, Pairwise, StrategyConfig, StrategySpec


@dataclass(frozen=True)
class CflConfig(StrategyConfig):
    """CFL (Sattler, Müller, Samek, IEEE TNNLS 2021, Algorithm 5): FedAvg, then recursive
    bipartitions of clusters."""

    name: Literal["cfl"] = "cfl"
    # Split a cluster of more than 2 members when the norm of its mean update is below eps1
    # and the largest member update norm above eps2 (the authors' notebook: 0.4 and 1.6).
    eps1: float = 0.4
    eps2: float = 1.6
    # No split before round warmup_rounds + 1 (the notebook: 20).
    warmup_rounds: int = 20
    # Reject a bipartition unless gamma_max < sqrt((1 - max cross similarity) / 2) (Eq. 36);
    # 0 accepts every bipartition, as the notebook does.
    gamma_max: float = 0.0
    # Silos send P·θ and invert P on what they receive (Eq. 41-42): the server clusters
    # and averages without seeing a model after θ(0). P is built from transform_seed (the
    # run seed when null), which every holder of the config knows: experiments only.
    transform: bool = False
    transform_seed: int | None = None

    def problems(self, facts: ConfigFacts) -> Iterator[str]:
        if self.eps1 <= 0:
            yield f"strategy.eps1: must be positive, got {self.eps1}"
        if self.eps2 < 0:
            yield f"strategy.eps2: must be non-negative, got {self.eps2}"
        if self.warmup_rounds < 0:
            yield f"strategy.warmup_rounds: must be non-negative, got {self.warmup_rounds}"
        if not 0 <= self.gamma_max < 1:
            yield f"strategy.gamma_max: must lie in [0, 1), got {self.gamma_max}"
        if self.transform and self.warmup_rounds < 1:
            yield (
                "strategy.warmup_rounds: must be at least 1 with strategy.transform (round 1 starts from the "
                "public θ(0), so its updates cannot be measured in the transformed space)"
            )
        if self.transform_seed is not None and not 0 <= self.transform_seed < SEED_LIMIT:
            yield f"strategy.transform_seed: must be an integer in [0, 2**64) or null, got {self.transform_seed}"


SPEC = StrategySpec(
    CflConfig,
    "CFL",
    f"{__name__}.halves",
    pairwise={"S": Pairwise("cosine similarity of the silos' weight updates", similarity=True)},
    reads_updates=True,
)
