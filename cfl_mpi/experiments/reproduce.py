"""`python -m cfl_mpi.experiments.reproduce TABLE [--scale small|paper] [--seeds 0,1,2] [--out DIR]
[--backend simulate|mpi] [--run]`

Runs the methods of one table of the EMD-CFL paper (1: rotated MNIST/CIFAR10; 3: backdoor
MNIST/CIFAR10; 6: partial participation, Appendix E.4; 10, 11: the rotation variants of
MNIST and CIFAR10) with several seeds, through `cfl_mpi.experiments.compare`, and writes `TABLE.md`:
the paper's figures (cfl_mpi/experiments/paper_figures.py) beside ours, mean ± std over the seeds;
and `accuracy_per_round.png`: every method's average accuracy per round, one panel per
data set, all methods on the same axes.

`--scale small` runs on a 2-core machine (docs/reproduction/README.md gives the times): the
rotated sets on the real MNIST test split (the configs' `data/mnist`, fetched on first use, or
--set data.root=...), backdoor MNIST on the same split, fewer silos and rounds; CIFAR-10 blocks
are listed as not run. `--scale paper` is the paper's
configs (configs/*.yaml: 40/30/15 silos, T = 10, E = 10) for a GPU cluster: it prints the
sbatch line, and runs only with `--run` (inside that allocation).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from .. import strategies
from ..cli import config_error, split_list
from ..config import ConfigError
from ..runtime.stop import EXIT_INTERRUPTED
from . import compare
from .paper_figures import (
    TABLE_1_CIFAR,
    TABLE_1_MNIST,
    TABLE_3_CIFAR,
    TABLE_3_MNIST,
    TABLE_6,
    TABLE_10,
    TABLE_11,
    PaperBlock,
)

PROG = "cfl_mpi.experiments.reproduce"  # config errors name the command

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DESCRIPTION = "Run the methods of one table of the EMD-CFL paper and write the paper's figures beside ours."
#: the methods of the paper's tables (those it prints figures for), in the registry's order
CLUSTERING = tuple(m for m in strategies.REGISTRY if m in TABLE_1_MNIST.figures)
PARTIAL = ("emdcfl", "oracle")
HEADINGS = {
    "avg_acc": "Avg Acc",
    "worst_acc": "Worst Acc",
    "ari": "ARI",
    "target_clean_acc": "Clean Acc",
    "target_backdoor_acc": "Backdoor Acc",
}
PAPER = "Zhang, Williams & Toni, Clustered Federated Learning via Embedding Distributions (EMD-CFL)"
SEEDED = ("emdcfl:strategy.pair_keys=seeded",)  # reproducible projections, hence W, for EMD-CFL


@dataclass(frozen=True)
class Setting:
    """One data set of a table at one scale: a config and its overrides (None: cannot run here)."""

    config: str | None
    overrides: tuple[str, ...] = ()
    why_not: str = ""


@dataclass(frozen=True)
class Block:
    paper: PaperBlock
    small: Setting
    full: Setting
    methods: tuple[str, ...] = CLUSTERING


def _mnist_test(*extra: str) -> tuple[str, ...]:
    """The MNIST test split as the whole pool, from the config's data.root (downloaded if missing)."""
    return ("data.pool=test", *extra)


NO_CIFAR = Setting(None, why_not="no CIFAR-10 on this machine: run --scale paper")
# Small scale: 8 silos of the MNIST test split (rotated), 3 rounds of 1 local epoch; the
# slim CNN of the tests (two pools) keeps a run near a minute on 2 cores.
SMALL_ROTATED = _mnist_test("silos=8", "train.rounds=3", "train.local_epochs=1", "model.channels=[32,64]", *SEEDED)
# Backdoor MNIST, small: 6 silos (2 per group) of the MNIST test split, the authors' one-pool CNN
# at 32/64 channels, 7 local epochs (fewer, or a slimmer CNN, do not teach the backdoor group's
# models the colour reliably: at 5, seed 0 sits on the robust rule's cut, docs/research/FIDELITY.md),
# 3 rounds (FedAvg's backdoor gap needs them to show).
SMALL_BACKDOOR = _mnist_test("silos=6", "train.rounds=3", "train.local_epochs=7", "model.channels=[32,64]", *SEEDED)
VARIANTS = {
    "min": ("[-3,-1,1,3]", "[0,0,0,0]"),
    "two": ("[-3,3,177,183]", "[0,0,1,1]"),
    "base": ("[0,0,0,0]", "[0,0,0,0]"),
}
# E.4 small: 8 silos, 2/4/6 per round (the paper's 10/20/30 of 40), 4 rounds.
PARTICIPANTS = {10: 2, 20: 4, 30: 6}


def _variant(name: str) -> tuple[str, ...]:
    rotations, clusters = VARIANTS[name]
    return (f"data.rotations={rotations}", f"data.group_clusters={clusters}")


TABLES: dict[str, list[Block]] = {
    "1": [
        Block(
            TABLE_1_MNIST, Setting("configs/rotated_mnist_test.yaml", SMALL_ROTATED), Setting("configs/rotated.yaml")
        ),
        Block(TABLE_1_CIFAR, NO_CIFAR, Setting("configs/rotated_cifar10.yaml")),
    ],
    "3": [
        Block(
            TABLE_3_MNIST,
            Setting("configs/backdoor_mnist.yaml", SMALL_BACKDOOR),
            Setting("configs/backdoor_mnist.yaml"),
        ),
        Block(TABLE_3_CIFAR, NO_CIFAR, Setting("configs/backdoor_cifar10.yaml")),
    ],
    "6": [
        b
        for n in sorted(TABLE_6)
        for b in (
            Block(
                TABLE_6[n][0],
                Setting(
                    "configs/rotated_mnist_test.yaml",
                    (*SMALL_ROTATED, "train.rounds=4", f"participation.count={PARTICIPANTS[n]}"),
                ),
                Setting("configs/rotated.yaml", (f"participation.count={n}",)),
                PARTIAL,
            ),
            Block(
                TABLE_6[n][1], NO_CIFAR, Setting("configs/rotated_cifar10.yaml", (f"participation.count={n}",)), PARTIAL
            ),
        )
    ],
    "10": [
        Block(
            TABLE_10[v],
            Setting("configs/rotated_mnist_test.yaml", (*SMALL_ROTATED, *_variant(v))),
            Setting(f"configs/rotated_mnist_{v}.yaml"),
        )
        for v in ("min", "two", "base")
    ],
    "11": [Block(TABLE_11[v], NO_CIFAR, Setting(f"configs/rotated_cifar10_{v}.yaml")) for v in ("min", "two", "base")],
}
ALIASES = {"E4": "6", "E.4": "6"}


def _fail(message: str) -> NoReturn:
    config_error(message, PROG)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cfl_mpi.experiments.reproduce", description=DESCRIPTION)
    parser.add_argument("table", help=f"paper table: {', '.join(TABLES)} (E4 = 6)")
    parser.add_argument(
        "--scale",
        choices=("small", "paper"),
        default="small",
        help="small: 5 to 50 minutes a seed on 2 cores (MNIST test split, fewer silos and rounds); paper: the "
        "paper's configs, for a GPU cluster (prints the sbatch line; runs with --run)",
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    parser.add_argument("--out", help="folder (default: runs/reproduce_<TABLE>_<scale>)")
    parser.add_argument(
        "--backend",
        choices=("simulate", "mpi"),
        default=None,
        help="simulate in one process (small's default) or mpirun (paper's default)",
    )
    parser.add_argument("--run", action="store_true", help="paper scale: run now (inside the allocation)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="[METHOD:]KEY=VALUE",
        help="extra override for every run (after the table's own)",
    )
    parser.add_argument("--blocks", help="comma-separated block numbers to run (default: all), e.g. 1")
    parser.add_argument(
        "--methods",
        help="comma-separated subset of the table's methods (default: all); runs "
        "done before are kept (--resume), so several invocations can share --out",
    )
    return parser.parse_args(argv)


def _cell(value: tuple[float, float] | None) -> str:
    return "-" if value is None else f"{value[0]:.2f} ± {value[1]:.2f}"


def ours(run_dirs: list[Path], column: str) -> tuple[float, float] | None:
    """Mean ± std over seeds of one summary column, in the paper's units (accuracies in %)."""
    values = [json.loads((r / "summary.json").read_text()).get(column) for r in run_dirs]
    values = [v for v in values if v is not None]
    if not values:
        return None
    scale = 1.0 if column == "ari" else 100.0
    return float(np.mean(values)) * scale, float(np.std(values)) * scale


def block_table(
    block: Block, runs: dict[str, list[Path]], setting: Setting, command: str, ran: tuple[str, ...] = ()
) -> str:
    """Markdown: the paper's figures beside ours for each method ("failed" where a method of
    `ran` left no finished run: its log says why)."""
    cols = block.paper.columns
    head = " | ".join(f"{HEADINGS[c]} paper | {HEADINGS[c]} ours" for c in cols)
    lines = [f"### {block.paper.title} (the paper's {block.paper.source})", ""]
    if setting.config is None:
        lines += [f"Not run: {setting.why_not}.", ""]
    else:
        lines += [f"Ours: `{command}`", ""]
    lines += [f"| Method | {head} | Seeds |", "|---|" + "---|" * (2 * len(cols) + 1)]
    for method in block.methods:
        paper = block.paper.figures.get(method, {})
        done = runs.get(method, [])
        cells = []
        for c in cols:
            not_clustering = c == "ari" and not strategies.REGISTRY[method].clusters
            mine = (
                "failed" if method in ran and not done else "-" if not_clustering or not done else _cell(ours(done, c))
            )
            cells += [_cell(paper.get(c)), mine]
        lines.append(f"| {strategies.label(method)} | {' | '.join(cells)} | {len(done)} |")
    return "\n".join(lines) + "\n"


def round_curves(run_dirs: list[Path]) -> tuple[list[int], np.ndarray]:
    """(rounds, mean over seeds of the average silo accuracy per round, in %)."""
    per_seed = []
    for run in run_dirs:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        per_seed.append([100 * r["avg_acc"] for r in records])
    rounds = min(len(s) for s in per_seed)
    return list(range(1, rounds + 1)), np.mean([s[:rounds] for s in per_seed], axis=0)


def plot_rounds(panels: list[tuple[str, dict[str, list[Path]]]], path: Path) -> None:
    """One panel per data set run, every method's average accuracy per round on the same axes."""
    from ..reporting.plots import method_curves

    method_curves(
        [
            (title, {strategies.label(m): round_curves(dirs) for m, dirs in runs.items() if dirs})
            for title, runs in panels
        ],
        path,
    )


def compare_args(
    methods: tuple[str, ...],
    config: str,
    overrides: tuple[str, ...],
    seeds: str,
    out: Path,
    backend: str,
    extra: list[str],
) -> list[str]:
    def applies(o: str) -> bool:  # a METHOD:key=value override only when METHOD is run
        key = o.split("=", 1)[0]
        return ":" not in key or key.split(":", 1)[0] in methods

    sets = [a for o in (*overrides, *extra) if applies(o) for a in ("--set", o)]
    return [
        config,
        "--methods",
        ",".join(methods),
        "--seeds",
        seeds,
        "--out",
        str(out),
        "--backend",
        backend,
        "--resume",
        *sets,
    ]


def sbatch_line(table: str, seeds: str, blocks: list[Block]) -> str:
    """The allocation for the paper scale: as many tasks as the largest config's ranks."""
    from ..config import load_config

    ranks = max(load_config(PROJECT_ROOT / b.full.config, b.full.overrides).world_size for b in blocks if b.full.config)
    inner = f"python -m cfl_mpi.experiments.reproduce {table} --scale paper --seeds {seeds} --run"
    return f"sbatch --nodes=1 --ntasks={ranks} --gpus-per-node=1 --time=48:00:00 --wrap {shlex.quote(inner)}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    table = ALIASES.get(args.table, args.table)
    if table not in TABLES:
        _fail(f"TABLE: no reproduction of table {args.table!r} (choose from {', '.join(TABLES)}, E4)")
    blocks = TABLES[table]
    if args.blocks:
        picked = split_list(args.blocks, "blocks", PROG, int)
        if not all(1 <= b <= len(blocks) for b in picked):
            _fail(f"--blocks: table {table} has blocks 1..{len(blocks)}, got {args.blocks}")
        blocks = [blocks[b - 1] for b in picked]
    seeds = ",".join(str(s) for s in split_list(args.seeds, "seeds", PROG, int))
    wanted = split_list(args.methods, "methods", PROG, str) if args.methods else list(CLUSTERING)
    unknown = [m for m in wanted if not any(m in b.methods for b in blocks)]
    if args.methods and unknown:
        _fail(f"--methods: {unknown[0]!r} is not a method of table {table}")
    if args.scale == "paper" and not args.run:
        print(sbatch_line(table, seeds, blocks))
        return 0
    backend = args.backend or ("simulate" if args.scale == "small" else "mpi")
    out = Path(args.out or f"runs/reproduce_{table}_{args.scale}")
    # Every block's comparison is checked (configs, data, mpirun) before the first job runs: a
    # missing data set is one error, with nothing written, not hours of failed jobs and a blank table.
    planned: list[tuple[Block, Setting, tuple[str, ...], str, compare.Plan | None]] = []
    for i, block in enumerate(blocks, 1):
        setting = block.small if args.scale == "small" else block.full
        run_methods = tuple(m for m in block.methods if m in wanted)
        command, plan = "", None
        if setting.config is not None and run_methods:
            cargs = compare_args(
                run_methods, setting.config, setting.overrides, seeds, out / f"block{i}", backend, args.overrides
            )
            command = "python -m cfl_mpi.experiments.compare " + " ".join(shlex.quote(a) for a in cargs)
            try:
                plan = compare.checked(compare.parse_args(cargs))
            except ConfigError as err:
                _fail(f"{err} [{block.paper.title}]")
        planned.append((block, setting, run_methods, command, plan))
    out.mkdir(parents=True, exist_ok=True)
    sections, panels, failed = [], [], False
    for block, setting, run_methods, command, plan in planned:
        runs: dict[str, list[Path]] = {}
        if plan is not None:
            print(f"[{block.paper.title}] {command}", flush=True)
            code = compare.run(plan)
            if code == EXIT_INTERRUPTED:
                return code
            failed |= code != 0
            runs = {
                m: [
                    plan.out / f"{m}_s{s}"
                    for s in seeds.split(",")
                    if (plan.out / f"{m}_s{s}" / "summary.json").exists()
                ]
                for m in block.methods
            }
            if any(runs.values()):  # no blank panel for a block whose runs all failed
                panels.append((block.paper.title, runs))
        sections.append(block_table(block, runs, setting, command, run_methods if command else ()))
    header = (
        f"# Paper table {table}: the paper's figures beside cfl_mpi's ({args.scale} scale, seeds {seeds})\n\n"
        "Made by `python -m cfl_mpi.experiments.reproduce "
        f"{' '.join(shlex.quote(a) for a in (argv or sys.argv[1:]))}`. "
        f"Paper: mean ± std as printed in {PAPER}; ours: mean ± std (population) over the seeds. "
        "Accuracies in %.\n\n"
    )
    (out / f"table{table}.md").write_text(header + "\n".join(sections))
    if panels:
        plot_rounds(panels, out / "accuracy_per_round.png")
    print(f"table: {out / f'table{table}.md'}" + (f"; plot: {out / 'accuracy_per_round.png'}" if panels else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
