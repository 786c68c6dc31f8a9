"""A model of the user's own, named in the config as "package.module:factory": the factory is
called with the shape of one example the silos agreed on and the number of classes, and must
return a `SplitModel` (an embedding g and a head h), so that every method can swap or read g."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .split_model import SplitModel


class OwnModelError(ValueError):
    """The user's model cannot be used; the message is one `model.name: ...` line."""


def factory(name: str) -> Callable[..., object]:
    """The factory `name` ("package.module:factory") names."""
    module_name, _, function = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - whatever the user's module raises on import
        raise OwnModelError(f"model.name: cannot import {module_name} ({type(err).__name__}: {err})") from None
    found = getattr(module, function, None)
    if not callable(found):
        raise OwnModelError(f"model.name: {module_name} has no function {function}")
    return found


def own_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """The factory's model for examples of `input_shape` and `num_classes` classes."""
    try:
        model = factory(name)(input_shape=input_shape, num_classes=num_classes)
    except OwnModelError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever the user's factory raises
        raise OwnModelError(
            f"model.name: {name}(input_shape={input_shape}, num_classes={num_classes}) raised "
            f"{type(err).__name__}: {err}"
        ) from None
    if not isinstance(model, SplitModel):
        raise OwnModelError(
            f"model.name: {name} returned a {type(model).__name__}, not a cfl_mpi.models.split_model.SplitModel "
            "(an embedding and a head)"
        )
    return model


def check_fit(model: SplitModel, name: str, input_shape: tuple[int, ...], num_classes: int, dim: int) -> None:
    """One forward pass of two zero examples: the embedding gives `dim` values an example, the
    head `num_classes` logits; OwnModelError naming what does not fit otherwise."""
    x = torch.zeros((2, *input_shape))
    try:
        with torch.no_grad():
            z = model.embedding(x)
            logits = model.head(z)
    except Exception as err:  # noqa: BLE001 - whatever the user's forward raises
        raise OwnModelError(
            f"model.name: {name} cannot take examples of shape {'x'.join(map(str, input_shape))} "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from None
    if tuple(z.shape) != (2, dim):
        raise OwnModelError(
            f"model.embedding_dim: {name}'s embedding gives {tuple(z.shape[1:])} an example, not {dim} "
            f"(set model.embedding_dim to its size, and let it end flat)"
        )
    if tuple(logits.shape) != (2, num_classes):
        raise OwnModelError(
            f"model.name: {name}'s head gives {tuple(logits.shape[1:])} an example, not {num_classes} classes"
        )
