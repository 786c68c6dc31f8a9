"""torchvision's ImageNet architectures split into embedding g and head h (EMD-CFL paper,
Appendix D.2).

The embedding is the whole backbone up to the pooled features (the classifier's last linear
layer replaced by an identity), so its state keeps torchvision's parameter names under
`embedding.net.`; the head is a fresh linear layer (after EfficientNet's own dropout).
torchvision is imported here only, when a model needs it.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from .split_model import SplitModel

# Per model: the classifier module that becomes an identity (its state-dict keys start with
# HEAD_PREFIX) and the last linear layer in it, whose input is the embedding.
CLASSIFIER = {
    "resnet18": ("fc", "fc"),
    "resnet50": ("fc", "fc"),
    "efficientnet_b3": ("classifier", "classifier.1"),
    "vit_b_16": ("heads", "heads.head"),
    "convnext_base": ("classifier.2", "classifier.2"),
}
HEAD_PREFIX = {name: module + "." for name, (module, _) in CLASSIFIER.items()}
Layer = TypeVar("Layer", bound=nn.Module)


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


def torchvision_network(name: str, input_size: int) -> nn.Module:
    """The untrained torchvision model with its ImageNet classifier (1000 classes)."""
    from torchvision import models

    extra = {"image_size": input_size} if name == "vit_b_16" else {}
    return getattr(models, name)(weights=None, **extra)


def split(name: str, net: nn.Module, num_classes: int, input_size: int) -> SplitModel:
    """Cut `net` before its last linear layer: g = Backbone(net with its classifier an
    identity), h = a new linear layer (after EfficientNet's own dropout)."""
    if name not in CLASSIFIER:
        raise ValueError(f"unknown torchvision model {name!r}")
    classifier, last = CLASSIFIER[name]
    head: nn.Module = nn.Linear(_layer(net, last, nn.Linear).in_features, num_classes)
    if name == "efficientnet_b3":
        head = nn.Sequential(nn.Dropout(p=_layer(net, "classifier.0", nn.Dropout).p), head)
    net.set_submodule(classifier, nn.Identity())
    return SplitModel(Backbone(net, input_size), head)


def _layer(net: nn.Module, path: str, kind: type[Layer]) -> Layer:
    layer = net.get_submodule(path)
    if not isinstance(layer, kind):
        raise TypeError(f"{path} of {type(net).__name__} is a {type(layer).__name__}, not a {kind.__name__}")
    return layer


def default_weights(name: str):
    """torchvision's default ImageNet weights of the model (an enum member with `url`)."""
    from torchvision.models import get_model_weights

    return get_model_weights(name).DEFAULT
