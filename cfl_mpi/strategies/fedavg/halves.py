"""FedAvg (McMahan et al. 2017) as the one-cluster baseline: every silo in one cluster."""

from __future__ import annotations

import numpy as np

from ..base import Halves, ServerRound, Strategy


class FedAvg(Strategy):
    """All silos in one cluster."""

    def initial_clusters(self) -> np.ndarray:
        return np.zeros(self.run.silos, dtype=np.int64)

    def settled(self, ctx: ServerRound) -> bool:
        return True  # the clusters never move


HALVES = Halves(FedAvg)
