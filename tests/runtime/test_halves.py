"""What a strategy half is told: the run's facts, and the true clusters only where its spec
says it sees them (the Oracle)."""

from __future__ import annotations

import numpy as np
import pytest
from config_files import FOUR_SILOS, config_from

from cfl_mpi.runtime.halves import run_facts, server_half
from cfl_mpi.strategies import REGISTRY


@pytest.mark.parametrize("name", list(REGISTRY))
def test_only_the_oracle_is_told_the_true_clusters(tmp_path, name):
    cfg = config_from(tmp_path, FOUR_SILOS, f"strategy.name={name}")
    half = server_half(cfg)
    seen = [
        value
        for value in vars(half).values()
        if isinstance(value, np.ndarray) and np.array_equal(value, cfg.data.true_clusters(cfg.silos))
    ]
    assert REGISTRY[name].sees_truth == (name == "oracle")
    assert ("truth" in vars(half)) == REGISTRY[name].sees_truth
    if not REGISTRY[name].sees_truth:
        assert not seen, f"{name}'s server half holds the true clusters"


def test_the_number_of_true_clusters_is_a_run_fact(tmp_path):
    cfg = config_from(tmp_path, FOUR_SILOS)
    assert run_facts(cfg).true_clusters == len(np.unique(cfg.data.true_clusters(cfg.silos))) == 2
