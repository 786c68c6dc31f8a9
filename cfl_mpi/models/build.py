"""Models by name, and their weights as plain numpy arrays for the wire.

Every model has an explicit `embedding` g and `head` h with `model(x) == head(embedding(x))`:
the simple CNN (simple_cnn.py), IFCA's fully connected network (mlp.py) and torchvision's
ImageNet models (torchvision_models.py).
"""

from __future__ import annotations

import copy
import math
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from ..settings import ConfigError
from .mlp import Mlp
from .own import OwnModelError, check_fit, own_model
from .params import TORCHVISION_MODELS, Architecture
from .simple_cnn import SimpleCNN
from .split_model import SplitModel
from .torchvision_models import HEAD_PREFIX, default_weights, split, torchvision_network  # imports torchvision lazily

__all__ = [
    "build_model",
    "SplitModel",
    "seeded_states",
    "state_arrays",
    "load_arrays",
    "share_arrays",
    "own_weights",
    "skeleton_model",
    "as_skeleton",
    "hold_arrays",
    "shares_weights",
    "state_template",
    "load_weights_file",
    "WeightsError",
    "OwnModelError",
    "check_model",
]

M = TypeVar("M", bound=nn.Module)

# share_arrays hands torch read-only arrays on purpose (a module holding them only computes
# with them; training takes a copy of its own first): torch's warning about those is not for
# a rank's console.
warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)

# torch's default generator is process-wide, and several silos (threads) may build models at
# once: seeded draws and every other construction take turns, so θ(0) depends on the seed only.
_DEFAULT_GENERATOR = threading.RLock()


class WeightsError(ValueError):
    """A weights file that does not fit the model; the message is one `model.pretrained: ...` line."""


def build_model(arch: Architecture, *, load_weights: bool = True) -> SplitModel:
    """A fresh model (θ(0) and other seeded draws come from `seeded_states`).

    With `model.pretrained` set and `load_weights`, the embedding (and the head, when the file
    has one of the right shape) starts from those weights. Silos pass `load_weights=False`:
    they receive θ(0) from the server, the only rank that needs the weights.
    """
    m, shape, num_classes = arch
    with _DEFAULT_GENERATOR:
        if m.name == "simple_cnn":
            c1, c2 = m.channels
            model: SplitModel = SimpleCNN(shape[0], num_classes, shape[-1], (c1, c2), m.embedding_dim, m.pools)
        elif m.name == "mlp":
            model = Mlp(math.prod(shape), num_classes, m.embedding_dim)
        elif m.own:
            model = own_model(m.name, shape, num_classes)
        else:
            assert m.input_size is not None  # ModelConfig sets it for every torchvision model
            model = split(m.name, torchvision_network(m.name, m.input_size), num_classes, m.input_size)
    if load_weights and m.pretrained is not False:
        if m.pretrained is True:
            state = _torchvision_weights(m.name)
            source = f"torchvision's {m.name} weights"
        else:
            state = load_weights_file(Path(m.pretrained))
            source = m.pretrained
        _load_pretrained(model, m.name, state, source)
    return model


def check_model(arch: Architecture) -> None:
    """Before any work, on the rank that builds θ(0): a model of the user's own is importable,
    a SplitModel, and takes the data's examples to its declared embedding and the classes
    (OwnModelError, one line, otherwise). The built-in models are checked by the config."""
    if arch.model.own:
        model = build_model(arch, load_weights=False)
        check_fit(model, arch.model.name, arch.sample_shape, arch.classes, arch.model.embedding_dim)


def seeded_states(arch: Architecture, seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """`count` models drawn one after another after `torch.manual_seed(seed)`: θ(0) is the first."""
    with _DEFAULT_GENERATOR:
        torch.manual_seed(seed)
        models = [build_model(arch) for _ in range(count)]
    return [state_arrays(m) for m in models]


def initial_model(arch: Architecture, seed: int) -> dict[str, np.ndarray]:
    """θ(0), the same for every silo (Alg. 1, line 2): a function of the seed only."""
    return seeded_states(arch, seed, 1)[0]


def prepare_weights(arch: Architecture) -> None:
    """Check a model of the user's own, then fetch (torchvision's) or check (a file's)
    pretrained weights by building θ(0) once."""
    model = arch.model
    if model.own:
        try:
            check_model(arch)
        except OwnModelError as err:
            raise ConfigError(str(err)) from None
    if model.pretrained is False:
        return
    try:
        build_model(arch)
    except WeightsError as err:
        raise ConfigError(str(err)) from None
    except Exception as err:  # missing file, unpicklable content, no network, ...
        detail = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'}"[:300]
        if model.pretrained is True:
            raise ConfigError(
                f"model.pretrained: torchvision's {model.name} weights are not in torch's cache "
                f"({_cache_file(model.name)}) and fetching them failed ({detail}) (run "
                "python -m cfl_mpi.commands.prepare "
                f"CONFIG where a network is reachable, copy the file there, or set model.pretrained to a "
                f"weights file)"
            ) from None
        raise ConfigError(
            f"model.pretrained: cannot load weights from {model.pretrained} ({detail}) "
            f"(give a state dict saved with torch.save)"
        ) from None


def _cache_file(name: str) -> str:
    import os

    import torch

    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(default_weights(name).url))


def _torchvision_weights(name: str) -> dict[str, torch.Tensor]:
    """torchvision's default ImageNet weights from torch's cache (`$TORCH_HOME/hub/checkpoints`),
    downloaded into it when missing and a network is reachable."""
    return default_weights(name).get_state_dict(progress=False, check_hash=True, weights_only=True)


def load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """A state dict saved with `torch.save`, read with weights_only=True (tensors, no code)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"model.pretrained: {path} does not hold a state dict (a mapping of names to tensors)")
    return state


def _load_pretrained(model: SplitModel, name: str, state: dict[str, torch.Tensor], source: str) -> None:
    """Load a torchvision state dict (keys as in torchvision's model) or a cfl_mpi one
    (keys `embedding.*`, `head.*`) into `model`. The embedding must match exactly; the head is
    taken only when its shapes fit (an ImageNet head has 1000 classes and is left fresh)."""
    if all(k.startswith(("embedding.", "head.")) for k in state):
        embedding = {k[len("embedding.") :]: v for k, v in state.items() if k.startswith("embedding.")}
        head = {k[len("head.") :]: v for k, v in state.items() if k.startswith("head.")}
    elif name in TORCHVISION_MODELS:
        embedding = {f"net.{k}": v for k, v in state.items() if not k.startswith(HEAD_PREFIX[name])}
        head = {}
    else:
        raise WeightsError(f"model.pretrained: {source} holds no embedding.* weights for {name}")
    try:
        model.embedding.load_state_dict(embedding, strict=True)
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        detail = (lines[1] if len(lines) > 1 else lines[0])[:200]
        raise WeightsError(f"model.pretrained: {source} does not fit {name}'s embedding ({detail})") from None
    own = model.head.state_dict()
    if head and head.keys() == own.keys() and all(head[k].shape == own[k].shape for k in own):
        model.head.load_state_dict(head)


def state_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's state (parameters and buffers) as CPU numpy arrays, in a fixed order."""
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def state_template(module: nn.Module) -> dict[str, np.ndarray]:
    """The names, dtypes and shapes of the module's state as arrays that hold no memory (what
    a received model must match: `Payload.expect(like=...)`); the module may be a skeleton."""
    return {
        k: np.broadcast_to(np.zeros((), dtype=torch.empty(0, dtype=v.dtype).numpy().dtype), tuple(v.shape))
        for k, v in module.state_dict().items()
    }


_THREAD = threading.local()


def scratch_copy(module: nn.Module) -> nn.Module:
    """A module of `module`'s architecture for this thread to load other weights into, made
    once per thread and architecture: `load_arrays` overwrites every parameter and buffer, and
    a deep copy per use would cost a good share of an embedding's time (the compute workers
    embed under thousands of partners' ω)."""
    state = module.state_dict()
    key = (type(module), tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in state.items()))
    copies = _THREAD.__dict__.setdefault("copies", {})
    if key not in copies:
        copies[key] = copy.deepcopy(module)
        setattr(copies[key], _SHARES, False)  # its weights are its own: loads copy into them
    return copies[key]


# A module whose weights may be memory it shares with other modules (`share_arrays`): it never
# writes into its tensors; training and loading give it copies of its own first.
_SHARES = "_cfl_mpi_shares_weights"


def shares_weights(module: nn.Module) -> bool:
    """Whether the module holds the arrays it is handed rather than copies (`skeleton_model`)."""
    return bool(getattr(module, _SHARES, False))


def load_arrays(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load received arrays into the module (names and shapes were checked on receipt). Arrays
    that several silos share are read-only: torch takes those as a copy (it has no read-only
    tensors), the others as they are. A module that shares its weights gets copies of its own
    first: nothing is written into memory it shares."""
    own_weights(module)
    device = next(module.parameters()).device
    module.load_state_dict(
        {k: (torch.from_numpy(v) if v.flags.writeable else torch.tensor(v)).to(device) for k, v in arrays.items()},
        strict=True,
    )


def share_arrays(module: nn.Module, arrays: dict[str, np.ndarray], device: torch.device) -> None:
    """The module's parameters and buffers become `arrays` themselves (on the CPU: no copy; on
    another device, a copy there), for a module that only computes with them (evaluates,
    embeds, picks a cluster) until `own_weights`."""
    module.load_state_dict({k: torch.from_numpy(v).to(device) for k, v in arrays.items()}, strict=True, assign=True)


def hold_arrays(module: nn.Module, arrays: dict[str, np.ndarray], device: torch.device) -> None:
    """The module continues from `arrays`: shared where it shares its weights, else copied into
    its own memory (a silo's model under `runtime.silo_models`)."""
    if shares_weights(module):
        share_arrays(module, arrays, device)
    else:
        load_arrays(module, arrays)


def own_weights(module: nn.Module) -> None:
    """A module that shares its weights gets copies of its own (training calls this before its
    first step); any other module keeps its own as they are."""
    if shares_weights(module):
        module.load_state_dict({k: v.clone() for k, v in module.state_dict().items()}, strict=True, assign=True)


def skeleton_model(arch: Architecture) -> SplitModel:
    """A silo's model that shares its weights (`runtime.silo_models: shared`): until the server's
    model comes in by `share_arrays`, the architecture with its tensors on torch's meta device
    (no memory, no random draws)."""
    return as_skeleton(lambda: build_model(arch, load_weights=False))


def as_skeleton(build: Callable[[], M]) -> M:
    """`build()`'s module on torch's meta device, marked as sharing the weights it is handed."""
    with torch.device("meta"):
        module = build()
    setattr(module, _SHARES, True)
    return module
