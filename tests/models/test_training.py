"""Local training's SGD against torch.optim.SGD, bit for bit."""

import numpy as np
import pytest
import torch
from torch import nn

from cfl_mpi.models.simple_cnn import SimpleCNN
from cfl_mpi.training.local import Sgd, train_local
from cfl_mpi.training.params import TrainConfig


def reference_train(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, generator: torch.Generator
) -> None:
    """train_local's loop with torch's own optimiser."""
    model.train()
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(cfg.local_epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), cfg.batch_size):
            idx = order[start : start + cfg.batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            optimiser.step()


@pytest.mark.parametrize("momentum, weight_decay", [(0.9, 5e-4), (0.0, 0.0), (0.5, 0.0), (0.0, 1e-3)])
def test_local_training_equals_torch_optim_sgd_bit_for_bit(momentum, weight_decay):
    torch.manual_seed(0)
    ours = SimpleCNN(1, 10, 28, channels=(4, 8), embedding_dim=16)
    theirs = SimpleCNN(1, 10, 28, channels=(4, 8), embedding_dim=16)
    theirs.load_state_dict(ours.state_dict())
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(70, 1, 28, 28)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, size=70))
    cfg = TrainConfig(local_epochs=2, lr=0.05, batch_size=16, momentum=momentum, weight_decay=weight_decay)
    train_local(ours, x, y, cfg, torch.Generator().manual_seed(3), torch.device("cpu"))
    reference_train(theirs, x, y, cfg, torch.Generator().manual_seed(3))
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), name


def test_parameters_without_gradients_are_left_alone():
    frozen, trained = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    trained.grad = torch.full((3,), 2.0)
    Sgd([frozen, trained], lr=0.5, momentum=0.9, weight_decay=0.0).step()
    assert torch.equal(frozen, torch.ones(3)) and torch.equal(trained, torch.zeros(3))
