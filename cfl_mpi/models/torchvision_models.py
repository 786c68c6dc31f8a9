"""torchvision's ImageNet architectures split into embedding g and head h (EMD-CFL paper,
Appendix D.2).

The embedding is the whole backbone up to the pooled features (the classifier's last linear
layer replaced by an identity), so its state keeps torchvision's parameter names under
`embedding.net.`; the head is a fresh linear layer (after EfficientNet's own dropout).
torchvision is imported here only, when a model needs it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# Prefix of the classifier's last linear layer in each torchvision model's state dict.
HEAD_PREFIX = {
    "resnet18": "fc.",
    "resnet50": "fc.",
    "efficientnet_b3": "classifier.",
    "vit_b_16": "heads.",
    "convnext_base": "classifier.2.",
}


class Backbone(nn.Module):
    """g: resize the batch to the model's input size (bilinear, on the device), then the network."""

    def __init__(self, net: nn.Module, input_size: int) -> None:
        super().__init__()
        self.net = net
        self.input_size = input_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.input_size, self.input_size):
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False)
        return self.net(x)


class SplitModel(nn.Module):
    """f = h ∘ g with explicit `embedding` g and `head` h (EMD-CFL swaps only g)."""

    def __init__(self, embedding: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(x))


def torchvision_network(name: str, input_size: int) -> nn.Module:
    """The untrained torchvision model with its ImageNet classifier (1000 classes)."""
    from torchvision import models

    extra = {"image_size": input_size} if name == "vit_b_16" else {}
    return getattr(models, name)(weights=None, **extra)


def split(name: str, net: nn.Module, num_classes: int, input_size: int) -> SplitModel:
    """Cut `net` before its last linear layer: g = Backbone(net without it), h = a new linear layer."""
    if name.startswith("resnet"):
        dim, net.fc = net.fc.in_features, nn.Identity()
        head: nn.Module = nn.Linear(dim, num_classes)
    elif name == "efficientnet_b3":
        dropout, linear = net.classifier[0], net.classifier[1]
        net.classifier = nn.Identity()
        head = nn.Sequential(nn.Dropout(p=dropout.p), nn.Linear(linear.in_features, num_classes))
    elif name == "vit_b_16":
        dim, net.heads = net.heads.head.in_features, nn.Identity()
        head = nn.Linear(dim, num_classes)
    elif name == "convnext_base":
        dim, net.classifier[2] = net.classifier[2].in_features, nn.Identity()
        head = nn.Linear(dim, num_classes)
    else:
        raise ValueError(f"unknown torchvision model {name!r}")
    return SplitModel(Backbone(net, input_size), head)


def default_weights(name: str):
    """torchvision's default ImageNet weights of the model (an enum member with `url`)."""
    from torchvision.models import get_model_weights

    return get_model_weights(name).DEFAULT
