"""EMD-CFL's parts, built once from its parameters: the only place the halves learn the modes
from. (The plots' view of W, `w_view` beside the parameters, reads the rule and its cut too:
from the settings or a results folder's config.yaml, without loading the halves.)

A clustering round is a pair plan (plans.py: which pairs, stage by stage), a pair distance
(distances.py: what an entry of W is, with τ and the noise), a measurement (measurement.py:
how the entries reach the server) and a cluster rule (plans.py); the server and silo halves
call them and never ask which they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import EmdCflConfig
from .direct import Direct
from .distances import Energy, FullProjection, PairDistance, PerPair, TauSpace, Transport, Unprojected, projected_dim
from .fedwad import FedWaD
from .measurement import Measurement
from .plans import AllPairs, ClusterRule, Neighbourhoods, PairPlan, Robust, StagedPairs, Staging

if TYPE_CHECKING:
    import numpy as np

    from ..base import RunFacts

TAU_SPACES: dict[str, TauSpace] = {"none": Unprojected(), "full": FullProjection(), "pair": PerPair()}
FEDWAD_P = {"chordal": 1, "euclidean": 1, "sqeuclidean": 2}  # p = 2: W1 under the squared cost is W2²


@dataclass(frozen=True)
class Parts:
    """What both halves measure with; `staging` None: all pairs (the paper's plan)."""

    dim_r: int
    distance: PairDistance
    measurement: Measurement
    rule: ClusterRule
    staging: Staging | None
    classes: bool  # whether W compares the silos class by class (classes.py)

    def plan(self, run: RunFacts, placed: np.ndarray, unmatched: set[tuple[int, int]]) -> PairPlan:
        """The server's pair plan (`placed`: its array of the clusters staged plans found;
        `unmatched`: its set of the directions with no class in common, never measured again)."""
        if self.staging is None:
            return AllPairs(self.rule, run, unmatched)
        return StagedPairs(self.staging, run, placed)


def parts(emdcfl: EmdCflConfig, run: RunFacts) -> Parts:
    """The parts the settings name, for a run of `run`'s embedding size and seed."""
    dim_r = projected_dim(emdcfl.proj_ratio, run.embedding_dim)
    distance = distance_of(emdcfl)
    measurement: Measurement = Direct(
        distance, dim_r, emdcfl.max_rows, run.num_classes if emdcfl.classes_matched else None, run.seed
    )
    if emdcfl.distance == "fedwad":
        normalised = emdcfl.ground_cost == "chordal"
        p = FEDWAD_P[emdcfl.ground_cost]
        measurement = FedWaD(
            dim_r, emdcfl.max_rows, emdcfl.fedwad_iterations, emdcfl.fedwad_support, p, normalised, run.seed
        )
    match emdcfl.rule:
        case "neighbourhoods":
            rule: ClusterRule = Neighbourhoods(emdcfl.epsilon)
        case "robust":
            rule = Robust(emdcfl.noise_multiple, emdcfl.gap)
    staging = None
    if emdcfl.pairs == "staged":
        staging = Staging(
            emdcfl.pair_sample,
            emdcfl.representatives,
            emdcfl.retest,
            emdcfl.placement == "one_way",
            emdcfl.noise_multiple,
        )
    return Parts(dim_r, distance, measurement, rule, staging, emdcfl.classes_matched)


def distance_of(emdcfl: EmdCflConfig) -> PairDistance:
    """The pair distance the settings name, with its τ space and noise draws (τ per pair where
    classes are matched: the server takes it on each pair's matched rows, through its R)."""
    tau = TAU_SPACES["pair" if emdcfl.classes_matched else emdcfl.tau_projection]
    match emdcfl.distance:
        case "energy":
            return Energy(emdcfl.ground_cost, emdcfl.projection, emdcfl.noise_splits)
        case "sinkhorn":
            return Transport(
                "sinkhorn",
                emdcfl.ground_cost,
                emdcfl.projection,
                emdcfl.noise_splits,
                tau,
                emdcfl.sinkhorn_reg,
            )
        case "exact" | "fedwad":  # FedWaD mode's τ and noise: exact W1 on the silo
            return Transport("exact", emdcfl.ground_cost, emdcfl.projection, emdcfl.noise_splits, tau)
    raise AssertionError(f"no pair distance {emdcfl.distance!r}")  # the config's Literal allows no other
