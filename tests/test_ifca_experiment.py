"""The IFCA experiment's second test accuracy, IFCA's own (`benchmarks/ifca_experiment.py`):
with one model (FedAvg's), every test client takes it, so the figure is that model's accuracy
on every rotation of the held-out test images, computed here from the pool directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from jobs import simulate_job

from benchmarks.ifca_experiment import ifca_test_accuracy
from cfl_mpi.config import load_config
from cfl_mpi.models.build import build_model, load_arrays
from cfl_mpi.runtime.checkpoint import load_checkpoint

pytestmark = pytest.mark.job


def test_with_one_model_ifcas_test_accuracy_is_that_models_accuracy_on_every_rotation(shared_data, tmp_path):
    run = tmp_path / "fedavg_s0"
    sets = [f"data.root={shared_data / 'mnist'}", "data.download=false", "silos=8", "train.rounds=1",
            "strategy.name=fedavg"]  # fmt: skip
    simulate_job("configs/ifca_rotated_mnist_test_split.yaml", run, *sets)
    cfg = load_config(run / "config.yaml")
    (arrays,) = load_checkpoint(run).models
    model = build_model(cfg.architecture, load_weights=False)
    load_arrays(model, arrays)
    _, _, images, labels = cfg.data.pools(cfg.seed)  # the 2,000 held-out test images, uint8
    mean, std = cfg.data.source.stats
    correct = 0
    with torch.no_grad():
        for quarter in range(4):
            x = (np.rot90(images / 255.0, k=quarter, axes=(1, 2)) - mean) / std
            for start in range(0, len(labels), 100):  # the clients' batches: the same float rounding
                batch = torch.from_numpy(x[start : start + 100, None].astype(np.float32))
                correct += int((model.eval()(batch).argmax(1).numpy() == labels[start : start + 100]).sum())
    assert ifca_test_accuracy(run) == correct / (4 * len(labels))
