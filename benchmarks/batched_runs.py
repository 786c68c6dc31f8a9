"""How far batched silo training's runs lie from one by one's, and from what: whole jobs and
the rounding floor of a silo's own training.

    python -m benchmarks.batched_runs [--seeds 0,1,2] [--rounds 3] [--out DIR]

Jobs: the quick start (configs/digits.yaml, 8 silos on 2 silo ranks, seeded pair keys,
`--rounds` rounds) with every silo training each round and with 4 of the 8 a round
(`participation.count=4`), each with `runtime.silo_training` batched and one_by_one, for each
seed; per round, whether the clusters agree and the largest per-silo and the average accuracy
difference (points).

Floor: the quick start's silos 5, 6 and 7 trained one round as each path trains them (from
one θ(0), the round's shuffles), the weights' largest difference; beside it, one by one
against one by one from a θ(0) with one weight moved by one float32 ulp (how far the silo's
training carries a rounding-sized change on its own); and whether a silo's batched weights
keep their bits in any group (its position, the group's size and members).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

from .runs import DIGITS, ROOT, run_job


def job_rows(seeds: list[int], rounds: int, out: Path) -> list[str]:
    config, overrides = DIGITS
    rows = []
    for seed in seeds:
        for part in ("every silo", "4 of 8"):
            records = {}
            for how in ("batched", "one_by_one"):
                sets = [
                    *overrides,
                    f"seed={seed}",
                    f"train.rounds={rounds}",
                    "strategy.pair_keys=seeded",
                    f"runtime.silo_training={how}",
                    *(["participation.count=4"] if part == "4 of 8" else []),
                ]
                keep = out / f"seed{seed}-{'all' if part == 'every silo' else 'four'}-{how}"
                records[how] = [r for r in run_job(ROOT, config, sets, 3, keep=keep).records if "accuracy" in r]
            cells = []
            for a, b in zip(records["batched"], records["one_by_one"]):
                pairs = zip(a["accuracy"], b["accuracy"])
                gaps = [100 * abs(x - y) for x, y in pairs if x is not None and y is not None]
                cells.append(
                    f"{'same' if a['clusters'] == b['clusters'] else 'DIFFER'}, {max(gaps):.2f} / "
                    f"{100 * abs(a['avg_acc'] - b['avg_acc']):.2f}"
                )
            rows.append(f"| {seed} | {part} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    return rows


def floor_rows() -> list[str]:
    import torch

    from cfl_mpi.config import load_config
    from cfl_mpi.models.build import build_model
    from cfl_mpi.runtime.silo import shuffle_seed
    from cfl_mpi.training.batched import LocalTraining, train_together
    from cfl_mpi.training.local import SiloSet, train_local

    torch.set_num_threads(1)
    cfg = load_config(DIGITS[0], list(DIGITS[1]))
    facts, cpu = cfg.data_facts(), torch.device("cpu")
    torch.manual_seed(0)
    base = build_model(cfg.architecture, load_weights=False)
    silos = [5, 6, 7]
    data = {}
    for s in range(cfg.silos):
        d = cfg.data.build(s, facts)
        data[s] = SiloSet(d.train_images, d.y_train, cpu).tensors()

    def shuffles(silo: int) -> torch.Generator:  # round 1's, as the silo draws them
        return torch.Generator().manual_seed(shuffle_seed(cfg.seed, silo, 1))

    def alone(silo: int, start) -> torch.nn.Module:
        model = copy.deepcopy(start)
        train_local(model, *data[silo], cfg.train, shuffles(silo), cpu)
        return model

    def together(group: list[int]) -> dict[int, torch.nn.Module]:
        models = {s: copy.deepcopy(base) for s in group}
        train_together([LocalTraining(models[s], *data[s], shuffles(s)) for s in group], cfg.train, cpu)
        return models

    def apart(a, b) -> float:
        return max(float((p - q).abs().max()) for p, q in zip(a.state_dict().values(), b.state_dict().values()))

    nudged = copy.deepcopy(base)
    with torch.no_grad():
        bias = nudged.head.bias
        bias[0] = torch.nextafter(bias[0], torch.tensor(1.0))
    batched = together(silos)
    groups = ([6, 5, 7], [7, 6, 5], [4, 5], [5, 0, 1, 2])
    rows = []
    for s in silos:
        own = alone(s, base)
        kept = all(
            all(torch.equal(p, q) for p, q in zip(batched[s].parameters(), together(g)[s].parameters()))
            for g in groups
            if s in g
        )
        rows.append(
            f"| {s} | {apart(own, base):.2e} | {apart(own, batched[s]):.2e} | {apart(own, alone(s, nudged)):.2e} "
            f"| {'yes' if kept else 'NO'} |"
        )
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="keep the jobs' results folders here")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(
        "Each round: clusters batched against one by one, the largest per-silo / the average accuracy "
        "difference (points)\n"
    )
    print("| seed | training each round | " + " | ".join(f"round {t}" for t in range(1, args.rounds + 1)) + " |")
    print("|---|---|" + "---|" * args.rounds)
    with tempfile.TemporaryDirectory(prefix="cfl_batched_") as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        job_rows(seeds, args.rounds, out)
    print(
        "\nOne round's training (3 epochs) from one θ(0): the largest weight difference\n\n"
        "| silo | moved by training | batched vs one by one | one by one vs one by one from θ(0) 1 ulp off "
        "| batched bits the same in any group |\n|---|---|---|---|---|"
    )
    floor_rows()


if __name__ == "__main__":
    main()
