"""End-to-end: a short run on a tiny Backdoor CIFAR10 written as real pickled batches.

ResNet18 (at 32×32 to stay small) so that a torchvision model with BatchNorm buffers travels
the wire, and EMD-CFL so that its embedding is swapped between silos.
"""

import json

import pytest
import yaml
from data_files import write_cifar10
from jobs import simulate_job

pytestmark = pytest.mark.job


def test_backdoor_job_reports_backdoor_accuracy(tmp_path):
    root = write_cifar10(tmp_path / "cifar", per_batch=60, n_test=120)
    config = tmp_path / "backdoor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "backdoor_tiny",
                "seed": 0,
                "silos": 3,
                "data": {"name": "backdoor_cifar10", "root": str(root), "download": False},
                "model": {"name": "resnet18", "input_size": 32},
                "train": {"rounds": 2, "local_epochs": 1, "lr": 0.01, "batch_size": 32},
                "strategy": {"name": "emdcfl", "sample_fraction": 0.5},
            }
        )
    )
    out = tmp_path / "out"
    summary, records = simulate_job(str(config), out)
    assert [r["round"] for r in records] == [1, 2]
    for record in records:
        target, backdoored, other = record["backdoor_acc"]  # one silo per group; silo 0 is the target
        assert backdoored is None and other is None and 0.0 <= target <= 1.0
        assert record["target_backdoor_acc"] == pytest.approx(target, abs=1e-6)
        assert record["target_clean_acc"] == pytest.approx(record["accuracy"][0], abs=1e-6)
    assert records[0]["bytes"]["embedding_model"] > 0  # the ResNet18 embeddings were swapped
    assert summary["target_backdoor_acc"] == pytest.approx(records[-1]["target_backdoor_acc"])
    assert json.loads((out / "clusters.json").read_text())
    print(
        f"backdoor job: target clean acc {records[-1]['target_clean_acc']:.4f}, "
        f"backdoor acc {records[-1]['target_backdoor_acc']:.4f}"
    )
