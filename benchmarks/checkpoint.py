"""Size and write time of the server's per-round checkpoint for a config (default: the
paper's rotated MNIST, 40 silos), as the server writes it.

    python benchmarks/checkpoint.py [CONFIG] [--repeats 5] [--out DIR]

Two cases side by side: after clustering (one model per cluster: the silos of a cluster
share it and it is stored once) and the worst case of every silo holding its own model
(e.g. every silo still alone). The EMD-CFL state (W, τ, noise) comes with it. Writes go to
--out (default: a temporary folder; put it on the file system the runs use, e.g. Lustre,
to measure that).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from cfl_mpi.config import config_digest, load_config
from cfl_mpi.runtime.checkpoint import Checkpoint, dedupe_models, save_checkpoint
from cfl_mpi.runtime.halves import server_half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/rotated.yaml")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="folder to write into (default: a temporary folder)")
    args = parser.parse_args()

    import torch

    from cfl_mpi.models.build import build_model, state_arrays

    cfg = load_config(args.config)
    truth = cfg.data.true_clusters(cfg.silos)
    strategy = server_half(cfg)
    rng = np.random.default_rng(0)
    for name in ("W", "tau", "noise"):
        if hasattr(strategy, name):
            getattr(strategy, name)[...] = rng.random(getattr(strategy, name).shape)
    strategy.clusters = truth.copy()
    digest = config_digest(cfg)

    def fresh_model() -> dict[str, np.ndarray]:
        return state_arrays(build_model(cfg.architecture, load_weights=False))

    torch.manual_seed(0)
    per_cluster = {int(k): fresh_model() for k in np.unique(truth)}
    cases = {
        "one model per cluster": [per_cluster[int(k)] for k in truth],
        "one model per silo": [fresh_model() for _ in range(cfg.silos)],
    }
    params = sum(a.size for a in cases["one model per silo"][0].values())
    print(f"{args.config}: {cfg.silos} silos, {cfg.model.name} with {params:,} values, strategy {cfg.strategy.name}\n")
    print(f"| case | models stored | checkpoint MB | write s (best of {args.repeats}) | MB/s |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        for case, per_silo in cases.items():
            models, index = dedupe_models(per_silo)
            arrays, meta = strategy.state_dict()
            best, size = float("inf"), 0
            for r in range(args.repeats):
                start = time.perf_counter()
                size = save_checkpoint(out, Checkpoint(r + 1, models, index, arrays, {"strategy": meta}, digest))
                best = min(best, time.perf_counter() - start)
            print(f"| {case} | {len(models)} | {size / 1e6:.1f} | {best:.3f} | {size / 1e6 / best:.0f} |")


if __name__ == "__main__":
    main()
