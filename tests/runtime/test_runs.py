"""End-to-end on small configs, asserting on the results they write: the README's own MPI job
(results folder, message accounting, idle waiting, rank-count errors, failures), and
in-process simulations for what depends only on the algorithms (test_backends.py shows
the backends agree).

The MPI job is started once per module (a fixture) and serves several assertions, because
every rank pays for importing torch.
"""

import json
import time

import numpy as np
import pytest
from jobs import assert_same_results, failure_of, run_job, run_mpi, run_results, run_sockets, simulate_job

DIGITS = "configs/digits.yaml"
# Seeded pair keys: the projections R, and so W, are reproducible (README, determinism).
ROUNDS = "train.rounds=3"
SEEDED = "strategy.pair_keys=seeded"


@pytest.fixture(scope="module")
def emdcfl8(tmp_path_factory):
    out = tmp_path_factory.mktemp("emdcfl8")
    return out, *run_job(DIGITS, out, ROUNDS, SEEDED)


@pytest.fixture(scope="module")
def oracle8(tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle8")
    return out, *simulate_job(DIGITS, out, ROUNDS, "strategy.name=oracle")


@pytest.mark.mpi
def test_emdcfl_finds_the_rotations_after_round_1(emdcfl8):
    out, proc, summary, records = emdcfl8
    assert records[0]["ari"] == 1.0 and records[0]["n_clusters"] == 4
    assert summary["ari"] == 1.0 and summary["strategy"] == "emdcfl"
    assert "round 1/3" in proc.stdout and "round 3/3" in proc.stdout


@pytest.mark.mpi
def test_the_sockets_backend_gives_the_mpi_jobs_results_bit_for_bit(emdcfl8, tmp_path):
    """The job runner on a backend of local sockets (cfl_mpi/backends/sockets.py), the README's job on 3
    processes (4 silos each): the MPI job's clusters, accuracies, W, τ and noise, bit for bit."""
    out = emdcfl8[0]
    proc = run_sockets(3, [DIGITS, "--out", str(tmp_path), "--set", ROUNDS, "--set", SEEDED])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].startswith("digits: emdcfl, 8 silos on 2 processes (up to 4 per process) on ")
    assert_same_results(run_results(tmp_path), run_results(out))
    for name in ("tau", "noise"):
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), np.load(out / f"{name}.npy"), err_msg=name)


@pytest.mark.mpi
def test_a_process_of_the_sockets_backend_that_dies_ends_the_job_naming_it(tmp_path):
    sets = ["silos=2", "data.rotations=[0,180]", "train.rounds=2", "model.channels=[8,16]", "runtime.fault.silo=1"]
    sets += ["runtime.fault.round=1", "runtime.fault.kind=exit", "strategy.name=fedavg"]
    started = time.monotonic()
    proc = run_sockets(3, [DIGITS, "--out", str(tmp_path), *(a for s in sets for a in ("--set", s))], timeout=300)
    assert proc.returncode != 0 and time.monotonic() - started < 120
    assert "process 2 is lost: its connection closed" in failure_of(tmp_path), proc.stderr[-2000:]


@pytest.mark.mpi
def test_the_first_line_says_where_the_silos_compute(emdcfl8):
    """Each silo rank reports its device at start: the console sums them up, summary.json lists them."""
    _, proc, summary, _ = emdcfl8
    devices = summary["devices"]
    assert len(devices) == 8 and all(d == "cpu" or d.startswith("cuda:") for d in devices)
    where = "on the CPU" if devices == ["cpu"] * 8 else "on "
    assert proc.stdout.splitlines()[0].startswith(f"digits: emdcfl, 8 silos on 8 ranks (one per rank) {where}")


@pytest.mark.mpi
def test_results_folder_is_complete(emdcfl8):
    out, _, summary, records = emdcfl8
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "clusters.json",
        "W.npy",
        "W.csv",
        "tau.npy",
        "tau.csv",
        "distances.png",
        "accuracy.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert {"strategy", "rounds", "n_clusters", "ari", "avg_acc", "worst_acc", "wall_s"} <= set(summary)
    W = np.load(out / "W.npy")
    assert W.shape == (8, 8) and np.isfinite(W).all()
    clusters = json.loads((out / "clusters.json").read_text())
    assert [clusters["clusters"][str(s)] for s in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    first = records[0]
    assert len(first["accuracy"]) == 8 and set(first["seconds"]) >= {"train", "clustering", "aggregation"}


@pytest.mark.mpi
def test_message_accounting(emdcfl8):
    _, _, _, records = emdcfl8
    first, later = records[0]["bytes"], records[1]["bytes"]
    # Round 1 carries the clustering traffic, later rounds only models and updates (one-shot).
    assert first["handshake"] > 0 and first["embedding_model"] > 0 and first["embeddings"] > 0
    assert later["handshake"] == later["embedding_model"] == later["embeddings"] == 0
    assert later["update"] > 0 and later["model"] > 0
    # one silo per rank: each sends its ω once to each of the 7 other ranks, 56 equal transfers.
    assert first["embedding_model"] % 56 == 0


@pytest.mark.mpi
def test_waiting_ranks_do_not_spin(emdcfl8):
    _, _, _, records = emdcfl8
    assert records[-1]["wait_cpu_fraction"]["server"] < 0.2
    assert records[-1]["wait_cpu_fraction"]["silos"] < 0.2


@pytest.mark.mpi
def test_emdcfl_accuracy_matches_the_oracle(emdcfl8, oracle8):
    _, _, emd, _ = emdcfl8
    _, oracle, records = oracle8
    assert oracle["ari"] == 1.0 and records[0]["n_clusters"] == 4
    assert abs(emd["avg_acc"] - oracle["avg_acc"]) <= 0.01
    print(f"wall time emdcfl / oracle = {emd['wall_s'] / oracle['wall_s']:.2f}")


@pytest.mark.mpi
def test_same_seed_same_clusters_and_metrics(emdcfl8, tmp_path):
    """Rerun by the simulator for its first round, where the clustering happens (whole runs
    agree bit for bit across backends in test_backends.py)."""
    _, _, _, first = emdcfl8
    _, again = simulate_job(DIGITS, tmp_path, "train.rounds=1", SEEDED)
    assert (again[0]["clusters"], again[0]["accuracy"]) == (first[0]["clusters"], first[0]["accuracy"])


@pytest.mark.job
def test_fedavg_is_one_cluster(tmp_path):
    summary, records = simulate_job(DIGITS, tmp_path, "train.rounds=1", "strategy.name=fedavg")
    assert all(r["n_clusters"] == 1 for r in records) and summary["n_clusters"] == 1


@pytest.mark.job
def test_four_silos(tmp_path):
    # One silo per rotation, a narrow CNN: measured (seeds 0 and 1) the closest pair of silos
    # 16.3 and 17.9 noise units apart against a cut of 3.5 (15.6 with the quick start's CNN),
    # and each silo then trains alone, as the oracle's: the same accuracy to the bit.
    narrow = "model.channels=[16,32]"
    emd, records = simulate_job(DIGITS, tmp_path / "emd", "silos=4", narrow, ROUNDS, SEEDED)
    oracle, _ = simulate_job(DIGITS, tmp_path / "oracle", "silos=4", narrow, ROUNDS, "strategy.name=oracle")
    assert records[0]["ari"] == 1.0 and emd["n_clusters"] == 4
    assert abs(emd["avg_acc"] - oracle["avg_acc"]) <= 0.01


@pytest.mark.mpi
def test_wrong_rank_count_fails_fast_with_exit_2():
    start = time.monotonic()
    proc = run_mpi(5, ["-m", "cfl_mpi.main", DIGITS, "--set", "runtime.silos_per_rank=1"], timeout=120)
    assert proc.returncode == 2
    assert "config error: runtime.silos_per_rank:" in proc.stderr and "mpirun -n 9" in proc.stderr
    assert proc.stderr.count("config error") == 1  # one line, not one per rank
    assert time.monotonic() - start < 60


@pytest.mark.mpi
def test_a_failing_rank_ends_the_job_with_its_name(tmp_path):
    # A timeout far below the time to start a silo makes some rank fail for real.
    start = time.monotonic()
    proc = run_mpi(
        3,
        [
            "-m",
            "cfl_mpi.main",
            DIGITS,
            "--out",
            str(tmp_path),
            "--set",
            "silos=2",
            "--set",
            "data.rotations=[0,180]",
            "--set",
            "runtime.message_timeout_s=0.01",
        ],
        timeout=300,
    )
    assert proc.returncode != 0
    failure = failure_of(tmp_path)
    assert "failed: PeerTimeout" in failure and ("(server)" in failure or "(silo " in failure), proc.stderr[-3000:]
    assert time.monotonic() - start < 120
