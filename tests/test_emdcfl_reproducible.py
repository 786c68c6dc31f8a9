"""Speed work must not move W (issue 13): a seeded EMD-CFL run gives the clusters and the W
of the code before it (fixture from commit 703ab81, tests/fixtures/emdcfl_reference/make.py),
and every W1 the server solves equals POT's network simplex on the same embeddings."""
import json
from pathlib import Path

import numpy as np
import ot
import pytest

from cfl_mpi.algorithms.emdcfl import EmdCfl
from cfl_mpi.ot.wasserstein import ground_cost
from jobs import simulate_job

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "emdcfl_reference"


def emd2(x: np.ndarray, y: np.ndarray, metric: str) -> float:
    """The plain reference: POT's exact solver on the full transport plan."""
    n, m = len(x), len(y)
    return float(ot.emd2(np.full(n, 1 / n), np.full(m, 1 / m), ground_cost(x, y, metric), numItermax=10_000_000))


def test_seeded_run_gives_the_reference_clusters_and_w(tmp_path, monkeypatch):
    reference = json.loads((FIXTURE / "reference.json").read_text())
    arrays = np.load(FIXTURE / "reference.npz")
    solved: list[tuple[np.ndarray, np.ndarray, str, float]] = []
    server_w1 = EmdCfl._w1

    def recording_w1(self, x, y):
        value = server_w1(self, x, y)
        solved.append((x, y, self.cfg.strategy.ground_cost, value))
        return value

    monkeypatch.setattr(EmdCfl, "_w1", recording_w1)
    _, records = simulate_job(reference["config"], tmp_path, *reference["overrides"])
    assert records[0]["clusters"] == reference["clusters"]
    np.testing.assert_allclose(np.load(tmp_path / "W.npy"), arrays["W"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.load(tmp_path / "tau.npy"), arrays["tau"], rtol=0, atol=1e-9)
    silos = len(reference["clusters"])
    assert len(solved) == silos * (silos - 1)
    for x, y, metric, value in solved:
        assert value == pytest.approx(emd2(x, y, metric), abs=1e-9)
