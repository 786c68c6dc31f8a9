"""`runtime.on_silo_failure: drop` in a first round that needs the silos' answers before any
model is aggregated: FedWaD clustering's pairwise exchange (every pair in round 1) and IFCA's
choice of its first models from the silos' (`init: silos`). A silo that fails there leaves,
is named, and the round completes with the silos left: the others as their two rotations
(ARI 1.0), its update in no cluster."""

from __future__ import annotations

import time

import numpy as np
import pytest
from jobs import run_job, simulate_job

CONFIG = "configs/digits.yaml"
# 8 silos in two rotation clusters of 4 (silos 0-3 at 0°, 4-7 at 90°), two quick rounds
SMALL = ["silos=8", "data.rotations=[0, 90]", "train.rounds=2", "train.local_epochs=3", "model.channels=[16, 32]"]
# FedWaD on 64 points per silo, 10 iterations: measured D 16.0-19.1 within a rotation, 36.7-39.0 between
FEDWAD = ["strategy.name=fedwad", "strategy.sample_cap=64", "strategy.iterations=10"]
OTHERS = [c for c in range(8) if c != 3]


def failing(silo: int, kind: str) -> list[str]:
    return ["runtime.on_silo_failure=drop", f"runtime.fault.silo={silo}", "runtime.fault.round=1",
            f"runtime.fault.kind={kind}"]  # fmt: skip


def assert_left_and_named(out, summary: dict, records: list[dict], silo: int, why: str) -> None:
    """The run completed both rounds without `silo`, and names it where a dropped silo is named."""
    (left,) = records[0]["dropped"]
    assert (left["silo"], left["round"]) == (silo, 1) and left["why"].startswith(why)
    assert summary["rounds"] == 2 and list(summary["dropped"]) == [str(silo)] and records[1]["dropped"] == []
    assert all(r["accuracy"][silo] is None for r in records)
    assert f"round 1: dropped silo {silo}, which left the federation: {why}" in (out / "failure.txt").read_text()


@pytest.fixture(scope="module")
def fedwad_left(tmp_path_factory) -> tuple:
    """FedWaD clustering where silo 3 fails as round 1 starts, simulated: (folder, summary,
    records)."""
    from jobs import require_slow_marker

    require_slow_marker("the simulated FedWaD run")
    out = tmp_path_factory.mktemp("fedwad_left")
    start = time.monotonic()
    summary, records = simulate_job(CONFIG, out, *SMALL, *FEDWAD, *failing(3, "raise"))
    print(f"FedWaD clustering, silo 3 leaving: {time.monotonic() - start:.1f} s")
    return out, summary, records


@pytest.mark.job
def test_fedwad_clustering_goes_on_without_a_silo_that_leaves_in_its_exchange(fedwad_left):
    """Silo 3 fails as round 1 starts: the server takes its `Leave` in place of its first FedWaD
    reply, its partners let its jobs go, and the seven others are measured and clustered."""
    out, summary, records = fedwad_left
    assert_left_and_named(out, summary, records, 3, "InjectedFault: silo 3 fails in round 1")
    assert [r["ari"] for r in records] == [1.0, 1.0] and records[-1]["n_clusters"] == 2  # over the seven
    assert records[-1]["clusters"] == [0, 0, 0, 1, 2, 2, 2, 2]  # silo 3 alone
    D = np.load(out / "D.npy")
    assert np.isnan(np.delete(D[3], 3)).all() and np.isnan(np.delete(D[:, 3], 3)).all()
    within = [D[a, b] for a in OTHERS for b in OTHERS if a < b and (a < 4) == (b < 4)]
    between = [D[a, b] for a in OTHERS for b in OTHERS if (a < 4) != (b < 4)]
    print(f"D within a rotation {min(within):.1f}-{max(within):.1f}, between {min(between):.1f}-{max(between):.1f}")
    assert max(within) < 0.6 * min(between)  # the clusters are far from a decision boundary
    assert records[0]["bytes"]["fedwad_measure"] > 0


@pytest.mark.mpi
def test_under_mpirun_the_fedwad_exchange_goes_on_without_it_as_in_the_simulator(tmp_path, fedwad_left):
    """mpirun -n 5: silo 3 shares rank 2 with silo 2, which goes on; its `Leave` reaches the
    server over MPI in the middle of the exchange, and the run equals the simulator's bit for bit."""
    start = time.monotonic()
    proc, _, records = run_job(CONFIG, tmp_path, *SMALL, *FEDWAD, *failing(3, "raise"), n=5)
    print(f"under mpirun -n 5: {time.monotonic() - start:.1f} s")
    _, _, simulated = fedwad_left
    for key in ("clusters", "accuracy", "ari"):
        assert [r[key] for r in records] == [r[key] for r in simulated], key
    np.testing.assert_array_equal(np.load(tmp_path / "D.npy"), np.load(fedwad_left[0] / "D.npy"))
    assert "round 1: dropped silo 3 (rank 2), which left the federation" in (tmp_path / "failure.txt").read_text()


def ifca_leaving_after_its_update(out, silo: int) -> list[dict]:
    """IFCA `init: silos` where `silo` fails once its round-1 update has left, where the server
    awaits its loss on the first seed candidate: it is named, is not a seed, and the others
    form their two rotations by round 2; the records."""
    start = time.monotonic()
    summary, records = simulate_job(CONFIG, out, *SMALL, "strategy.name=ifca", *failing(silo, "raise_after_update"))
    print(f"IFCA seeding, silo {silo} leaving after its update: {time.monotonic() - start:.1f} s")
    assert_left_and_named(out, summary, records, silo, f"InjectedFault: silo {silo} fails after its update")
    assert silo not in summary["ifca"]["seed_silos"] and len(summary["ifca"]["seed_silos"]) == 2
    assert records[-1]["ari"] == 1.0 and records[-1]["n_clusters"] == 2  # over the seven others
    return records


@pytest.mark.job
def test_ifca_seeding_goes_on_without_a_silo_that_leaves_after_its_update(tmp_path):
    """Silo 3's update joins no cluster and its losses count for nothing: the run equals, bit for
    bit, the one where silo 3 failed in training and never sent its update (both draw silo 7's
    model as the first candidate)."""
    records = ifca_leaving_after_its_update(tmp_path / "after_update", 3)
    _, in_training = simulate_job(CONFIG, tmp_path / "in_training", *SMALL, "strategy.name=ifca",
                                  *failing(3, "raise"))  # fmt: skip
    for key in ("clusters", "accuracy", "ari"):
        assert [r[key] for r in records] == [r[key] for r in in_training], key


@pytest.mark.job
def test_ifca_replaces_a_seed_whose_silo_left(tmp_path):
    """Silo 7's model is the first candidate (drawn from the seed); silo 7 leaves before any
    loss on it came: that candidate counts for nothing, the second is picked without it, and
    the seed is replaced by the model of a silo left (round 1 then holds one cluster of the
    seven, round 2's identity step finds the two rotations)."""
    records = ifca_leaving_after_its_update(tmp_path, 7)
    assert records[0]["n_clusters"] == 1
