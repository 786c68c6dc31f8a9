"""The quick start's clusters hold whatever secret projections R the pairs draw.

With ephemeral pair keys (the default) only the pairs' R differ between two runs of one config:
training, samples, τ and each silo's noise are functions of the seed. One simulated run of the
quick start's first round with ephemeral keys, then its clustering round replayed from the same
trained silos (benchmarks/projection_variance.py) for more fresh secrets: every one finds the
four rotations, and the rule's cut lies at least MARGIN noise units from both the closest pair
of rotations and the loosest pair inside one (docs/methods/emdcfl-projection.md, "The projection R", has the
study over many draws this margin comes from).
"""

import numpy as np
import pytest
from jobs import PROJECT_ROOT, simulate_job
from sklearn.metrics import adjusted_rand_score

from benchmarks.projection_variance import random_pair_seeds, replay_w, trained_silos
from cfl_mpi.clustering.extraction import robust_clusters
from cfl_mpi.config import load_config

pytestmark = pytest.mark.job

MARGIN = 0.5  # noise units; the worst of 200 replayed draws was 1.1 (the study in docs/methods/emdcfl-projection.md)
DRAWS = 8


def test_quick_start_clusters_hold_for_fresh_secret_projections(tmp_path):
    whole = "strategy.match_classes=false"  # the replay measures the whole samples' W
    summary, records = simulate_job("configs/digits.yaml", tmp_path, "train.rounds=1", whole)
    cut = summary["extraction"]["threshold"]
    assert records[0]["ari"] == 1.0
    assert summary["extraction"]["min_between"] - cut >= MARGIN
    assert cut - summary["extraction"]["max_within"] >= MARGIN

    cfg = load_config(PROJECT_ROOT / "configs/digits.yaml", ["train.rounds=1", whole])
    silos = trained_silos(cfg)
    noise = np.array([silo.noise for silo in silos])
    # the replay's silos are the run's: the same τ and noise to the bit (neither depends on R)
    np.testing.assert_array_equal(noise, np.load(tmp_path / "noise.npy"))
    np.testing.assert_array_equal([silo.tau for silo in silos], np.load(tmp_path / "tau.npy"))

    truth, rng = cfg.data.true_clusters(cfg.silos), np.random.default_rng(2026)
    for _ in range(DRAWS):
        labels, report = robust_clusters(replay_w(cfg, silos, random_pair_seeds(cfg, rng)), noise, noise_multiple=cut)
        assert adjusted_rand_score(truth, labels) == 1.0
        assert report.min_between - cut >= MARGIN and cut - report.max_within >= MARGIN
