"""Runs the benchmark suite and writes a markdown report under benchmarks/results/.

    python -m benchmarks [--quick] [--before TREE] [--only NAME ...] [--with-others]

Benchmarks that compare code before and after a change run the tree BEFORE (default: a git
worktree of BEFORE_COMMIT, the code before the clustering round's speed work, made on first use)
side by side with this one, in the same run, and print ratios. `--quick` fits about twenty
minutes on a quiet 2-core machine; without it the scaling goes to 40 silos. `--with-others`
adds the single-purpose benchmarks (FedWaD, robust aggregation, curious server, cheaper
noise estimates).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .runs import ROOT, machine

BEFORE_COMMIT = "703ab81"
# name: (module, needs the before tree, extra arguments in quick mode)
SUITE = {
    "embedding": ("benchmarks.embedding", False, ["--quick"]),
    "w1": ("benchmarks.w1", False, ["--quick"]),
    "noise_estimate": ("benchmarks.noise_estimate", True, ["--quick"]),
    "whole_job": ("benchmarks.whole_job", True, ["--quick", "--repeats", "3"]),
    "clustering_scaling": ("benchmarks.clustering_scaling", True, ["--quick"]),
    "wire": ("benchmarks.wire", False, ["--quick"]),
    "checkpoint": ("benchmarks.checkpoint", False, ["--repeats", "2"]),
}
FULL_ONLY = {"startup"}  # 41 ranks: too many for --quick on a 2-core machine
SUITE["startup"] = ("benchmarks.startup", False, [])
OTHERS = {
    "fedwad": ("benchmarks.fedwad", False, []),
    "robust_aggregation": ("benchmarks.robust_aggregation", False, []),
    "curious_server": ("benchmarks.curious_server", False, []),
    "noise_variants": ("benchmarks.noise_variants", True, ["--quick"]),
}


def before_tree(path: Path | None) -> Path:
    """The tree to compare against: `path`, or a detached worktree of BEFORE_COMMIT."""
    if path is not None:
        return path.resolve()
    tree = Path(tempfile.gettempdir()) / f"cfl_mpi_before_{BEFORE_COMMIT}"
    if not (tree / "cfl_mpi").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), BEFORE_COMMIT], cwd=ROOT, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--before", type=Path)
    parser.add_argument("--only", nargs="+", choices=[*SUITE, *OTHERS])
    parser.add_argument("--with-others", action="store_true")
    args = parser.parse_args()
    chosen = {k: v for k, v in SUITE.items() if not (args.quick and k in FULL_ONLY)}
    chosen |= OTHERS if args.with_others else {}
    chosen = {k: v for k, v in {**SUITE, **OTHERS}.items() if k in args.only} if args.only else chosen
    before = before_tree(args.before) if any(v[1] for v in chosen.values()) else None
    stamp = datetime.datetime.now(datetime.timezone.utc)
    lines = [
        f"# Benchmarks, {'quick' if args.quick else 'full'} run, {stamp:%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {machine()}",
        "",
        f"Command: `python -m benchmarks {' '.join(sys.argv[1:])}`"
        + (f"; before = {before} ({BEFORE_COMMIT})" if before else ""),
        "",
    ]
    for name, (module, needs_before, quick_args) in chosen.items():
        cmd = [
            sys.executable,
            "-m",
            module,
            *([str(before)] if needs_before else []),
            *(quick_args if args.quick else []),
        ]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - start
        print(proc.stdout, proc.stderr[-2000:] if proc.returncode else "", flush=True)
        lines += [
            f"## {name}",
            "",
            f"`python -m {' '.join(cmd[2:])}` — {wall:.0f} s"
            + ("" if proc.returncode == 0 else f", FAILED (exit {proc.returncode})"),
            "",
            proc.stdout.strip(),
            "",
        ]
        if proc.returncode:
            lines += ["```", proc.stderr[-2000:].strip(), "```", ""]
    out = ROOT / "benchmarks" / "results" / f"{stamp:%Y%m%d-%H%M}-{'quick' if args.quick else 'full'}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"report: {out}")


if __name__ == "__main__":
    main()
