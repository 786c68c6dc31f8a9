"""A silo's embedding forward pass: the simple CNN's plain forward (training's, and the code's
before the speed work, BEFORE_COMMIT in benchmarks/__main__.py) against its CPU inference path
(`ConvEmbedding`), side by side.

    python -m benchmarks.embedding [--quick]

One thread, as a silo on a shared node has; batches as `training.embed` cuts them (512). For
each sample size (81: a silo of 40 on the MNIST test split; 405: of 8; 512: the cap) and each
network (2 pools: the default; 1 pool: the authors'), the best of several CPU times of each and
their ratio, and whether the outputs are identical bit for bit.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from cfl_mpi.models.simple_cnn import SimpleCNN
from cfl_mpi.training.local import EVAL_BATCH


def best_cpu_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 7
    print("| network | n | plain CPU ms | inference CPU ms | plain / inference | identical |")
    print("|---|---|---|---|---|---|")
    for pools in (2, 1):
        torch.manual_seed(0)
        g = SimpleCNN(1, 10, 28, pools=pools).embedding.eval()
        for n in (81, 405, 512):
            x = torch.rand(n, 1, 28, 28)

            def plain() -> torch.Tensor:
                return torch.cat([nn.Sequential.forward(g, x[s : s + EVAL_BATCH]) for s in range(0, n, EVAL_BATCH)])  # noqa: B023 - called within this iteration

            def fast() -> torch.Tensor:
                return torch.cat([g(x[s : s + EVAL_BATCH]) for s in range(0, n, EVAL_BATCH)])  # noqa: B023 - called within this iteration

            with torch.no_grad():
                same = torch.equal(plain(), fast())
                before, after = best_cpu_s(plain, repeats), best_cpu_s(fast, repeats)
            print(
                f"| simple CNN, {pools} pool{'s' if pools > 1 else ''} | {n} | {1e3 * before:.1f} | "
                f"{1e3 * after:.1f} | {before / after:.2f} | {'yes' if same else 'NO'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
