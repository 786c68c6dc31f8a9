"""Several silos' local training and evaluation as one computation (`runtime.silo_training: batched`).

Each silo's ClientUpdate (local.py's `train_local`: E epochs of SGD on its own shuffled
mini-batches) with the silos' parameters stacked along a first axis: one forward and one
backward a step over every silo's own mini-batch, the model applied to each silo's slice by
torch.func's `vmap` of a `functional_call`, and each silo's SGD update on its slice. A silo
keeps its own shuffle (its generator draws as alone) and its own loss (the mean over its own
batch); the gradient of the sum of the silos' losses is each silo's own gradient in its
slice, since no silo's loss depends on another's parameters.

Silos train together where they have the same number of training samples (the same steps
and batch sizes); a silo alone in its size trains as `train_local`. Evaluation stacks the
same way: each silo's model on its own test set, `evaluate`'s accuracy and mean loss. The
weights equal one by one's up to float rounding, not bit for bit: a batched product sums in
another order (tests/models/test_batched_training.py measures the difference).

Why not torch.func's `grad`: its backward enters `torch._dynamo` (and sympy with it, seconds
of import in a silo's first round), and so does `cross_entropy` under `vmap`; the batched
forward with autograd's own backward and the loss outside `vmap` import nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from ..models.build import hold_arrays, own_weights
from ..models.params import BATCHABLE_MODELS
from .local import Sgd, evaluate, train_local
from .params import TrainConfig

__all__ = [
    "Evaluation",
    "LocalTraining",
    "batchable",
    "batches_silos",
    "evaluate_each",
    "evaluate_together",
    "train_together",
]


# The most images one stacked step or evaluation pass holds (all its silos' together): bounds
# the activations' memory, a few GB for the narrow CNN, while keeping a GPU busy.
STEP_IMAGES = 16384


@dataclass
class LocalTraining:
    """One silo's share of a batched call: its model (trained in place), its training set and
    the generator of its shuffles."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    generator: torch.Generator


@dataclass
class Evaluation:
    """One silo's share of a batched evaluation: its model, a labelled set of its own, and the
    weights the model continues from, to evaluate (None: as it is)."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    weights: dict[str, np.ndarray] | None = None

    def loaded(self, device: torch.device) -> nn.Module:
        """The model, holding `weights` (models/build.py's `hold_arrays`) once they are loaded on
        the worker that evaluates it."""
        if self.weights is not None:
            hold_arrays(self.model, self.weights, device)
        return self.model


def batchable(model: nn.Module) -> bool:
    """Whether the stacked forward computes `model` exactly: no buffers, no dropout."""
    return not any(True for _ in model.buffers()) and not any(
        isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()
    )


def batches_silos(setting: str, model: str, device: torch.device) -> bool:
    """Whether silos computing on `device` train batched: `runtime.silo_training` (`setting`;
    auto: on a GPU, for a model of BATCHABLE_MODELS) for the silos' `model.name`."""
    if setting == "auto":
        return device.type == "cuda" and model in BATCHABLE_MODELS
    return setting == "batched"


def train_together(jobs: list[LocalTraining], cfg: TrainConfig, device: torch.device) -> list[None]:
    """Each job's model trained as `train_local` would, the jobs of one training set size as
    one computation (in chunks of silos whose step holds at most STEP_IMAGES images), on
    weights each model owns (as `train_local`: models/build.py's `own_weights`)."""
    for group in _by_size(jobs):
        if len(group) == 1 or not batchable(group[0].model):
            for job in group:
                train_local(job.model, job.x, job.y, cfg, job.generator, device)
            continue
        per_step = max(1, STEP_IMAGES // cfg.batch(len(group[0].y)))
        for first in range(0, len(group), per_step):
            _train_stacked(group[first : first + per_step], cfg, device)
    return [None] * len(jobs)


def evaluate_each(jobs: list[Evaluation], device: torch.device) -> list[tuple[float, float] | Exception]:
    """`evaluate` of each job's model on its own set, one after another in one call (the same
    bits as alone: a silo's result never depends on which silos queued with it); a job's
    exception is its result, for its own silo to raise. One call for the silos that queued
    rather than one each: a worker handed thousands of small calls spends more on the hand-offs
    than on the evaluations (docs/research/PERFORMANCE.md, "Evaluations in one call")."""
    results: list[tuple[float, float] | Exception] = []
    for job in jobs:
        try:
            results.append(evaluate(job.loaded(device), job.x, job.y, device))
        except Exception as err:  # noqa: BLE001 - that silo's own failure, not its batch's
            results.append(err)
    return results


@torch.no_grad()
def evaluate_together(jobs: list[Evaluation], device: torch.device) -> list[tuple[float, float]]:
    """`evaluate` of each job's model on its own set, (accuracy, mean cross-entropy), the jobs
    with sets of one size as one computation (passes of at most STEP_IMAGES images)."""
    for job in jobs:
        job.loaded(device)
    results = {}
    for group in _by_size(jobs):
        if len(group) == 1 or not batchable(group[0].model):
            results.update({id(job): evaluate(job.model, job.x, job.y, device) for job in group})
            continue
        forward = _stacked_forward(group[0].model.eval())
        params = [torch.stack(parts) for parts in zip(*(job.model.parameters() for job in group))]
        x, y = (torch.stack(sets).to(device) for sets in zip(*((job.x, job.y) for job in group)))
        silos, n = y.shape
        correct = torch.zeros(silos, dtype=torch.int64, device=device)
        loss_sum = torch.zeros(silos, dtype=torch.float64, device=device)
        step = max(1, STEP_IMAGES // silos)
        for start in range(0, n, step):
            logits, labels = forward(params, x[:, start : start + step]), y[:, start : start + step]
            losses = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
            loss_sum += losses.view(silos, -1).sum(1, dtype=torch.float64)
            correct += (logits.argmax(-1) == labels).sum(1)
        for job, hits, loss in zip(group, correct.tolist(), loss_sum.tolist()):
            results[id(job)] = (hits / n, loss / n)
    return [results[id(job)] for job in jobs]


def _by_size(jobs: list) -> list[list]:
    """The jobs grouped by the size and sample shape of their sets, in order."""
    groups: dict[tuple, list] = defaultdict(list)
    for job in jobs:
        groups[(len(job.y), tuple(job.x.shape[1:]))].append(job)
    return list(groups.values())


def _stacked_forward(template: nn.Module):
    """forward(stacked parameters, stacked inputs): `template`'s forward on each silo's slice."""
    names = [name for name, _ in template.named_parameters()]
    return vmap(lambda p, xb: functional_call(template, dict(zip(names, p)), (xb,)))


def _train_stacked(group: list[LocalTraining], cfg: TrainConfig, device: torch.device) -> None:
    """`train_local` of silos with training sets of one size, their parameters stacked."""
    forward = _stacked_forward(group[0].model.train())
    params = [
        torch.stack([p.detach() for p in parts]).requires_grad_()
        for parts in zip(*(job.model.parameters() for job in group))
    ]
    x, y = (torch.stack(sets).to(device) for sets in zip(*((job.x, job.y) for job in group)))  # (silos, n, ...)
    silos, n = y.shape
    rows = torch.arange(silos, device=device)[:, None]
    batch = cfg.batch(n)
    optimiser = Sgd(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    for _ in range(cfg.local_epochs):
        order = torch.stack([torch.randperm(n, generator=job.generator) for job in group]).to(device)
        for start in range(0, n, batch):
            idx = order[:, start : start + batch]
            logits = forward(params, x[rows, idx])  # (silos, b, classes)
            losses = nn.functional.cross_entropy(logits.flatten(0, 1), y[rows, idx].flatten(), reduction="none")
            optimiser.zero_grad()
            losses.view(silos, -1).mean(1).sum().backward()  # each slice: its silo's mean loss's gradient
            optimiser.step()
    with torch.no_grad():
        for i, job in enumerate(group):
            own_weights(job.model)  # written below: never into weights it shares
            for own, stacked in zip(job.model.parameters(), params):
                own.copy_(stacked[i])
