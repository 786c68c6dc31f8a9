"""EMD-CFL in FedWaD mode (`distance: fedwad`) on 8 silos: the clusters of the direct mode,
and not one byte of projected embeddings reaches the server. (Simulated in-process; the same
exchange over MPI is in test_backends.py.)

configs/digits_fedwad.yaml is configs/digits.yaml with distance fedwad and ground cost
chordal. The direct mode's clusters on the same data and seed are [0, 0, 1, 1, 2, 2, 3, 3] after
round 1 (test_runs.py::test_results_folder_is_complete); the README reports how far the
two modes' W matrices differ.
"""

import numpy as np
import pytest
from jobs import simulate_job

pytestmark = pytest.mark.job


@pytest.fixture(scope="module")
def fedwad8(tmp_path_factory):
    out = tmp_path_factory.mktemp("fedwad8")
    return out, *simulate_job("configs/digits_fedwad.yaml", out, "train.rounds=1", "strategy.pair_keys=seeded")


def test_fedwad_mode_finds_the_direct_modes_clusters(fedwad8):
    out, summary, records = fedwad8
    assert records[0]["clusters"] == [0, 0, 1, 1, 2, 2, 3, 3] and records[0]["ari"] == 1.0
    assert summary["extraction"]["rule"] == "robust" and summary["extraction"]["noise_source"] == "measured"
    W = np.load(out / "W.npy")
    assert W.shape == (8, 8) and np.isfinite(W).all() and np.isfinite(np.load(out / "tau.npy")).all()


def test_server_receives_no_embeddings_in_fedwad_mode(fedwad8):
    _, _, records = fedwad8
    sent = records[0]["bytes"]
    assert sent["embeddings"] == 0
    assert sent["fedwad_measure"] > 0 and sent["fedwad_distance"] > 0
    # The pairs still agree on R and swap ω directly, as in the direct mode: each silo sends its
    # ω to its 7 partners as one message (isend_all), counted once for the one process here.
    assert sent["handshake"] > 0 and sent["embedding_model"] > 0 and sent["embedding_model"] % 8 == 0
