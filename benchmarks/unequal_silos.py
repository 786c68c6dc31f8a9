"""Honest silos of unequal size inside one cluster: what the screening decides, former against
current default (in-process: the project's own model, local training and aggregation; no MPI).

    python -m benchmarks.unequal_silos [--mnist DIR] [--rounds 3] [--epochs 1] [--seeds 0,1,2]

Federations of the MNIST training split (or scikit-learn's digits where the files are absent):
quantity skew (8 silos of 30 to 3,000 images, log-spaced, labels IID) and label skew (8 silos
cut by a Dirichlet(α) over each class, α = 0.1, 0.3, 1; sizes follow). Every silo is honest and
trains from the cluster's model each round (simple CNN [32, 64], E epochs of batch 64, the
`train:` defaults' SGD); the cluster aggregates by the default rule. Reported per federation:
the updates the former default (a count above 2 x the cluster median clipped; an update norm
above 4 x the median norm rejected) and the current one touch, and the current bounds' margins
(the largest update over its bound; the smallest rate over the false-claim bound).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from cfl_mpi.aggregation.rules import AggregationConfig, LocalWork, aggregate, update_norm

from .runs import MNIST


def quantity_skew(labels: np.ndarray, rng: np.random.Generator, silos: int = 8) -> list[np.ndarray]:
    sizes = np.geomspace(30, 3000, silos).astype(int)
    order = rng.permutation(len(labels))
    return np.split(order, np.cumsum(sizes))[:-1]


def dirichlet(labels: np.ndarray, rng: np.random.Generator, alpha: float, silos: int = 8, total: int = 4000):
    """Each class's images split across the silos by proportions drawn from Dirichlet(α)."""
    pick = rng.permutation(len(labels))[:total]
    parts: list[list[int]] = [[] for _ in range(silos)]
    for k in np.unique(labels):
        ids = pick[labels[pick] == k]
        cuts = (np.cumsum(rng.dirichlet([alpha] * silos)) * len(ids)).astype(int)[:-1]
        for s, chunk in enumerate(np.split(ids, cuts)):
            parts[s] += chunk.tolist()
    return [np.array(p) for p in parts if len(p) > 0]


def former_decisions(norms: np.ndarray, counts: list[int]) -> list[str]:
    """The former default: count above 2 x the median clipped, norm above 4 x the median rejected."""
    if len(counts) < 3:
        return ["accepted"] * len(counts)
    out = []
    for norm, n in zip(norms, counts):
        if norm > 4 * np.median(norms):
            out.append("rejected")
        else:
            out.append("clipped" if n > 2 * np.median(counts) else "accepted")
    return out


def run(x, y, parts, rounds: int, seed: int, epochs: int):
    import torch

    from cfl_mpi.models.build import load_arrays, state_arrays
    from cfl_mpi.models.simple_cnn import SimpleCNN
    from cfl_mpi.training.local import train_local
    from cfl_mpi.training.params import TrainConfig

    train = TrainConfig(local_epochs=epochs, batch_size=64)
    work: LocalWork = train.work()
    cfg = AggregationConfig()
    counts = [len(p) for p in parts]
    silos, firsts = list(range(len(parts))), dict(enumerate(counts))
    torch.manual_seed(seed)
    net = SimpleCNN(1, 10, x.shape[-1], channels=(32, 64), embedding_dim=128)
    start = {k: v.copy() for k, v in state_arrays(net).items()}
    former, current, upper, claims = [], [], [], []
    for t in range(1, rounds + 1):
        trained = []
        for c, part in enumerate(parts):
            load_arrays(net, start)
            gen = torch.Generator().manual_seed(1000 * seed + 100 * t + c)
            train_local(net, x[part], y[part], train, gen, torch.device("cpu"))
            trained.append({k: v.copy() for k, v in state_arrays(net).items()})
        norms = np.array([update_norm(m, start) for m in trained])
        reach = np.array([work.displacement(n) for n in counts])
        rate, slowing = np.median(norms / reach), np.median(norms / np.sqrt(reach))
        upper.append(float(max(norms / (cfg.norm_ratio * np.maximum(rate * reach, np.median(norms))))))
        claims.append(float(min(norms * cfg.claim_ratio / np.minimum(rate * reach, slowing * np.sqrt(reach)))))
        former += former_decisions(norms, counts)
        start, screened = aggregate(cfg, t, silos, trained, [start] * len(parts), counts, firsts, work)
        current += [d.action for d in screened.decisions]
    return counts, former, current, max(upper), min(claims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, default=MNIST)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=1, help="local epochs a round")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.mnist.is_dir():
        from cfl_mpi.data.mnist import load_split

        x, y = load_split(args.mnist, "train")
        x, source = x.astype(np.float32)[:, None], "MNIST training split"
    else:
        from cfl_mpi.data.digits import load_digit_pool

        x, y = load_digit_pool()
        x, source = np.kron(x, np.ones((3, 3)))[:, None].astype(np.float32), "scikit-learn's digits (24 x 24)"
    federations = {
        "quantity skew, 30-3,000": lambda rng: quantity_skew(y, rng),
        **{f"Dirichlet α = {a:g}": (lambda rng, a=a: dirichlet(y, rng, a)) for a in (0.1, 0.3, 1.0)},
    }
    began = time.monotonic()
    print(f"{source}; {args.rounds} rounds of {args.epochs} epoch(s), seeds {args.seeds}; {AggregationConfig()}\n")
    print("| federation | seed | sizes | former default | current default | largest / bound | smallest / claim bound |")
    print("|---|---|---|---|---|---|---|")
    for name, partition in federations.items():
        for seed in (int(s) for s in args.seeds.split(",")):
            parts = partition(np.random.default_rng(seed))
            counts, former, current, upper, claim = run(x, y, parts, args.rounds, seed, args.epochs)

            def touched(actions: list[str]) -> str:
                flagged = [a for a in actions if a != "accepted"]
                return f"{len(flagged)} of {len(actions)}" + (
                    f" ({', '.join(f'{flagged.count(a)} {a}' for a in sorted(set(flagged)))})" if flagged else ""
                )

            print(
                f"| {name} | {seed} | {min(counts)}-{max(counts)} | {touched(former)} | {touched(current)} "
                f"| {upper:.2f} | {claim:.1f} |"
            )
    print(f"\n{time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
