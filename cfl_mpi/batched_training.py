"""Several silos' local training as one computation (`runtime.silo_training: batched`).

Each silo's ClientUpdate (training.py's `train_local`: E epochs of SGD on its own shuffled
mini-batches) with the silos' parameters stacked along a first axis: one forward and one
backward a step over every silo's own mini-batch, the model applied to each silo's slice by
torch.func's `vmap` of a `functional_call`, and each silo's SGD update on its slice. A silo
keeps its own shuffle (its generator draws as alone) and its own loss (the mean over its own
batch); the gradient of the sum of the silos' losses is each silo's own gradient in its
slice, since no silo's loss depends on another's parameters.

Silos train together where they have the same number of training samples (the same steps
and batch sizes); a silo alone in its size trains as `train_local`. The weights equal one by
one's up to float rounding, not bit for bit: a batched product sums in another order
(tests/models/test_batched_training.py measures the difference).

Why not torch.func's `grad`: its backward enters `torch._dynamo` (and sympy with it, ~2.5 s
of import in a silo's first round), and so does `cross_entropy` under `vmap`; the batched
forward with autograd's own backward and the loss outside `vmap` import nothing.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap

from .config import BATCHABLE_MODELS, Config, TrainConfig
from .training import Sgd, train_local

__all__ = ["LocalTraining", "batchable", "batches_silos", "train_together"]


@dataclass
class LocalTraining:
    """One silo's share of a batched call: its model (trained in place), its training set and
    the generator of its shuffles."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    generator: torch.Generator


def batchable(model: nn.Module) -> bool:
    """Whether the stacked forward computes `model` exactly: no buffers, no dropout."""
    return not any(True for _ in model.buffers()) and \
        not any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())


def batches_silos(cfg: Config, device: torch.device) -> bool:
    """Whether silos computing on `device` train batched (`runtime.silo_training`; auto: on a GPU)."""
    setting = cfg.runtime.silo_training
    if setting == "auto":
        return device.type == "cuda" and cfg.model.name in BATCHABLE_MODELS
    return setting == "batched"


def train_together(jobs: list[LocalTraining], cfg: TrainConfig, device: torch.device) -> list[None]:
    """Each job's model trained as `train_local` would, the jobs of one training set size as
    one computation."""
    groups: dict[tuple, list[LocalTraining]] = defaultdict(list)
    for job in jobs:
        groups[(len(job.y), tuple(job.x.shape[1:]))].append(job)
    for group in groups.values():
        if len(group) == 1 or not batchable(group[0].model):
            for job in group:
                train_local(job.model, job.x, job.y, cfg, job.generator, device)
        else:
            _train_stacked(group, cfg, device)
    return [None] * len(jobs)


def _train_stacked(group: list[LocalTraining], cfg: TrainConfig, device: torch.device) -> None:
    """`train_local` of silos with training sets of one size, their parameters stacked."""
    template = group[0].model.train()
    names = [name for name, _ in template.named_parameters()]
    params = [torch.stack([p.detach() for p in parts]).requires_grad_()
              for parts in zip(*(job.model.parameters() for job in group))]
    x = torch.stack([job.x for job in group]).to(device)  # (silos, n, ...)
    y = torch.stack([job.y for job in group]).to(device)
    silos, n = len(group), len(group[0].y)
    rows = torch.arange(silos, device=device)[:, None]
    batch = cfg.batch(n)
    forward = vmap(lambda p, xb: functional_call(template, dict(zip(names, p)), (xb,)))
    optimiser = Sgd(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    for _ in range(cfg.local_epochs):
        order = torch.stack([torch.randperm(n, generator=job.generator) for job in group]).to(device)
        for start in range(0, n, batch):
            idx = order[:, start:start + batch]
            logits = forward(params, x[rows, idx])  # (silos, b, classes)
            losses = nn.functional.cross_entropy(logits.flatten(0, 1), y[rows, idx].flatten(), reduction="none")
            optimiser.zero_grad()
            losses.view(silos, -1).mean(1).sum().backward()  # each slice: its silo's mean loss's gradient
            optimiser.step()
    with torch.no_grad():
        for i, job in enumerate(group):
            for own, stacked in zip(job.model.parameters(), params):
                own.copy_(stacked[i])
