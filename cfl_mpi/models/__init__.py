"""The networks the silos train. Every one has an explicit `embedding` g and `head` h with
`model(x) == head(embedding(x))` (split_model.py): the simple CNN (simple_cnn.py), IFCA's fully
connected network (mlp.py), torchvision's ImageNet models (torchvision_models.py) and a model of
the user's own (own.py). The `model:` section of the config lives in params.py, light enough
for the config check; build.py builds a model and moves its weights to and from the wire.

`from cfl_mpi.models import SplitModel` is what a model of one's own subclasses or returns; it
imports torch only when asked for, so that the config check, which imports this package,
stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .split_model import SplitModel

__all__ = ["SplitModel"]


def __getattr__(name: str) -> Any:
    if name == "SplitModel":
        from .split_model import SplitModel

        return SplitModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
