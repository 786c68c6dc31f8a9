"""What an honest-but-curious server can reconstruct from what EMD-CFL sends it.

    python benchmarks/curious_server.py [--config configs/digits.yaml] [--silo 0]

Direct mode: a silo sends Y = Z·R (its sample's embeddings, projected by the pair's secret
R). A server that can rebuild the silo's sample — in a simulated run the data follow from
the config and seed — holds Z = g_ω(x) itself (ω is part of the silo's update), so it solves
Z·R̂ = Y by least squares (numpy.linalg.lstsq). R̂ need not equal R where Z is rank-deficient,
but R̂ un-projects every other message of that pair: we report ‖Z_val·R̂ − Z_val·R‖ / ‖Z_val·R‖
on embeddings the solve never saw.

FedWaD mode: the silo returns ξ_μ(1) with atoms (1 − t)·x_i + t·T(x_i), T(x_i) an atom of
the ξ(0) the server sent (Eq. 10; a permutation when |ξ| = n). Knowing t (it schedules it)
and ξ(0), the server matches the returned atoms to ξ(0) by an assignment and inverts:
x̂_i = (z_i − t·ξ_σ(i)) / (1 − t). Reported: ‖x̂ − x‖ / ‖x‖ for times across the schedule's
range, on projected embeddings and, for FedWaD clustering's `space: input`, on raw images.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from cfl_mpi.config import load_config
from cfl_mpi.ot.fedwad import client_step, gaussian_measure, uniform_measure
from cfl_mpi.privacy.handshake import random_projection
from cfl_mpi.strategies.emdcfl.distances import projected_dim, sample_size
from cfl_mpi.strategies.shared.fedwad_exchange import T_RANGE

ROOT = Path(__file__).resolve().parents[1]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def invert_interpolation(returned: np.ndarray, xi: np.ndarray, t: float) -> np.ndarray:
    """x̂ from the atoms (1 − t)x_i + t·ξ_σ(i): σ is the optimal assignment (squared Euclidean
    cost) of the returned atoms to ξ, since a displacement interpolation keeps the optimal
    matching (McCann 1997); then Eq. 10 solved for x_i."""
    cost = ((returned[:, None, :] - xi[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    return (returned[rows] - t * xi[cols]) / (1.0 - t)


def fedwad_leak(points: np.ndarray, times: list[float], seed: int) -> list[tuple[float, float]]:
    """(t, relative error of the server's reconstruction) for ξ_μ(1) at each t."""
    x = np.asarray(points, dtype=np.float64)
    xi = gaussian_measure(len(x), x.shape[1], np.random.default_rng(seed))
    out = []
    for t in times:
        returned, _ = client_step(uniform_measure(x), xi, t, p=2)  # atoms in x's order, as sent
        out.append((t, rel(invert_interpolation(returned.points, xi.points, t), x)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/digits.yaml")
    parser.add_argument("--silo", type=int, default=0)
    args = parser.parse_args()
    import torch

    from cfl_mpi.models.build import build_model
    from cfl_mpi.training.local import embed

    cfg = load_config(ROOT / args.config, [])
    data = cfg.data.build(args.silo, cfg.data_facts())
    n = sample_size(cfg.strategy.sample_fraction, cfg.strategy.max_rows, len(data.y_train), len(data.y_val))
    rng = np.random.default_rng(cfg.seed)
    model = build_model(cfg.architecture, load_weights=False)
    z = embed(model.embedding, data.x_train[:n], torch.device("cpu")).astype(np.float64)
    z_val = embed(model.embedding, data.x_val, torch.device("cpu")).astype(np.float64)
    r = random_projection(
        rng, z.shape[1], projected_dim(cfg.strategy.proj_ratio, cfg.model.embedding_dim), cfg.strategy.projection
    ).astype(np.float64)
    y = z @ r  # what the silo sends in direct mode
    r_hat = np.linalg.lstsq(z, y, rcond=None)[0]
    print(
        f"# curious server, {args.config}, silo {args.silo}: n = {n} samples, dim(Z) = {z.shape[1]}, "
        f"dim(R) = {r.shape[1]}\n"
    )
    print("| mode | what the server rebuilds | relative error |\n|---|---|---|")
    print(f"| direct | R from Z·R = Y (rank(Z) = {np.linalg.matrix_rank(z)} of {z.shape[1]}) | {rel(r_hat, r):.3g} |")
    print(f"| direct | Z_val·R of {len(z_val)} unseen samples, with R̂ | {rel(z_val @ r_hat, z_val @ r):.3g} |")
    times = list(np.linspace(*T_RANGE, 5))
    for t, err in fedwad_leak(y, times, cfg.seed):
        print(f"| FedWaD | projected embeddings Z·R from ξ_μ(1), t = {t:.2f} | {err:.3g} |")
    images = data.x_train[:n].reshape(n, -1)
    for t, err in fedwad_leak(images, [T_RANGE[0], T_RANGE[1]], cfg.seed):
        print(f"| FedWaD clustering, `space: input` | raw images from ξ_μ(1), t = {t:.2f} | {err:.3g} |")


if __name__ == "__main__":
    main()
