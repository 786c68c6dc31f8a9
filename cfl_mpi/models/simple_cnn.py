"""The simple CNN of the paper's MNIST experiments (emd-cfl.txt Appendix D.2, SPEC §7)."""
from __future__ import annotations

import torch
from torch import nn


class SimpleCNN(nn.Module):
    """f = h ∘ g: `embedding` g (two conv blocks, fc → dim(Z)) and `head` h (fc → classes).

    The split is explicit so that EMD-CFL can swap only ω (g's parameters) between silos.
    `pools`: 1 is the authors' network (`src/model.py`: one 2×2 max-pool, after the second
    conv; fc 14·14·128 → 128 on MNIST); 2 pools after each conv, 4× cheaper in the second
    conv and the first fc (docs/FIDELITY.md).
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int,
                 channels: tuple[int, int] = (64, 128), embedding_dim: int = 128, pools: int = 2) -> None:
        super().__init__()
        c1, c2 = channels
        side = image_size // 2 ** pools
        first_pool = [nn.MaxPool2d(2)] if pools == 2 else []
        self.embedding = nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(), *first_pool,
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(c2 * side * side, embedding_dim), nn.ReLU(),
        )
        self.head = nn.Linear(embedding_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(x))
