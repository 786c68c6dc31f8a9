"""τ at assignment sizes against τ at the clouds' own sizes, on real silos: each sampled silo's
training sample and validation embeddings under θ(0) (its own draws, as in round 1), τ as the
silo takes it now (the larger cloud cut to a multiple of the smaller, LAPJV) and as W1 between
the full clouds (POT's network simplex where the sizes are neither equal nor multiples).

    python -m benchmarks.tau_sizes --mnist DIR [--configs a.yaml,b.yaml] [--silos 8]

Prints, per config, the clouds' sizes and τ now / before − 1 over the silos (mean and range).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CONFIGS = "configs/digits.yaml,configs/rotated_mnist_test.yaml,configs/rotated_mnist_small_silos.yaml"


def tau_change(config: str, mnist: Path, silos: int) -> str:
    import torch

    from cfl_mpi.config import load_config
    from cfl_mpi.models.build import build_model
    from cfl_mpi.privacy.handshake import random_projection
    from cfl_mpi.strategies.emdcfl.distances import pair_distance, projected_dim, sample_size
    from cfl_mpi.strategies.emdcfl.parts import distance_of
    from cfl_mpi.training.local import embed

    torch.manual_seed(0)
    cfg = load_config(config, [f"data.root={mnist}", "data.download=false"])
    s, cpu = cfg.strategy, torch.device("cpu")
    distance = distance_of(s)
    model = build_model(cfg.architecture, load_weights=False)
    change, sizes = [], set()
    for silo in range(0, cfg.silos, max(1, cfg.silos // silos)):
        data = cfg.data.build(silo, cfg.data_facts())
        rng = np.random.default_rng([cfg.seed, 11, silo, 1])
        rows = np.sort(
            rng.choice(
                len(data.y_train), sample_size(s.sample_fraction, s.max_rows, len(data.y_train), len(data.y_val)), False
            )
        )
        z_own = embed(model.embedding, data.x_train[rows], cpu).astype(np.float64)
        z_val = embed(model.embedding, data.x_val[: s.max_rows], cpu).astype(np.float64)
        if s.tau_projection != "none":  # through a projection, as the silo takes τ there
            dim = z_own.shape[1]
            r = random_projection(
                rng, dim, projected_dim(s.proj_ratio, dim) if s.tau_projection == "pair" else dim, s.projection
            )
            z_own, z_val = z_own @ r, z_val @ r
        sizes.add((len(z_own), len(z_val)))
        change.append(distance.tau_between(z_own, z_val) / pair_distance(distance, z_own, z_val) - 1)
    pct = 100 * np.array(change)
    return (
        f"| {config} | {s.tau_projection} | {', '.join(map(str, sorted(sizes)))} | {len(pct)} | "
        f"{pct.mean():+.2f} % | {pct.min():+.2f} … {pct.max():+.2f} % |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, required=True, help="folder of MNIST's files")
    parser.add_argument("--configs", default=CONFIGS)
    parser.add_argument("--silos", type=int, default=8, help="silos sampled per config")
    args = parser.parse_args(argv)
    print("| config | τ space | sizes (n, \\|V\\|) | silos | τ now / before − 1, mean | range |")
    print("|---|---|---|---|---|---|")
    for config in args.configs.split(","):
        print(tau_change(config, args.mnist.resolve(), args.silos), flush=True)


if __name__ == "__main__":
    main()
