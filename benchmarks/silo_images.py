"""A rank's silos keeping their images as the source's bytes against keeping the model's floats:
one process builds the silos a silo rank of the config hosts, each way in a fresh process, and
prints the growth of its memory, the seconds to build them, and the seconds to read one silo's
training set as the model's floats (a lookup of each byte's value) against the arithmetic that
makes them (`to_model_input`), with both reads' bits compared.

    python -m benchmarks.silo_images --mnist DIR [--config configs/ifca_rotated_mnist.yaml] [--silos 1200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import timeit

CONFIG = "configs/ifca_rotated_mnist.yaml"


def build(config: str, mnist: str, silos: int, kept: str) -> dict:
    """In this process: the silos' data built with images kept as `kept` ("bytes" or "floats")."""
    import time

    import numpy as np

    from cfl_mpi.config import load_config
    from cfl_mpi.data import images

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    if kept == "floats":
        images.byte_codes = lambda images01: None  # every silo keeps the model's floats, as before
    cfg = load_config(config, [f"data.root={mnist}", "data.download=false"])
    facts = cfg.data_facts()
    cfg.data.build(0, facts)  # the split decoded once, as a rank's first silo does
    before, start = rss_mb(), time.process_time()
    data = [cfg.data.build(silo, facts) for silo in range(1, silos + 1)]
    seconds = time.process_time() - start
    held = sum(
        (s.codes.nbytes if isinstance(s, images.PixelCodes) else s.nbytes)
        for d in data
        for s in (d.train_images, d.val_images, d.test_images)
    )
    result = {"kept": kept, "rss_mb": rss_mb() - before, "held_mb": held / 2**20, "build_s": seconds}
    stored = data[0].train_images
    if isinstance(stored, images.PixelCodes):
        arithmetic = lambda: images.to_model_input(images.unit(stored.codes), stored.mean, stored.std, stored.channels)  # noqa: E731
        same = np.array_equal(stored.floats().view(np.uint32), arithmetic().view(np.uint32))
        reads = {"lookup": stored.floats, "arithmetic": arithmetic}
        result["read_ms"] = {k: min(timeit.repeat(f, number=200, repeat=5)) / 200 * 1e3 for k, f in reads.items()}
        result["same_bits"] = bool(same)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mnist", required=True, help="folder of MNIST's four files")
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--silos", type=int, default=1200, help="silos of one rank (1,200: the config under mpirun -n 3)")
    p.add_argument("--one", choices=["bytes", "floats"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(build(args.config, args.mnist, args.silos, args.one)))
        return
    runs = {}
    for kept in ("floats", "bytes"):
        cmd = [sys.executable, "-m", "benchmarks.silo_images", "--mnist", args.mnist, "--config", args.config]
        out = subprocess.run([*cmd, "--silos", str(args.silos), "--one", kept], check=True, capture_output=True)
        runs[kept] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    floats, codes = runs["floats"], runs["bytes"]
    print(f"{args.silos} silos of {args.config}")
    print("| kept as | images held | process grew by | build |")
    print("|---|---|---|---|")
    for run in (floats, codes):
        print(f"| {run['kept']} | {run['held_mb']:.0f} MB | {run['rss_mb']:.0f} MB | {run['build_s']:.2f} s |")
    print(
        f"bytes / floats: images {codes['held_mb'] / floats['held_mb']:.2f}, "
        f"process {codes['rss_mb'] / floats['rss_mb']:.2f}, build {codes['build_s'] / floats['build_s']:.2f}"
    )
    read = codes["read_ms"]
    print(
        f"one silo's training set read as floats: lookup {read['lookup']:.3f} ms, arithmetic "
        f"{read['arithmetic']:.3f} ms ({read['lookup'] / read['arithmetic']:.2f}x), same bits: {codes['same_bits']}"
    )


if __name__ == "__main__":
    main()
