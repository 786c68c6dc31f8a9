"""A silo's noise estimate: the code before the speed work (the reference tree, default
BEFORE_COMMIT in benchmarks/__main__.py) against this tree's, side by side.

    python -m benchmarks.noise_estimate BEFORE_TREE [--seeds 10] [--quick]

On real embeddings (silos of rotated digits and of the MNIST test split, one local epoch
of training) both estimators run over the same generator seeds; prints the time of each,
their ratio, and how far the new value lies from the old one (mean ±% and the spread of
each over seeds, which is the estimator's own sampling error).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from cfl_mpi.config import load_config
from cfl_mpi.models.build import build_model
from cfl_mpi.strategies.emdcfl.distances import projected_dim, sample_size
from cfl_mpi.strategies.emdcfl.parts import distance_of
from cfl_mpi.training.local import embed, train_local

from .runs import MNIST

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "digits": ("configs/digits.yaml", ["train.local_epochs=1"]),
    "mnist_test": ("configs/rotated_mnist_test.yaml", [f"data.root={MNIST}", "data.download=false"]),
}


def former_estimator(tree: Path):
    """`reference_distance` of the code in `tree`, loaded beside this tree's package."""
    spec = importlib.util.spec_from_file_location("before_emdcfl_w1", tree / "cfl_mpi" / "ot" / "wasserstein.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import cfl_mpi.strategies.emdcfl.distances as ours

    source = (tree / "cfl_mpi" / "algorithms" / "emdcfl.py").read_text()
    body = source[source.index("def reference_distance(") : source.index("\nclass EmdCfl(")]
    scope = {**vars(ours), "w1": module.w1}
    exec(compile(body, str(tree / "cfl_mpi/algorithms/emdcfl.py"), "exec"), scope)  # noqa: S102 - our own old code
    return scope["reference_distance"]  # its solver code is the old tree's (module.w1)


def current_estimator(z: np.ndarray, v: np.ndarray, dim_r: int, s: object, rng: np.random.Generator):
    """This tree's τ and noise, called as the former estimator is."""
    return distance_of(s).reference(z, v, dim_r, rng)


def silo_embeddings(config: str, overrides: list[str], silo: int) -> tuple[np.ndarray, np.ndarray, int, object]:
    """(Z_own, Z_val) of a silo after one round of local training, as the silo computes them."""
    cfg = load_config(ROOT / config, overrides)
    data = cfg.data.build(silo, cfg.data_facts())
    model = build_model(cfg.architecture, load_weights=False)
    torch.manual_seed(cfg.seed)
    train_local(model, data.x_train, data.y_train, cfg.train, torch.Generator().manual_seed(silo), "cpu")
    s = cfg.strategy
    rng = np.random.default_rng([cfg.seed, 11, silo, 1])
    x = data.x_train[
        np.sort(
            rng.choice(
                len(data.y_train),
                sample_size(s.sample_fraction, s.max_rows, len(data.y_train), len(data.y_val)),
                replace=False,
            )
        )
    ]
    return (
        embed(model.embedding, x, "cpu"),
        embed(model.embedding, data.x_val[: s.sample_cap], "cpu"),
        projected_dim(cfg.strategy.proj_ratio, cfg.model.embedding_dim),
        s,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="2 silos per data set, 5 seeds")
    args = parser.parse_args(argv)
    seeds = 5 if args.quick else args.seeds
    torch.set_num_threads(1)
    threadpool_limits(1)  # one BLAS thread, as a silo on a shared node has
    old = former_estimator(args.before)
    print(
        "| data | silo | n, |V| | before CPU ms | after CPU ms | before / after | noise after vs before (mean ±%) "
        "| spread before | spread after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for name, (config, overrides) in CASES.items():
        if name == "mnist_test" and not MNIST.is_dir():
            continue
        for silo in (0, 4) if args.quick else (0, 2, 4, 6):
            z, v, dim_r, s = silo_embeddings(config, overrides, silo)
            values, times = {"before": [], "after": []}, {"before": 0.0, "after": 0.0}
            for seed in range(seeds):  # interleaved, so both see the same machine load
                for label, fn in (("before", old), ("after", current_estimator)):
                    start = time.thread_time()  # CPU seconds: the shared machine's load does not count
                    tau, noise = fn(z, v, dim_r, s, np.random.default_rng(seed))
                    times[label] += time.thread_time() - start
                    values[label].append(noise)
            b, a = np.array(values["before"]), np.array(values["after"])
            ratios.append(a.mean() / b.mean())
            print(
                f"| {name} | {silo} | {len(z)}, {len(v)} | {1e3 * times['before'] / seeds:.0f} "
                f"| {1e3 * times['after'] / seeds:.0f} | {times['before'] / times['after']:.1f} "
                f"| {100 * (a.mean() / b.mean() - 1):+.1f} % | ±{100 * b.std() / b.mean():.1f} % "
                f"| ±{100 * a.std() / a.mean():.1f} % |",
                flush=True,
            )
    print(
        f"\nmean of (after / before) over silos: {np.mean(ratios):.3f}; spread over silos ±{100 * np.std(ratios):.1f} %"
    )


if __name__ == "__main__":
    main()
