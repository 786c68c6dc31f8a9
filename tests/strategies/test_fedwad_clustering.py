"""FedWaD clustering's server side (spectral clustering of a FedWaD distance matrix) on
fixture matrices, and its config."""

import numpy as np
import pytest

from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.runtime.halves import run_facts
from cfl_mpi.strategies.fedwad.halves import fedwad_params, pair_jobs, spectral_clusters


def block_matrix(groups, within=0.1, between=1.0, seed=0):
    """Distances of silos in `groups` (a label per silo), with a little symmetric noise."""
    g = np.asarray(groups)
    D = np.where(g[:, None] == g[None, :], within, between).astype(float)
    noise = np.random.default_rng(seed).uniform(0, 0.05, D.shape)
    D += noise + noise.T
    np.fill_diagonal(D, 0.0)
    return D


@pytest.mark.parametrize("groups", [[0, 0, 1, 1, 2, 2, 3, 3], [0, 1, 0, 1, 2, 2, 2, 1], [0, 0, 0, 1, 1, 1]])
def test_spectral_clusters_recover_blocks(groups):
    labels, sigma = spectral_clusters(block_matrix(groups), len(set(groups)), seed=0)
    # Same partition, numbered by first appearance.
    _, expected = np.unique(groups, return_inverse=True)
    assert np.array_equal(labels, _relabel(expected)) and sigma > 0


def _relabel(x):
    order = {v: i for i, v in enumerate(dict.fromkeys(x.tolist()))}
    return np.array([order[v] for v in x.tolist()])


def test_spectral_clusters_is_scale_free_and_deterministic():
    D = block_matrix([0, 0, 1, 1, 2, 2])
    a, _ = spectral_clusters(D, 3, seed=1)
    b, _ = spectral_clusters(1000.0 * D, 3, seed=1)
    assert np.array_equal(a, b)


def test_spectral_clusters_edge_cases():
    D = block_matrix([0, 0, 1, 1])
    assert spectral_clusters(D, 1, seed=0)[0].tolist() == [0, 0, 0, 0]
    assert spectral_clusters(D, 4, seed=0)[0].tolist() == [0, 1, 2, 3]


def test_config_and_jobs(tmp_path):
    cfg = load_config("configs/digits.yaml", ["strategy.name=fedwad", "silos=4"])
    assert [j.key for j in pair_jobs(cfg.strategy, cfg.silos)] == ["0>1", "0>2", "0>3", "1>2", "1>3", "2>3"]
    params = fedwad_params(cfg.strategy, run_facts(cfg))
    assert params.dim == 28 * 28 and params.max_support == 128 and params.p == 2
    emb = load_config("configs/digits.yaml", ["strategy.name=fedwad", "strategy.space=embedding"])
    assert fedwad_params(emb.strategy, run_facts(emb)).dim == 128


@pytest.mark.parametrize(
    "override,field",
    [
        ("strategy.clusters=9", "strategy.clusters"),
        ("strategy.p=3", "strategy.p"),
        ("strategy.support=500", "strategy.support"),
        ("strategy.iterations=0", "strategy.iterations"),
    ],
)
def test_config_errors(override, field):
    with pytest.raises(ConfigError) as err:
        load_config("configs/digits.yaml", ["strategy.name=fedwad", override])
    assert str(err.value).startswith(field + ":")
