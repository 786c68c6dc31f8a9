"""The W guard's fixture (tests/strategies/test_emdcfl_reproducible.py): the clusters, W and τ of one
seeded EMD-CFL run, and the machine kind that wrote them.

    python tests/w_guard.py     # rewrite tests/fixtures/w_guard.* from this tree, on this machine

Rewrite it only for a change that is meant to move W, and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "w_guard"
CONFIG = "configs/digits.yaml"
# 6 silos in 3 rotations, one round of one epoch of a slim CNN: every EMD-CFL pair is measured,
# through the paper's Gaussian R (the fixture predates the orthonormal one; the default's W is
# held to a seeded run's by `python -m benchmarks.projection_variance --check-run RUN`).
OVERRIDES = [
    "silos=6",
    "data.rotations=[0,90,180]",
    "train.rounds=1",
    "train.local_epochs=1",
    "model.channels=[16,32]",
    "strategy.pair_keys=seeded",
    "strategy.projection=gaussian",
    "strategy.match_classes=false",  # the whole samples' W, as the paper (the fixture's)
]


def machine_kind() -> dict[str, str]:
    """What float32 training and embedding round off by: the CPU (model and instruction set
    extensions) and the torch and numpy builds."""
    import torch

    cpu = {}
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "flags") and key.strip() not in cpu:
                cpu[key.strip()] = value.strip()
    flags = hashlib.sha256(cpu.get("flags", "").encode()).hexdigest()[:16]
    return {
        "cpu": cpu.get("model name", platform.processor()),
        "cpu_flags_sha256": flags,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }


def write(run: Path) -> None:
    """The fixture from a finished run's results folder."""
    clusters = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["clusters"]
    np.savez(FIXTURE.with_suffix(".npz"), W=np.load(run / "W.npy"), tau=np.load(run / "tau.npy"))
    meta = {"clusters": clusters, "config": CONFIG, "overrides": OVERRIDES, "machine": machine_kind()}
    FIXTURE.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")


def main() -> int:
    from cfl_mpi.backends.simulate import simulate
    from cfl_mpi.config import load_config

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as out:
        simulate(load_config(root / CONFIG, [*OVERRIDES, f"out={out}"]))
        write(Path(out))
    print(f"wrote {FIXTURE}.npz and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
