"""Real-cluster behaviour: an MPI job stopped by SIGTERM or Ctrl-C and resumed equals the
uninterrupted run; a failing or silent silo ends the job cleanly with the last checkpoint
intact (MPI and simulator); partial participation and late silos cluster correctly
(simulated in-process: the backends agree, test_backends.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from jobs import PROJECT_ROOT, failure_of, mpirun, run_job, simulate_job
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.backends.simulate import simulate
from cfl_mpi.config import load_config
from cfl_mpi.runtime.checkpoint import load_checkpoint
from cfl_mpi.runtime.parties import PartyFailure

DIGITS = "configs/digits.yaml"
# 4 silos (one per rotation), small CNN, one local epoch: ~1 min per job on 2 cores.
FOUR = ["silos=4", "model.channels=[16,32]", "train.local_epochs=1", "strategy.pair_keys=seeded"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def start_job(out: Path, *overrides: str, n: int = 5, resume: bool = False) -> subprocess.Popen:
    sets = [a for o in overrides for a in ("--set", o)]
    where = ["--resume", str(out)] if resume else ["--out", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [mpirun(), "-n", str(n), sys.executable, "-m", "cfl_mpi.main", DIGITS, *where, *sets],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group, as a terminal gives a job


def rank_pids(out: Path) -> list[int]:
    """The job's Python ranks (not mpiexec): what `srun --signal` would signal."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].decode(errors="replace") == sys.executable and str(out).encode() in argv:
            pids.append(int(proc.name))
    return pids


def wait_for_rounds(job: subprocess.Popen, out: Path, rounds: int) -> None:
    """Until metrics.jsonl holds `rounds` rounds (the job still running)."""
    deadline = time.monotonic() + 600
    while not (out / "metrics.jsonl").exists() or len(records(out)) < rounds:
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.2)


@pytest.mark.mpi
def test_sigterm_and_ctrl_c_stop_after_a_checkpoint_and_resume_equals_the_uninterrupted_run(tmp_path):
    """Stopped by SLURM's SIGTERM, resumed, stopped by a Ctrl-C, resumed: the uninterrupted run."""
    settings = [*FOUR, "train.rounds=6"]  # SIGTERM stops after round 2 or 3, Ctrl-C one or two later
    _, full_summary, full = run_job(DIGITS, tmp_path / "full", *settings, n=3)  # 2 silos a rank

    out = tmp_path / "stopped"
    job = start_job(out, *settings, n=3)
    wait_for_rounds(job, out, 1)
    for pid in rank_pids(out):  # during round 2: every rank gets it, as from SLURM
        os.kill(pid, signal.SIGTERM)
    stdout, stderr = job.communicate(timeout=600)
    assert job.returncode == 0, stderr[-3000:]
    stopped_after = load_checkpoint(out).round
    assert 2 <= stopped_after < 4 and f"stopped after round {stopped_after} (SIGTERM)" in stdout
    assert len(records(out)) == stopped_after and not (out / "summary.json").exists()

    # Ctrl-C in a terminal: SIGINT to mpiexec's process group; mpiexec passes it on to every rank
    resumed = start_job(out, *settings, n=3, resume=True)
    wait_for_rounds(resumed, out, stopped_after + 1)
    os.killpg(resumed.pid, signal.SIGINT)
    stdout, stderr = resumed.communicate(timeout=600)
    interrupted_after = load_checkpoint(out).round
    assert resumed.returncode == 130, stderr[-3000:]
    assert stopped_after < interrupted_after < 6 and "Traceback" not in stdout + stderr
    assert "Ctrl-C: stopping after the round in progress" in stdout
    assert f"stopped after round {interrupted_after} (SIGINT); continue with --resume {out}" in stdout

    resumed = start_job(out, *settings, n=3, resume=True)
    stdout, stderr = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stderr[-3000:]
    assert f"resuming {out} after round {interrupted_after}" in stdout
    summary, again = json.loads((out / "summary.json").read_text()), records(out)
    assert [r["round"] for r in again] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(full, again):
        assert a["clusters"] == b["clusters"] and a["participants"] == b["participants"]
        assert a["accuracy"] == b["accuracy"]
    assert summary["resumed_after_round"] == interrupted_after
    for key in ("ari", "avg_acc", "worst_acc", "n_clusters"):
        assert summary[key] == full_summary[key]
    np.testing.assert_array_equal(np.load(out / "W.npy"), np.load(tmp_path / "full" / "W.npy"))
    ckpt = load_checkpoint(out)
    assert ckpt.round == 6 and len(ckpt.models) == 4  # one model per cluster
    assert all(r["checkpoint"]["bytes"] > 0 for r in again[interrupted_after:])  # the last process's rounds


def _failing_job(out: Path, *overrides: str, n: int = 5) -> tuple[int, str, float]:
    """Run a job that must fail in round 2; returns (exit code, the results folder's
    failure.txt, seconds from the checkpoint of round 1 — the failing silo fails right after
    it — to mpirun's exit). Not stderr: what a rank writes just before MPI_Abort may never
    reach mpirun (CI lost it once, results.record_failure)."""
    job = start_job(out, *FOUR, "strategy.name=fedavg", "train.rounds=3", *overrides, n=n)
    stdout, stderr = job.communicate(timeout=600)
    exited = time.time()
    print(f"exit code {job.returncode}; the job's output:\n{stdout[-2000:]}\n{stderr[-4000:]}")  # shown on failure
    index = out / "checkpoint" / "index.json"
    return job.returncode, failure_of(out), exited - index.stat().st_mtime if index.exists() else float("nan")


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,rank", [(5, 3), (3, 2)], ids=["one_silo_per_rank", "two_silos_per_rank"])
def test_a_silo_that_raises_ends_the_job_within_seconds_and_the_checkpoint_survives(tmp_path, ranks, rank):
    out = tmp_path / "crash"
    code, failure, to_exit = _failing_job(out, "runtime.fault={silo: 2, round: 2}", n=ranks)
    assert code != 0
    assert f"rank {rank} (silo 2) failed: InjectedFault: silo 2 fails in round 2" in failure
    print(f"checkpoint of round 1 to job exit (the silo fails in between): {to_exit:.2f} s")
    assert to_exit < 15, f"{to_exit:.1f} s from the failure to the job's exit"
    ckpt = load_checkpoint(out)
    assert ckpt.round == 1 and len(ckpt.meta["records"]) == 1
    assert not (out / "summary.json").exists()


@pytest.mark.mpi
def test_a_silent_silo_is_caught_by_the_message_timeout(tmp_path):
    out = tmp_path / "hang"
    code, failure, _ = _failing_job(
        out, "runtime.fault={silo: 1, round: 2, kind: hang}", "runtime.message_timeout_s=20"
    )
    assert code != 0
    assert failure.startswith(
        "cfl_mpi: rank 0 (server) failed: PeerTimeout: the server (rank 0): "
        "waited 20 s for a message from silo 1 (rank 2)"
    ), failure
    assert load_checkpoint(out).round == 1


@pytest.mark.job
@pytest.mark.parametrize(
    "kind,words",
    [
        ("raise", "InjectedFault: silo 2 fails in round 2"),
        ("exit", "InjectedExit: silo 2 exits without a word in round 2"),
    ],
)
def test_the_simulator_names_a_failing_silo_and_stops_every_party(tmp_path, kind, words):
    cfg = load_config(
        PROJECT_ROOT / DIGITS,
        [
            *FOUR,
            "strategy.name=fedavg",
            "train.rounds=3",
            f"runtime.fault={{silo: 2, round: 2, kind: {kind}}}",
            f"out={tmp_path}",
        ],
    )
    start = time.monotonic()
    with pytest.raises(PartyFailure, match=f"silo 2 failed: {words}"):
        simulate(cfg)
    assert time.monotonic() - start < 120 and load_checkpoint(tmp_path).round == 1


@pytest.mark.job
def test_stop_after_round_checkpoints_and_a_resume_finishes_the_run(tmp_path):
    """A long run in pieces (runtime.stop_after_round, not part of the experiment): the first
    piece stops after its round with the checkpoint and no summary, the resume plays the rest."""
    settings = [*FOUR, "strategy.name=fedavg", "train.rounds=3", f"out={tmp_path}"]
    cfg = load_config(PROJECT_ROOT / DIGITS, [*settings, "runtime.stop_after_round=2"])
    assert simulate(cfg) is None
    assert load_checkpoint(tmp_path).round == 2 and len(records(tmp_path)) == 2
    assert not (tmp_path / "summary.json").exists()
    summary = simulate(load_config(PROJECT_ROOT / DIGITS, settings), resume=True)
    assert summary is not None and summary["resumed_after_round"] == 2
    assert [r["round"] for r in records(tmp_path)] == [1, 2, 3]


@pytest.mark.job
def test_half_participation_measures_co_sampled_pairs_and_reaches_ari_one(tmp_path):
    """Appendix E.4: 4 of 8 silos train per round; a pair is measured the first round both
    train. With two rotations (four silos each) every silo is linked to its cluster within
    a few rounds: the run's seed draws the participants, the test checks the outcome."""
    out = tmp_path / "half"
    summary, recs = simulate_job(
        DIGITS,
        out,
        "participation.fraction=0.5",
        "data.rotations=[0,90]",
        "train.rounds=4",
        "train.local_epochs=1",
        "strategy.pair_keys=seeded",
        "model.channels=[16,32]",
    )
    W = np.load(out / "W.npy")
    together = np.eye(8, dtype=bool)
    for r in recs:
        assert len(r["participants"]) == 4 and len(r["accuracy"]) == 8 and None not in r["accuracy"]
        together[np.ix_(r["participants"], r["participants"])] = True
    np.testing.assert_array_equal(np.isfinite(W), together)  # measured iff once trained together
    assert len({tuple(r["participants"]) for r in recs}) > 1
    assert [r["ari"] for r in recs][-1] == 1.0 and summary["ari"] == 1.0
    assert recs[0]["bytes"]["embeddings"] > 0


@pytest.mark.job
def test_a_late_silo_lands_in_its_true_cluster_and_nobody_moves(tmp_path):
    out = tmp_path / "late"
    summary, recs = simulate_job(
        DIGITS,
        out,
        "late_silos=[{silo: 5, round: 3}]",
        "train.rounds=3",
        "train.local_epochs=1",
        "strategy.pair_keys=seeded",
        "model.channels=[16,32]",
    )
    truth_of = json.loads((out / "clusters.json").read_text())["truth"]
    truth = np.array([truth_of[str(c)] for c in range(8)])
    others = [c for c in range(8) if c != 5]
    for r in recs[:2]:
        assert r["accuracy"][5] is None and 5 not in r["participants"]
        assert adjusted_rand_score(truth[others], np.array(r["clusters"])[others]) == 1.0
    before, after = np.array(recs[1]["clusters"]), np.array(recs[2]["clusters"])
    assert adjusted_rand_score(before[others], after[others]) == 1.0  # nobody else moved
    mates = [c for c in others if truth[c] == truth[5]]
    assert all(after[c] == after[5] for c in mates) and recs[2]["accuracy"][5] is not None
    assert summary["ari"] == 1.0
