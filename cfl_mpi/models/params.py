"""The `model:` section of the config: which network every silo trains, checked without
importing torch (the config check runs on every rank before any heavy import)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from ..settings import derived

# The torchvision models (EMD-CFL paper, Appendix D.2) and their embedding sizes dim(Z): the pooled features
# in front of the classifier. The simple CNN's embedding_dim is free (default 128).
TORCHVISION_MODELS = {
    "resnet18": 512,
    "resnet50": 2048,
    "efficientnet_b3": 1536,
    "vit_b_16": 768,
    "convnext_base": 1024,
}
IMAGENET_INPUT_SIZE = 224  # what the paper feeds the ImageNet models
MLP_HIDDEN = 200  # IFCA's rotated-MNIST network: 784-200-10
# Models whose forward is a function of their parameters and input alone: no buffers (BatchNorm's
# running statistics), no random layers (dropout, stochastic depth), which a stacked forward
# would share between silos (runtime.silo_training: batched).
BATCHABLE_MODELS = ("simple_cnn", "mlp")
BUILT_IN_MODELS = ("simple_cnn", "mlp", *TORCHVISION_MODELS)


# The network every silo trains; the embedding methods read its embedding Z (the pooled features).
@dataclass(frozen=True)
class ModelConfig:
    # simple_cnn: two convolutions and two fully connected layers (sizes below); mlp: IFCA's
    # fully connected network (the flattened image, one hidden ReLU layer of embedding_dim
    # units, the embedding, then the classes); the others are torchvision's models
    # (TORCHVISION_MODELS), fed 224x224 inputs by default. Your own: "package.module:factory",
    # a function of (input_shape, num_classes) that returns a cfl_mpi.models.split_model.SplitModel (set
    # embedding_dim to its embedding's size).
    name: Literal["simple_cnn", "mlp", "resnet18", "resnet50", "efficientnet_b3", "vit_b_16", "convnext_base"] | str = (
        "simple_cnn"
    )
    # simple_cnn, the EMD-CFL paper's (Appendix D.2): conv 64, conv 128, fc 128 (embedding), fc classes.
    channels: list[int] = field(default_factory=lambda: [64, 128])
    # simple_cnn's 2x2 max-pools: 1, after the second conv (the authors' network, the paper
    # configs), or 2, after each conv (4x cheaper; the default, for CPU runs and tests).
    pools: Literal[1, 2] = 2
    # dim(Z); null: 128 for the simple CNN, 200 for the MLP (IFCA's hidden layer), the model's
    # own size for torchvision models; your own model's must be given.
    embedding_dim: int = derived()
    # false: random initialisation; true: torchvision's ImageNet weights (torch's cache, or
    # downloaded by rank 0 / `python -m cfl_mpi.commands.prepare`); a path: a weights file (a state
    # dict of the torchvision model, or of a cfl_mpi model), read with weights_only=True.
    pretrained: bool | str = False
    # Edge of the images the model is fed: batches are resized (bilinear) from data.image_size
    # on the device. null: 224 for the torchvision models (paper), data.image_size for the
    # simple CNN (which is built for that size and does not resize).
    input_size: int | None = None

    @property
    def own(self) -> bool:
        """A model of the user's own, named by its factory ("package.module:factory")."""
        return ":" in self.name

    @property
    def has_weights_to_check(self) -> bool:
        """Whether θ(0) is worth building before the job (`prepare_weights`): a model of the
        user's own to import and fit, or pretrained weights to fetch or load."""
        return self.own or self.pretrained is not False

    def __post_init__(self) -> None:
        if self.embedding_dim is None and not self.own:
            object.__setattr__(
                self, "embedding_dim", TORCHVISION_MODELS.get(self.name, MLP_HIDDEN if self.name == "mlp" else 128)
            )
        if self.input_size is None and self.name in TORCHVISION_MODELS:
            object.__setattr__(self, "input_size", IMAGENET_INPUT_SIZE)

    # ------------------------------------------------------------------ the config check
    def problems(self) -> Iterator[str]:
        """One config-error line per value the types cannot rule out (`model.<key>: …`)."""
        if self.pretrained == "":
            yield "model.pretrained: give true, false or the path of a weights file"
        if self.own:
            yield from self._own_problems()
            return
        if self.name not in BUILT_IN_MODELS:
            yield (
                f"model.name: unknown model {self.name!r} (choose one of {', '.join(BUILT_IN_MODELS)}, "
                "or name your own as package.module:factory)"
            )
            return
        if self.name in ("simple_cnn", "mlp"):  # built here, for the data's shape, with no published weights
            what = {"simple_cnn": "the simple CNN", "mlp": "the MLP"}[self.name]
            if self.name == "simple_cnn" and not (len(self.channels) == 2 and all(c > 0 for c in self.channels)):
                yield f"model.channels: the simple CNN takes two positive widths, got {self.channels}"
            if self.embedding_dim <= 0:
                yield f"model.embedding_dim: must be positive, got {self.embedding_dim}"
            if self.pretrained is True:
                yield f"model.pretrained: torchvision has no weights for {what} (use false or a weights file)"
            return
        native = TORCHVISION_MODELS[self.name]
        assert self.input_size is not None  # __post_init__ sets it for every torchvision model
        if self.embedding_dim != native:
            yield (
                f"model.embedding_dim: {self.name}'s embedding has {native} dimensions, got {self.embedding_dim} "
                f"(remove the key or set it to {native})"
            )
        if self.input_size < 32:
            yield f"model.input_size: {self.name} needs at least 32, got {self.input_size}"
        if self.name == "vit_b_16":
            if self.input_size % 16:
                yield f"model.input_size: vit_b_16 needs a multiple of 16, got {self.input_size}"
            if self.pretrained is not False and self.input_size != IMAGENET_INPUT_SIZE:
                yield (
                    f"model.input_size: vit_b_16's weights are for {IMAGENET_INPUT_SIZE}x{IMAGENET_INPUT_SIZE} "
                    f"inputs, got {self.input_size} (set it to {IMAGENET_INPUT_SIZE} or pretrained: false)"
                )

    def _own_problems(self) -> Iterator[str]:
        """What can be checked of the user's model without importing it (torch, on every rank):
        its module can be found; the factory itself is called and checked at the start of the job."""
        module, _, factory = self.name.partition(":")
        if not (module and factory.isidentifier()):
            yield f"model.name: {self.name!r} is not package.module:factory (e.g. my_models.signals:build)"
            return
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package that is missing or cannot be imported
            found = False
        if not found:
            yield f"model.name: module {module} not found (install it, or add its folder to PYTHONPATH)"
        if self.embedding_dim is None or self.embedding_dim <= 0:
            yield f"model.embedding_dim: give the size of {self.name}'s embedding (its output per example)"
        if self.pretrained is True:
            yield "model.pretrained: torchvision has no weights for your own model (false or a file)"

    def fit_problems(self, shape: tuple[int, ...]) -> list[str]:
        """Why the model cannot take examples of `shape` (what the data set holds, or what the
        silos agreed on before the first round); empty when it can."""
        size = "x".join(map(str, shape))
        if self.own:  # checked by calling it at the start of the job (build.check_model)
            return []
        if self.name in ("simple_cnn", "mlp") and self.input_size is not None and self.input_size != shape[-1]:
            what = {"simple_cnn": "the simple CNN", "mlp": "the MLP"}[self.name]
            return [
                f"model.input_size: {what} is built for data.image_size ({shape[-1]}), "
                f"got {self.input_size} (set data.image_size instead)"
            ]
        if self.name == "mlp":
            return []
        if len(shape) != 3 or shape[1] != shape[2]:
            return [
                f"model.name: {self.name} takes square images (channels x size x size), the data's examples are {size}"
            ]
        if self.name == "simple_cnn" or shape[0] == 3:
            return []
        return [f"model.name: {self.name} takes 3-channel images, the data's examples are {size}"]


class Architecture(NamedTuple):
    """What a model is built from: its section, the shape of one input a silo holds
    ((channels, height, width) or (features,)) and the number of classes."""

    model: ModelConfig
    sample_shape: tuple[int, ...]
    classes: int
