"""What a silo does with its own data: local SGD (ClientUpdate), evaluation, embedding.

Inputs are numpy arrays or tensors; a silo moves its sets to its device once (`to_device`),
so that on a GPU the batches are cut where the data already lie. The shuffling order comes
from a CPU generator: the same order on any device."""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from .config import TrainConfig

EVAL_BATCH = 512

Array = np.ndarray | torch.Tensor


def tensor(a: Array) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.from_numpy(a)


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """The array as a tensor on `device`, moved once. Where the GPU lacks the memory (its silos
    share it) the set stays on the CPU, pinned, and its batches travel one at a time."""
    t = torch.from_numpy(a)
    if device.type == "cpu":
        return t
    try:
        return t.to(device)
    except torch.cuda.OutOfMemoryError:
        return t.pin_memory()


def train_local(model: nn.Module, x: Array, y: Array, cfg: TrainConfig,
                generator: torch.Generator, device: torch.device) -> None:
    """E local epochs of SGD with momentum and weight decay (Alg. 1, ClientUpdate)."""
    model.train()
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay)
    xs, ys = tensor(x), tensor(y)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(cfg.local_epochs):
        order = torch.randperm(len(ys), generator=generator).to(xs.device)
        for start in range(0, len(ys), cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss = loss_fn(model(xs[idx].to(device, non_blocking=True)), ys[idx].to(device, non_blocking=True))
            loss.backward()
            optimiser.step()
    optimiser.zero_grad(set_to_none=True)  # a model's worth of gradients per silo, kept for nothing


@torch.no_grad()
def evaluate(model: nn.Module, x: Array, y: Array, device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on a labelled set."""
    model.eval()
    xs, ys = tensor(x), tensor(y)
    correct, loss_sum = 0, 0.0
    for start in range(0, len(ys), EVAL_BATCH):
        xb = xs[start:start + EVAL_BATCH].to(device)
        yb = ys[start:start + EVAL_BATCH].to(device)
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return correct / len(ys), loss_sum / len(ys)


@torch.no_grad()
def embed(embedding: nn.Module, x: Array, device: torch.device, train_mode: bool = False,
          batch: int = EVAL_BATCH) -> np.ndarray:
    """g_ω(x) for a batch of inputs, as float32 (n, dim(Z)).

    `train_mode` embeds as the authors' code does (`get_embeddings` never calls eval():
    BatchNorm normalises by each batch of `batch` inputs, dropout is on), on a copy, so that
    the silo's own BatchNorm statistics stay as training left them."""
    if train_mode:
        embedding = copy.deepcopy(embedding).train()
    else:
        embedding.eval()
    xs = tensor(x)
    out = [embedding(xs[s:s + batch].to(device)).cpu() for s in range(0, len(xs), batch)]
    return torch.cat(out).numpy().astype(np.float32)
