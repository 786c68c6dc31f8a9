"""IFCA's fully connected network (Ghosh, Chung, Yin, Ramchandran: An Efficient Framework for
Clustered Federated Learning, NeurIPS 2020; its rotated-MNIST experiments): the flattened image,
one hidden layer of `hidden` ReLU units (the embedding), then the classes."""

from __future__ import annotations

from torch import nn

from .split_model import SplitModel


class Mlp(SplitModel):
    """f = h ∘ g: `embedding` g (flatten, fc → hidden, ReLU) and `head` h (fc → classes), the
    split EMD-CFL swaps ω by. IFCA's code ends in a log-softmax before its cross-entropy loss;
    the cross-entropy of log-probabilities is that of the logits, so the head ends at the logits."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 200) -> None:
        embedding = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU())
        super().__init__(embedding, nn.Linear(hidden, num_classes))
