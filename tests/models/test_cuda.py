"""On a CUDA device: every silo trains, embeds and evaluates on the GPU with its sets already
there, several silos share one GPU, the server stays on the CPU. Skips without CUDA."""

from __future__ import annotations

import json

import pytest
import torch
from jobs import run_job, run_mpi, simulate_job

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"),
]

CONFIG = "configs/digits.yaml"
SMALL = [
    "silos=4",
    "data.rotations=[0, 90]",
    "model.channels=[16, 32]",
    "model.embedding_dim=32",
    "train.local_epochs=1",
    "train.rounds=2",
]


def test_simulated_silos_share_the_gpu_for_training_embedding_and_evaluation(tmp_path, monkeypatch):
    import cfl_mpi.training.local as training

    seen: list[tuple[str, str, str]] = []

    def spy(name):
        original = getattr(training, name)

        def wrapped(module, x, *args, **kwargs):
            seen.append((name, next(module.parameters()).device.type, training.tensor(x).device.type))
            return original(module, x, *args, **kwargs)

        return wrapped

    for name in ("train_local", "evaluate", "embed"):
        monkeypatch.setattr(training, name, spy(name))
    # one by one: on a GPU `auto` trains and evaluates a process's silos as one batched call,
    # which the quick start and the 41-rank job of the GPU check cover
    summary, records = simulate_job(CONFIG, tmp_path / "sim", *SMALL, "runtime.silo_training=one_by_one")
    assert len(records) == 2  # where the work ran, not how well it clusters (CUDA's sums are not the CPU's)
    assert {name for name, _, _ in seen} == {"train_local", "evaluate", "embed"}
    # the model on the GPU; the training and test sets moved there once (embedding samples are cut per call)
    assert all(model == "cuda" for _, model, _ in seen)
    assert all(data == "cuda" for name, _, data in seen if name != "embed")


def test_mpi_silo_ranks_take_the_gpu_and_the_server_does_not(tmp_path):
    proc = run_mpi(3, ["-m", "cfl_mpi.backends.mpi.placement"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.strip().splitlines()[-1])
    count = torch.cuda.device_count()
    assert [r["cuda_index"] for r in ranks] == [-1, 0, 1 % count]
    # two ranks of two silos each, sharing the GPU(s) of the node
    proc, summary, records = run_job(CONFIG, tmp_path / "mpi", *SMALL, "runtime.silos_per_rank=2", n=3)
    assert summary["ari"] == 1.0 and [r["round"] for r in records] == [1, 2]
    assert [d.split(" ")[0] for d in summary["devices"]] == ["cuda:0", f"cuda:{1 % count}"]
    gpus = "on 1 GPU (" if count == 1 else "on 2 GPUs ("
    assert proc.stdout.splitlines()[0].startswith(f"digits: emdcfl, 4 silos on 2 ranks (up to 2 per rank) {gpus}")
