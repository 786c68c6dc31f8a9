"""What a silo does with its own data: local SGD (ClientUpdate), evaluation, embedding."""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from .config import TrainConfig

EVAL_BATCH = 512


def train_local(model: nn.Module, x: np.ndarray, y: np.ndarray, cfg: TrainConfig,
                generator: torch.Generator, device: torch.device) -> None:
    """E local epochs of SGD with momentum and weight decay (Alg. 1, ClientUpdate)."""
    model.train()
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(cfg.local_epochs):
        order = torch.randperm(len(ys), generator=generator)
        for start in range(0, len(ys), cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss = loss_fn(model(xs[idx].to(device)), ys[idx].to(device))
            loss.backward()
            optimiser.step()


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on a labelled set."""
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(y), EVAL_BATCH):
        xb = torch.from_numpy(x[start:start + EVAL_BATCH]).to(device)
        yb = torch.from_numpy(y[start:start + EVAL_BATCH]).to(device)
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return correct / len(y), loss_sum / len(y)


@torch.no_grad()
def embed(embedding: nn.Module, x: np.ndarray, device: torch.device, train_mode: bool = False,
          batch: int = EVAL_BATCH) -> np.ndarray:
    """g_ω(x) for a batch of inputs, as float32 (n, dim(Z)).

    `train_mode` embeds as the authors' code does (`get_embeddings` never calls eval():
    BatchNorm normalises by each batch of `batch` inputs, dropout is on), on a copy, so that
    the silo's own BatchNorm statistics stay as training left them."""
    if train_mode:
        embedding = copy.deepcopy(embedding).train()
    else:
        embedding.eval()
    out = [embedding(torch.from_numpy(x[s:s + batch]).to(device)).cpu() for s in range(0, len(x), batch)]
    return torch.cat(out).numpy().astype(np.float32)
