"""Oracle: the true clusters of the data partition, the upper bound every method aims at."""

from __future__ import annotations

import numpy as np

from ...clustering.labels import relabel_by_first_appearance
from ..base import Halves, RunFacts, ServerRound, Strategy
from . import OracleConfig


class Oracle(Strategy[OracleConfig]):
    """Server half: the one strategy told the true clusters (its spec's `sees_truth`)."""

    def __init__(self, params: OracleConfig, run: RunFacts, truth: np.ndarray) -> None:
        self.truth = truth
        super().__init__(params, run)

    def initial_clusters(self) -> np.ndarray:
        return relabel_by_first_appearance(self.truth)

    def settled(self, ctx: ServerRound) -> bool:
        return True  # the clusters never move


HALVES = Halves(Oracle)
