"""What every command line of cfl_mpi shares: the run arguments, config loading and checks, and
the exit code of a config error (2, with one line on stderr)."""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

from .config import Config, ConfigError, load_config
from .console import count, say

T = TypeVar("T")

EXIT_CONFIG = 2

__all__ = [
    "EXIT_CONFIG",
    "config_error",
    "NO_MPIRUN",
    "announce",
    "check_results_folder",
    "count",
    "exit_now",
    "exit_rank",
    "find_mpirun",
    "load_run_config",
    "prepare_results_folder",
    "run_arguments",
    "split_list",
]


def run_arguments(prog: str, description: str, *, resume: bool = True) -> argparse.ArgumentParser:
    """`CONFIG [--out DIR] [--resume DIR] [--overwrite] [--set KEY=VALUE ...]`, as every run command takes them."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("config", help="YAML config, e.g. configs/digits.yaml")
    parser.add_argument("--out", help="results folder (overrides the config's `out`)")
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument("--quiet", action="store_true", help="print warnings only, no line a round")
    talk.add_argument("--verbose", action="store_true", help="print how each round went in detail too")
    if resume:
        parser.add_argument(
            "--resume",
            metavar="DIR",
            help="continue the run whose results folder is DIR from its last checkpoint "
            "(same config and --set options; DIR must hold an intact checkpoint)",
        )
        parser.add_argument(
            "--readmit",
            metavar="SILOS",
            help="with --resume: let these silos (e.g. 3,5, or all), dropped in the run being resumed and "
            "mended since, take part again; the others it dropped stay out",
        )
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="start afresh in a results folder that already holds a run, deleting that run's files",
        )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value by its dotted key, e.g. --set train.rounds=2",
    )
    return parser


def load_run_config(args: argparse.Namespace) -> Config:
    """The config the arguments describe, its data checked (ConfigError on any problem)."""
    resume = getattr(args, "resume", None)
    if resume and args.out and Path(args.out).resolve() != Path(resume).resolve():
        raise ConfigError(f"--out: cannot be combined with --resume (the run continues in its own folder {resume})")
    if getattr(args, "readmit", None) is not None and not resume:
        raise ConfigError("--readmit: needs --resume (it lets silos dropped in the run being resumed take part again)")
    out = resume or args.out
    cfg = load_config(args.config, [*args.overrides, *([f"out={out}"] if out else [])])
    cfg.data.check(cfg.data_facts())
    return cfg


def check_results_folder(cfg: Config, args: argparse.Namespace) -> None:
    """By the one process that writes results, right after `load_run_config` and before any
    heavy import: what `--resume`, `--out` and `--overwrite` ask of the folder, as far as its
    text files tell (runtime/checkpoint.py `check_results_folder`). ConfigError otherwise."""
    from .runtime.checkpoint import check_results_folder as check

    check(cfg, bool(args.resume), args.overwrite)


def prepare_results_folder(cfg: Config, args: argparse.Namespace) -> None:
    """After data preparation, by the same process: `--resume` needs arrays that fit θ(0) and
    the strategy (built with torch); `--overwrite` removes the run only now, every check
    passed. ConfigError otherwise."""
    from .reporting.results import remove_run
    from .runtime.checkpoint import check_resume_arrays

    if args.resume:
        check_resume_arrays(cfg, cfg.results_dir())
    if args.overwrite:
        remove_run(cfg.results_dir())


def find_mpirun() -> str | None:
    """The mpirun next to this Python (the `mpich` extra's, in the virtual environment), else the
    one on PATH (a site's MPI); None if neither exists."""
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else shutil.which("mpirun")


NO_MPIRUN = "no mpirun next to this Python nor on PATH (activate the virtual environment, or pip install mpich)"


def announce(cfg: Config, hosted: str) -> None:
    """The job's first line, as soon as its config is valid: the minutes before round 1 ends
    are not silent. `hosted`: where the silos run, e.g. "on 8 ranks (one per rank)"."""
    say(
        f"{cfg.name}: {cfg.strategy.name}, {count(cfg.silos, 'silo')} {hosted}, "
        f"{count(cfg.train.rounds, 'round')}; results in {cfg.results_dir()}"
    )


def exit_now(code: int) -> NoReturn:
    """End the simulator's process once its results are on disk (metrics.jsonl is flushed per
    round, the checkpoint fsynced), without the interpreter's teardown: a simulated run,
    complete, once aborted in it ("terminate called without an active exception")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_rank(code: int) -> NoReturn:
    """End an MPI rank once MPI is finalized and the results are on disk: the C libraries' exit
    handlers run (libc's `exit`), the interpreter's teardown does not. Unloading torch, scipy
    and scikit-learn costs every process CPU, which many ranks on few cores pay one after
    another. Skipping the C handlers too (`os._exit`) is wrong under MPICH's hydra: its proxy
    takes such a rank, exit code 0, for one that died without finalizing and kills the job's
    other ranks (mpiexec exit 9, "Killed (signal 9)"; docs/research/PERFORMANCE.md, "Start-up and exit")."""
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).exit(code)
    raise AssertionError("unreachable: libc exit returned")


def config_error(message: str, prog: str = "cfl_mpi") -> NoReturn:
    print(f"{prog}: config error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG)


def split_list(text: str, what: str, prog: str, cast: Callable[[str], T]) -> list[T]:
    """A command-line option's comma-separated values, each `cast`, at least one and no repeats;
    else a config error naming `--what`."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = [cast(t) for t in items]
    except ValueError:
        config_error(f"--{what}: expected a comma-separated list, got {text!r}", prog)
    if not values or len(set(values)) != len(values):
        config_error(f"--{what}: give at least one, without repeats, got {text!r}", prog)
    return values
