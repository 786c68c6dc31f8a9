"""EMD-CFL's switches for the authors' code (docs/research/FIDELITY.md): embedding in train mode, τ
through a full-rank projection, the partner's validation sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from jobs import simulate_job
from torch import nn

from cfl_mpi.training.local import embed

DIGITS = "configs/digits.yaml"
AUTHORS = (
    "strategy.embed_mode=train",
    "strategy.tau_projection=full",
    "strategy.partner_sample=val",
    "strategy.sample_fraction=1.0",
)


def test_train_mode_embeds_with_batch_statistics_and_leaves_the_model_alone():
    """The authors' `get_embeddings` never calls eval(): BatchNorm normalises each batch by
    its own statistics. Ours does so on a copy: the silo's running statistics stay."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4))
    with torch.no_grad():
        net[1].running_mean.fill_(3.0)
    x = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float32)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    z_train = embed(net, x, torch.device("cpu"), train_mode=True, batch=6)
    with torch.no_grad():
        h = net[0](torch.from_numpy(x)).reshape(2, 6, 4)  # two batches of 6, each by its own statistics
        expected = (h - h.mean(1, keepdim=True)) / torch.sqrt(h.var(1, unbiased=False, keepdim=True) + 1e-5)
    np.testing.assert_allclose(z_train, expected.reshape(12, 4).numpy(), atol=1e-5)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    z_eval = embed(net, x, torch.device("cpu"))
    assert np.abs(z_eval - z_train).max() > 0.1  # eval mode uses the running mean of 3


@pytest.mark.job
def test_authors_options_run_and_find_the_rotations(tmp_path):
    summary, records = simulate_job(
        DIGITS, tmp_path, "silos=4", "data.rotations=[0,180]", "train.rounds=1", "strategy.pair_keys=seeded", *AUTHORS
    )
    assert records[0]["ari"] == 1.0 and summary["n_clusters"] == 2
    tau = np.load(tmp_path / "tau.npy")
    assert np.all(np.isfinite(tau)) and np.all(tau > 0)
