"""What a silo does with its own data: local SGD (ClientUpdate), evaluation, embedding.

Inputs are numpy arrays or tensors; a silo moves its sets to an accelerator once (`SiloSet`),
so that on a GPU the batches are cut where the data already lie. The shuffling order comes
from a CPU generator: the same order on any device."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..data.images import Images, as_floats
from ..models.build import own_weights
from .params import TrainConfig

EVAL_BATCH = 512

Array = np.ndarray | torch.Tensor


def tensor(a: Array) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.from_numpy(a)


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """The array as a tensor on the accelerator `device`, moved once. Where the GPU lacks the
    memory (its silos share it) the set stays on the CPU, pinned, and its batches travel one
    at a time."""
    t = torch.from_numpy(a)
    try:
        return t.to(device)
    except torch.cuda.OutOfMemoryError:
        return t.pin_memory()


class SiloSet:
    """A labelled set a silo uses every round, as tensors on its device. On an accelerator it
    is moved there once; on the CPU it is read at each use: a float array's tensor shares the
    array's memory, and images kept as their pixels' bytes (data/images.py's `PixelCodes`) are
    made floats for that use only, so a rank's silos hold no floats between rounds. Build it
    on a compute worker (it may move the set)."""

    def __init__(self, images: Images, labels: np.ndarray, device: torch.device) -> None:
        self.images, self.labels = images, labels
        self.moved = None
        if device.type != "cpu":
            self.moved = to_device(as_floats(images), device), to_device(labels, device)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels)."""
        if self.moved is not None:
            return self.moved
        return torch.from_numpy(as_floats(self.images)), torch.from_numpy(self.labels)


class Sgd:
    """SGD with momentum and weight decay: torch.optim.SGD's update in its single-tensor form
    (no dampening, no Nesterov), operation for operation, so the weights keep their bits
    (tests/models/test_models.py). Written out because torch.optim's first step imports
    torch._dynamo, and sympy and triton with it, to exempt the step from a compiler no silo
    uses: a second of every silo process's first round."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float, weight_decay: float) -> None:
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    @torch.no_grad()
    def step(self) -> None:
        """θ ← θ − lr·b, b ← momentum·b + (g + weight_decay·θ) (b = g + weight_decay·θ at the first step)."""
        for i, param in enumerate(self.params):
            if param.grad is None:
                continue
            grad = param.grad
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            if self.momentum != 0:
                buffer = self.buffers[i]
                if buffer is None:
                    buffer = self.buffers[i] = grad.detach().clone()
                else:
                    buffer.mul_(self.momentum).add_(grad, alpha=1)
                grad = buffer
            param.add_(grad, alpha=-self.lr)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None


def train_local(
    model: nn.Module, x: Array, y: Array, cfg: TrainConfig, generator: torch.Generator, device: torch.device
) -> None:
    """E local epochs of SGD with momentum and weight decay (Alg. 1, ClientUpdate), on weights
    the model owns (one that shares its weights gets copies first: models/build.py's
    `own_weights`)."""
    own_weights(model)
    model.train()
    optimiser = Sgd(list(model.parameters()), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    xs, ys = tensor(x), tensor(y)
    loss_fn = nn.CrossEntropyLoss()
    batch = cfg.batch(len(ys))
    for _ in range(cfg.local_epochs):
        order = torch.randperm(len(ys), generator=generator).to(xs.device)
        for start in range(0, len(ys), batch):
            idx = order[start : start + batch]
            optimiser.zero_grad()
            loss = loss_fn(model(xs[idx].to(device, non_blocking=True)), ys[idx].to(device, non_blocking=True))
            loss.backward()
            optimiser.step()
    optimiser.zero_grad()  # a model's worth of gradients per silo, kept for nothing


@torch.no_grad()
def evaluate(model: nn.Module, x: Array, y: Array, device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on a labelled set."""
    model.eval()
    xs, ys = tensor(x), tensor(y)
    correct, loss_sum = 0, 0.0
    for start in range(0, len(ys), EVAL_BATCH):
        xb = xs[start : start + EVAL_BATCH].to(device)
        yb = ys[start : start + EVAL_BATCH].to(device)
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return correct / len(ys), loss_sum / len(ys)


@torch.no_grad()
def embed(
    embedding: nn.Module, x: Array, device: torch.device, train_mode: bool = False, batch: int | None = EVAL_BATCH
) -> np.ndarray:
    """g_ω(x) for a batch of inputs, as float32 (n, dim(Z)).

    `train_mode` embeds as the authors' code does (`get_embeddings` never calls eval():
    BatchNorm normalises by each batch of `batch` inputs, dropout is on), on a copy, so that
    the silo's own BatchNorm statistics stay as training left them. `batch` None: all at once
    (training's full batch)."""
    if train_mode:
        embedding = copy.deepcopy(embedding).train()
    else:
        embedding.eval()
    xs = tensor(x)
    batch = batch or max(1, len(xs))
    out = [embedding(xs[s : s + batch].to(device)).cpu() for s in range(0, len(xs), batch)]
    return torch.cat(out).numpy().astype(np.float32)
