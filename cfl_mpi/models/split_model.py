"""The shape every model has: f = h ∘ g, with an explicit embedding g and head h."""

from __future__ import annotations

import torch
from torch import nn


class SplitModel(nn.Module):
    """f = h ∘ g with explicit `embedding` g and `head` h: EMD-CFL swaps only g's parameters ω
    between silos, and the embedding methods read g's output Z."""

    embedding: nn.Module
    head: nn.Module

    def __init__(self, embedding: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(x))
