"""One protocol, three backends: every strategy gives the same clusters, per-silo metrics and
pairwise matrices, bit for bit, in the in-process simulator, in an MPI job with one silo per
rank, and in an MPI job whose ranks host several silos (messages between co-located silos
stay in the process)."""

import json

import numpy as np
import pytest
from jobs import run_job, simulate_job

pytestmark = pytest.mark.mpi

DIGITS = "configs/digits.yaml"
# 4 silos in two rotations, 2 rounds of one epoch of a slim CNN: every exchange of every
# strategy happens, at the least cost. Seeded pair keys make EMD-CFL's projections reproducible.
SMALL = ["silos=4", "data.rotations=[0,180]", "train.rounds=2", "train.local_epochs=1", "model.channels=[16,32]"]
STRATEGIES = {
    "emdcfl": ["strategy.pair_keys=seeded"],
    "emdcfl_fedwad": [
        "strategy.pair_keys=seeded",
        "strategy.distance=fedwad",
        "strategy.ground_cost=chordal",
        "strategy.fedwad_iterations=5",
    ],
    "pacfl": ["strategy.name=pacfl"],
    "cfl": ["strategy.name=cfl", "strategy.warmup_rounds=1", "strategy.eps1=10", "strategy.eps2=1"],
    "ifca": ["strategy.name=ifca"],
    "fedwad": ["strategy.name=fedwad", "strategy.iterations=5"],
    "fedavg": ["strategy.name=fedavg"],
    "oracle": ["strategy.name=oracle"],
}
MATRICES = ("W", "tau", "noise", "A", "S", "losses", "D")
TO_SEVERAL = ("handshake", "embedding_model", "model")  # sent by isend_all


def outcome(out, records):
    """What must not depend on the backend: clusters and accuracies per round, and the matrices."""
    matrices = {name: np.load(out / f"{name}.npy") for name in MATRICES if (out / f"{name}.npy").exists()}
    per_round = [(r["clusters"], r["accuracy"], r.get("participants")) for r in records]
    return per_round, matrices, json.loads((out / "clusters.json").read_text())


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_simulator_and_mpi_with_one_or_several_silos_per_rank_agree(strategy, tmp_path):
    sets = [*SMALL, *STRATEGIES[strategy]]
    _, simulated = simulate_job(DIGITS, tmp_path / "simulated", *sets)
    _, _, one_per_rank = run_job(DIGITS, tmp_path / "one_per_rank", *sets, n=5)
    _, _, two_per_rank = run_job(DIGITS, tmp_path / "two_per_rank", *sets, n=3)
    reference = outcome(tmp_path / "simulated", simulated)
    assert reference[1] or strategy in ("fedavg", "oracle")
    for name, records in (("one_per_rank", one_per_rank), ("two_per_rank", two_per_rank)):
        per_round, matrices, clusters = outcome(tmp_path / name, records)
        assert per_round == reference[0] and clusters == reference[2], name
        assert matrices.keys() == reference[1].keys()
        for key, matrix in matrices.items():
            np.testing.assert_array_equal(matrix, reference[1][key], err_msg=f"{name}: {key}")
    # the message kinds each strategy declared are the ones counted, the same in every backend;
    # a message to several parties (isend_all) counts once per receiving process
    assert one_per_rank[0]["bytes"].keys() == simulated[0]["bytes"].keys() == two_per_rank[0]["bytes"].keys()
    for kind, sent in one_per_rank[0]["bytes"].items():
        if kind in TO_SEVERAL and sent:
            assert sent >= two_per_rank[0]["bytes"][kind] >= simulated[0]["bytes"][kind] > 0, kind
        else:
            assert sent == two_per_rank[0]["bytes"][kind] == simulated[0]["bytes"][kind], kind
