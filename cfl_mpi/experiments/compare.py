"""`python -m cfl_mpi.experiments.compare CONFIG [--methods emdcfl,pacfl,cfl,ifca,fedavg,oracle] [--seeds 0,1,2]
[--out DIR] [--resume] [--backend mpi|simulate] [--mpirun PATH] [--set [METHOD:]key=value ...]`

Runs every (method, seed) as its own job (an MPI job, or one process of the in-process
simulator with `--backend simulate`) on the same config, data partition and seeds,
then writes the comparison of the paper's Table 1: average and worst silo accuracy and ARI
as mean ± std over the seeds, with wall time (`table.md`, `table.csv`), and one heat map
of the pairwise matrix of each distance-based method (EMD-CFL's W, PACFL's A, CFL's
update similarities S) from the first seed's run (`heatmap_<method>.png`).

The config's own strategy keeps the settings the file gives it; every other method starts
from its defaults (`--set strategy.name=<method>`). `--set key=value` applies to every
method, `--set pacfl:strategy.beta=600` to one. `--resume` skips the runs whose
`summary.json` exists and continues a run that stopped before its end (Ctrl-C, or after
`runtime.stop_after_round`) from its checkpoint; a run stopped at that round is skipped, so
that one command with `--set runtime.stop_after_round=N --resume` brings every run to round N.

Nothing runs or is written before every run's config is valid and the data they read are
ready (missing data: one line, exit code 2). Each job's console lines reach the console as
they come, after `[<method> s<seed>]`, then a line with its outcome.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from .. import console, strategies
from ..cli import NO_MPIRUN, config_error, find_mpirun, split_list
from ..config import Config, ConfigError, load_config
from ..console import count, say, warn
from ..runtime.checkpoint import checkpoint_round
from ..runtime.stop import EXIT_INTERRUPTED

PROG = "cfl_mpi.experiments.compare"  # config errors name the command

DESCRIPTION = "Run several methods and seeds as separate jobs on one config, and tabulate them side by side."

COLUMNS = ("avg_acc", "worst_acc", "ari", "wall_s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cfl_mpi.experiments.compare", description=DESCRIPTION)
    parser.add_argument("config", help="YAML config, e.g. configs/digits.yaml")
    parser.add_argument(
        "--methods",
        default=",".join(strategies.defaults()),
        help="comma-separated strategy names (default: %(default)s)",
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    parser.add_argument("--out", help="folder for the runs and the tables (default: runs/compare_<name>)")
    parser.add_argument(
        "--resume", action="store_true", help="skip finished runs, continue stopped ones from their checkpoint"
    )
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument("--quiet", action="store_true", help="warnings only, from this command and its jobs")
    talk.add_argument("--verbose", action="store_true", help="each job's rounds in detail too")
    parser.add_argument(
        "--backend",
        choices=("mpi", "simulate"),
        default="mpi",
        help="run each job under mpirun (default) or in one process (python -m cfl_mpi.backends.simulate)",
    )
    parser.add_argument("--mpirun", help="mpirun to launch with (default: next to this Python, else on PATH)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="[METHOD:]KEY=VALUE",
        help="config override for every run, or for one method with a METHOD: prefix",
    )
    return parser.parse_args(argv)


def run_overrides(method: str, seed: int, overrides: list[str], file_method: str | None = None) -> list[str]:
    """The `--set`s of one run: its strategy and seed, then the user's.

    `--set strategy.name=<method>` starts the strategy section from that method's defaults,
    so it is left out for `file_method`, the strategy the config file itself tunes."""
    common, own = [], []
    for o in overrides:
        key = o.split("=", 1)[0]
        if ":" in key:
            prefix, rest = o.split(":", 1)
            if prefix == method:
                own.append(rest)
        else:
            common.append(o)
    strategy = [] if method == file_method else [f"strategy.name={method}"]
    return [*strategy, f"seed={seed}", *common, *own]


def file_strategy(config: str) -> str | None:
    """The strategy named in the config file (None if the file is not readable YAML)."""
    try:
        raw = yaml.safe_load(Path(config).read_text())
    except (OSError, yaml.YAMLError):
        return None  # load_config reports it
    section = raw.get("strategy") if isinstance(raw, dict) else None
    return section.get("name") if isinstance(section, dict) else None


def launch(
    mpirun: str | None,
    ranks: int,
    config: str,
    out: Path,
    sets: list[str],
    tag: str,
    talk: tuple[str, ...] = (),
    resume: bool = False,
) -> tuple[int, float]:
    """One job (MPI, or the simulator when `mpirun` is None); its output goes to out/log.txt and,
    line by line as it comes, to the console after `tag` (the job's round lines are its
    progress: minutes of silence otherwise). Returns (exit code, wall seconds).

    The run folders are the comparison's own: a run not continued (`resume`: from its
    checkpoint, its log appended to) starts over there (`--overwrite`) rather than being
    refused for the unfinished run it holds."""
    out.mkdir(parents=True, exist_ok=True)
    start_cmd = (
        [mpirun, "-n", str(ranks), sys.executable, "-m", "cfl_mpi.main"]
        if mpirun
        else [sys.executable, "-m", "cfl_mpi.backends.simulate"]
    )
    where = ["--resume", str(out)] if resume else ["--out", str(out), "--overwrite"]
    cmd = [*start_cmd, config, *where, *talk, *[a for s in sets for a in ("--set", s)]]
    start = time.monotonic()
    with open(out / "log.txt", "ab" if resume else "wb") as log:
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        job = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        assert job.stdout is not None  # stdout=PIPE
        for line in job.stdout:  # until every process of the job has closed its output
            log.write(line)
            log.flush()
            # printed as it is: the job has already kept only the lines of its console level
            print(f"{tag} {line.decode(errors='replace').rstrip()}", flush=True)
        code = job.wait()  # a Ctrl-C reaches the job too, which stops after its round (Interrupts)
    return code, time.monotonic() - start


class Interrupts:
    """Ctrl-C while a job runs: the job, in the same process group, gets it too and stops after
    its round with its checkpoint; this command waits for it instead of dying first (and
    killing it mid-round), then stops before the next job."""

    def __enter__(self) -> Interrupts:
        self.count, self._before = 0, signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._before)

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1


def failure_reason(run: Path) -> str:
    """The line that says why a run failed: its failure file's first line, else the last line of
    its log that names an error, else the log's last line."""
    from ..reporting.results import FAILURE

    failure = run / FAILURE
    if failure.is_file() and (lines := failure.read_text().strip().splitlines()):
        return lines[0]
    lines = (
        [line.strip() for line in (run / "log.txt").read_text(errors="replace").splitlines() if line.strip()]
        if (run / "log.txt").is_file()
        else []
    )
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return (errors or lines or ["no output"])[-1]


def _mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values))  # population std, as np.std


def summarise(method: str, summaries: list[dict]) -> dict:
    """Mean and std over seeds of each column, for one method."""
    row = {"method": method, "runs": len(summaries)}
    for col in COLUMNS:
        vals = [s[col] for s in summaries if s.get(col) is not None]
        row[col] = _mean_std(vals) if vals else None
    row["n_clusters"] = float(np.mean([s["n_clusters"] for s in summaries])) if summaries else None
    return row


def markdown_table(rows: list[dict], title: str) -> str:
    def fmt(cell, scale: float, digits: int) -> str:
        return "n/a" if cell is None else f"{scale * cell[0]:.{digits}f} ± {scale * cell[1]:.{digits}f}"

    scored = any(r["ari"] is not None for r in rows)  # no known groups: no ARI column
    lines = [
        f"### {title}",
        "",
        f"| Method | Avg Acc | Worst Acc |{' ARI |' if scored else ''} Clusters | Wall time (s) | Runs |",
        "|---|---|---|" + ("---|" if scored else "") + "---|---|---|",
    ]
    for r in rows:
        spec = strategies.REGISTRY.get(r["method"])
        ari = "-" if spec and not spec.clusters else fmt(r["ari"], 1, 2)  # the paper prints "-" for FedAvg
        clusters = "n/a" if r["n_clusters"] is None else f"{r['n_clusters']:.1f}"
        lines.append(
            f"| {strategies.label(r['method'])} | {fmt(r['avg_acc'], 100, 2)} | {fmt(r['worst_acc'], 100, 2)} |"
            f"{f' {ari} |' if scored else ''} {clusters} | {fmt(r['wall_s'], 1, 1)} | {r['runs']} |"
        )
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "runs", *[f"{c}_{s}" for c in COLUMNS for s in ("mean", "std")], "n_clusters_mean"])
        for r in rows:
            cells = [v for c in COLUMNS for v in (r[c] if r[c] is not None else ("", ""))]
            w.writerow([r["method"], r["runs"], *cells, "" if r["n_clusters"] is None else r["n_clusters"]])


def heatmaps(out: Path, runs: dict[str, Path]) -> list[Path]:
    """One heat map per distance-based method, from the run given for it."""
    from ..reporting.plots import run_heatmap

    written = []
    for method, run in runs.items():
        path = out / f"heatmap_{method}.png"
        if run_heatmap(run, path, f"{strategies.label(method)} ({run.name})"):
            written.append(path)
    return written


@dataclass(frozen=True)
class Plan:
    """A comparison whose every run's config is valid and whose data are ready: what `run` does."""

    config: str
    methods: list[str]
    seeds: list[int]
    overrides: list[str]
    file_method: str | None  # the strategy the config file tunes (run_overrides)
    configs: dict[tuple[str, int], Config]
    out: Path
    mpirun: str | None  # None: the in-process simulator
    resume: bool
    talk: tuple[str, ...]  # the console level's flag the jobs get (--quiet, --verbose), if any


def checked(args: argparse.Namespace) -> Plan:
    """Every check before the first job, writing nothing: the options, every run's config, the
    data and pretrained weights the runs read (made ready once, as each job's rank 0 would:
    downloaded where data.download allows), and mpirun. Missing data is then one error here
    rather than the same failure in every job. ConfigError on any problem."""
    from ..commands.prepare import prepare

    methods = split_list(args.methods, "methods", PROG, str)
    seeds = split_list(args.seeds, "seeds", PROG, int)
    unknown = [m for m in methods if m not in strategies.REGISTRY]
    if unknown:
        raise ConfigError(f"--methods: unknown method {unknown[0]!r} (choose from {', '.join(strategies.REGISTRY)})")
    prefixes = {o.split("=", 1)[0].split(":", 1)[0] for o in args.overrides if ":" in o.split("=", 1)[0]}
    if prefixes - set(methods):
        raise ConfigError(
            f"--set {sorted(prefixes - set(methods))[0]}:...: not one of the compared methods ({', '.join(methods)})"
        )
    own = file_strategy(args.config)
    configs = {}
    for method in methods:
        for seed in seeds:
            try:
                configs[method, seed] = load_config(args.config, run_overrides(method, seed, args.overrides, own))
            except ConfigError as err:
                raise ConfigError(f"{err} [method {method}, seed {seed}]") from None
    prepared: list[tuple] = []
    for cfg in configs.values():
        if (cfg.data, cfg.model) not in prepared:
            prepare(cfg)
            prepared.append((cfg.data, cfg.model))
    mpirun = None
    if args.backend == "mpi":
        mpirun = args.mpirun or find_mpirun()
        if not mpirun:
            raise ConfigError(f"--mpirun: {NO_MPIRUN}, or give --mpirun")
    out = Path(args.out or f"runs/compare_{configs[methods[0], seeds[0]].name}")
    talk = ("--quiet",) if args.quiet else ("--verbose",) if args.verbose else ()
    return Plan(args.config, methods, seeds, args.overrides, own, configs, out, mpirun, args.resume, talk)


def outcome(method: str, summary: dict) -> str:
    """A finished run in one line: what the table will show of it."""
    ari = (
        f"ARI {summary['ari']:.3f}, " if strategies.REGISTRY[method].clusters and summary.get("ari") is not None else ""
    )
    return f"{ari}avg acc {100 * summary['avg_acc']:.2f} %, worst {100 * summary['worst_acc']:.2f} %"


def run(plan: Plan) -> int:
    """Every (method, seed) job in turn, each streamed to the console and summed up in a line,
    then the tables and heat maps."""
    plan.out.mkdir(parents=True, exist_ok=True)
    failed = []
    jobs = [(method, seed) for method in plan.methods for seed in plan.seeds]
    for i, (method, seed) in enumerate(jobs, 1):
        run_dir, head = plan.out / f"{method}_s{seed}", f"[{i}/{len(jobs)}] {method} seed {seed}"
        cfg = plan.configs[method, seed]
        after = checkpoint_round(run_dir) if plan.resume else None
        if plan.resume and (run_dir / "summary.json").exists():
            say(f"{head}: done before, skipped ({run_dir})")
            continue
        if after is not None and cfg.runtime.stop_after_round is not None and after >= cfg.runtime.stop_after_round:
            say(f"{head}: stopped after round {after} before, as runtime.stop_after_round asks: skipped ({run_dir})")
            continue
        (run_dir / "summary.json").unlink(missing_ok=True)
        say(f"{head}: {f'continuing after round {after}' if after else 'running'}; log {run_dir / 'log.txt'}")
        with Interrupts() as interrupts:
            code, wall = launch(
                plan.mpirun,
                cfg.world_size,
                plan.config,
                run_dir,
                run_overrides(method, seed, plan.overrides, plan.file_method),
                f"  [{method} s{seed}]",
                plan.talk,
                resume=bool(after),
            )
        if interrupts.count:
            print(
                f"cfl_mpi.experiments.compare: interrupted during {method} seed {seed}; continue with the same command "
                f"and --resume",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_INTERRUPTED
        stopped = checkpoint_round(run_dir)
        if code == 0 and (run_dir / "summary.json").exists():
            summary = json.loads((run_dir / "summary.json").read_text())
            say(
                f"{head}: done in {wall:.0f} s: {outcome(method, summary)} ({summary['wall_s']:.0f} s of rounds, "
                f"the table's wall time; the rest is start-up and writing the results)"
            )
        elif code == 0 and stopped == cfg.runtime.stop_after_round:
            say(f"{head}: stopped after round {stopped} in {wall:.0f} s; continue with the same command and --resume")
        else:
            failed.append((method, seed))
            warn(
                f"{head}: FAILED (exit {code}) in {wall:.0f} s: {failure_reason(run_dir)} (log: {run_dir / 'log.txt'})"
            )

    out, seeds = plan.out, plan.seeds
    rows, first_runs = [], {}
    for method in plan.methods:
        done = [out / f"{method}_s{s}" for s in seeds if (out / f"{method}_s{s}" / "summary.json").exists()]
        rows.append(summarise(method, [json.loads((r / "summary.json").read_text()) for r in done]))
        if done:
            first_runs[method] = done[0]
    first = plan.configs[plan.methods[0], seeds[0]]
    title = (
        f"{first.name}: {count(first.silos, 'silo')}, {count(first.train.rounds, 'round')}, seeds "
        f"{', '.join(map(str, seeds))} (mean ± std over seeds)"
    )
    table = markdown_table(rows, title)
    (out / "table.md").write_text(table)
    write_csv(rows, out / "table.csv")
    maps = heatmaps(out, first_runs)
    print("\n" + table, flush=True)
    say(f"tables: {out / 'table.md'}, {out / 'table.csv'}; heat maps: {', '.join(m.name for m in maps) or 'none'}")
    if failed:
        print(
            f"cfl_mpi.experiments.compare: {len(failed)} run(s) failed: "
            + ", ".join(f"{m} seed {s} ({out / f'{m}_s{s}' / 'log.txt'})" for m, s in failed),
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console.setup(console.level_of(args.quiet, args.verbose))
    try:
        plan = checked(args)
    except ConfigError as err:
        config_error(str(err), PROG)
    return run(plan)


if __name__ == "__main__":
    sys.exit(main())
