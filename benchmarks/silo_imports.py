"""What a silo rank's strategy half costs at start-up: the modules it loads before round 1
(`SiloProtocol.modules`), timed in fresh processes that have already imported what every rank
imports (torch, numpy, the package), against another list of modules, interleaved.

    python -m benchmarks.silo_imports [--config configs/digits.yaml] [--against cfl_mpi.ot.solvers]
        [--repeats 10] [--set KEY=VALUE ...]

Each repeat starts one process per list; a process reports the CPU seconds (its user + system
time, which another job on the machine inflates far less than wall time) and the wall seconds
of importing its list, and which of POT, scipy.optimize and scikit-learn it then holds. Prints
medians, their ratio and each list.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from cfl_mpi.config import load_config
from cfl_mpi.strategies.base import SiloProtocol

from .runs import ROOT

PROBE = """
import json, resource, sys, time
import numpy, torch
import cfl_mpi.runtime.silo, cfl_mpi.strategies.emdcfl.silo
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c, w = cpu(), time.perf_counter()
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps({"cpu": cpu() - c, "wall": time.perf_counter() - w,
                  "held": [m for m in ("ot", "scipy.optimize", "sklearn") if m in sys.modules]}))
"""


def silo_modules(config: str, overrides: list[str]) -> list[str]:
    """What the config's silo half loads before round 1 (runtime/halves.py `loaded`)."""
    from cfl_mpi.runtime.halves import EVERY_PARTY, halves, run_facts

    cfg = load_config(config, overrides)
    half: SiloProtocol = halves(cfg).silo(cfg.strategy, run_facts(cfg))
    return [*EVERY_PARTY, *half.modules()]


def probe(modules: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *modules], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/digits.yaml")
    parser.add_argument("--against", default="cfl_mpi.ot.solvers", help="comma-separated modules to compare with")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    lists = {
        "the silo half's": silo_modules(args.config, args.overrides),
        "against": ["numpy.random", *args.against.split(",")],
    }
    runs: dict[str, list[dict]] = {name: [] for name in lists}
    for _ in range(args.repeats):
        for name, modules in lists.items():
            runs[name].append(probe(modules))
    print(f"{args.config} {' '.join(args.overrides)}: {args.repeats} interleaved processes each, medians\n")
    print("| modules | CPU s | wall s | holds |\n|---|---|---|---|")
    medians = {}
    for name, modules in lists.items():
        cpu = statistics.median(r["cpu"] for r in runs[name])
        wall = statistics.median(r["wall"] for r in runs[name])
        medians[name] = cpu
        print(f"| {name}: {', '.join(modules)} | {cpu:.3f} | {wall:.3f} | {', '.join(runs[name][0]['held']) or '-'} |")
    ratio = medians["the silo half's"] / medians["against"]
    print(f"\nCPU ratio (the silo half's / against): {ratio:.3f}")


if __name__ == "__main__":
    main()
