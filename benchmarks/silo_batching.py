"""A process's silos training one by one (`train_local` each) against as one computation
(`train_together`, runtime.silo_training: batched), side by side on whatever device is here.

    python -m benchmarks.silo_batching [--silos 150 600] [--device cpu|cuda] [--repeats 3] [--quick]

For the narrow CNN (the IFCA-shape config's: 16/32 channels, dim(Z) 64, 90 images a silo,
mini-batches of 64, one epoch) and IFCA's MLP (784-200-10, 100 images a silo, τ = 10 full-batch
steps), each at every silo count: image-steps per second of each path (the best of `repeats`
timed runs after one warm-up), their ratio, and how far each silo's weights lie between the
two paths (median and largest over the silos: a ReLU input within rounding of 0 can part one).
On a GPU the timings wait for the device (torch.cuda.synchronize). The choice
`runtime.silo_training: auto` makes (batched on a GPU only) rests on these ratios.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from cfl_mpi.models.mlp import Mlp
from cfl_mpi.models.simple_cnn import SimpleCNN
from cfl_mpi.training.batched import LocalTraining, train_together
from cfl_mpi.training.local import train_local
from cfl_mpi.training.params import TrainConfig

from .runs import machine

# (name, model, images a silo, local training)
SETTINGS = (
    (
        "narrow CNN",
        lambda: SimpleCNN(1, 10, 28, (16, 32), 64, 2),
        90,
        TrainConfig(local_epochs=1, lr=0.01, momentum=0.9, weight_decay=1e-6, batch_size=64),
    ),
    (
        "IFCA's MLP",
        lambda: Mlp(784, 10, 200),
        100,
        TrainConfig(local_epochs=10, lr=0.1, momentum=0.0, weight_decay=0.0, batch_size="all"),
    ),
)


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def compare(make, images: int, cfg: TrainConfig, silos: int, device: torch.device, repeats: int) -> dict:
    """Both paths on the same silos, from the same weights and shuffles each time."""
    torch.manual_seed(0)
    base = make().to(device)
    data = [
        (torch.rand(images, 1, 28, 28, device=device), torch.randint(0, 10, (images,), device=device))
        for _ in range(silos)
    ]

    def one_by_one() -> list:
        models = [copy.deepcopy(base) for _ in range(silos)]
        return models, lambda: [
            train_local(m, x, y, cfg, torch.Generator().manual_seed(i), device)
            for i, (m, (x, y)) in enumerate(zip(models, data))
        ]

    def together() -> list:
        models = [copy.deepcopy(base) for _ in range(silos)]
        jobs = [
            LocalTraining(m, x, y, torch.Generator().manual_seed(i)) for i, (m, (x, y)) in enumerate(zip(models, data))
        ]
        return models, lambda: train_together(jobs, cfg, device)

    best = {}
    for name, prepare in (("one_by_one", one_by_one), ("batched", together)):
        times = []
        for _ in range(repeats + 1):  # the first warms up (allocator, kernels)
            models, run = prepare()
            times.append(timed(run, device))
        best[name] = (min(times[1:]), models)
    steps = silos * images * cfg.local_epochs
    gaps = sorted(
        max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))
        for a, b in zip(best["one_by_one"][1], best["batched"][1])
    )
    return {
        "one_by_one": steps / best["one_by_one"][0],
        "batched": steps / best["batched"][0],
        "ratio": best["one_by_one"][0] / best["batched"][0],
        "median_gap": gaps[len(gaps) // 2],
        "max_gap": gaps[-1],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silos", type=int, nargs="+", default=[150, 600])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20 and 150 silos, 2 repeats")
    args = parser.parse_args(argv)
    silo_counts, repeats = ([20, 150], 2) if args.quick else (args.silos, args.repeats)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# Silo batching: one by one against batched ({where})\n\n{machine()}\n")
    print(
        "| model | silos | one by one, image-steps/s | batched, image-steps/s | batched / one by one | "
        "weight difference per silo, median / largest |"
    )
    print("|---|---|---|---|---|---|")
    for name, make, images, cfg in SETTINGS:
        for silos in silo_counts:
            r = compare(make, images, cfg, silos, device, repeats)
            print(
                f"| {name} | {silos} | {r['one_by_one']:,.0f} | {r['batched']:,.0f} | **{r['ratio']:.2f}** | "
                f"{r['median_gap']:.1e} / {r['max_gap']:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
