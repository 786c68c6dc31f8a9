"""The `train:` section of the config: the federated rounds and each silo's local training,
light (no torch: the config check runs on every rank before any heavy import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..aggregation.rules import LocalWork


# The federated rounds and each silo's local training (SGD with momentum, training/local.py).
@dataclass(frozen=True)
class TrainConfig:
    # Federated rounds: in each, the participating silos train locally, then each cluster
    # averages their updates into its model.
    rounds: int = 10
    # Epochs of local training per silo and round (E in EMD-CFL's Algorithm 1).
    local_epochs: int = 10
    # Local SGD: its learning rate (lr), momentum and weight_decay (L2 penalty).
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-6
    # Mini-batch size of local training (and of the embeddings with strategy.embed_mode: train);
    # all: full-batch steps, each epoch one gradient step on the silo's whole training set
    # (IFCA's regime: local_epochs are then its τ local steps).
    batch_size: int | Literal["all"] = 64

    def batch(self, n: int) -> int:
        """The mini-batch size for a set of `n` samples."""
        return max(1, n) if self.batch_size == "all" else self.batch_size

    def work(self) -> LocalWork:
        """What a silo's sample count claims of its local training (the screening's yardstick)."""
        return LocalWork(self.local_epochs, None if self.batch_size == "all" else self.batch_size, self.momentum)
