"""Which `srun --mpi=` plugin starts the MPI library mpi4py runs on, and a check that it did.

`python -m cfl_mpi.backends.mpi.srun` prints the plugin: $CFL_SRUN_MPI if set, else the one the
library speaks. MPICH and its derivatives (the pip `mpich` wheel the README installs, Intel
MPI, MVAPICH) speak PMI-2 unless built with PMIx, Open MPI speaks PMIx; `srun --mpi=pmix`
makes every rank of the MPICH wheel abort ("unsupported PMI version PMIx").
`srun ... python -m cfl_mpi.backends.mpi.srun --check-world N` exits 0 only if the ranks form one
MPI world of N (a wrong plugin aborts every rank, or gives N worlds of one rank).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

DESCRIPTION = "Print the srun --mpi= plugin that starts the MPI library mpi4py runs on."

ENV = "CFL_SRUN_MPI"


def plugin_for(library_version: str) -> str:
    """The srun plugin for an MPI library, from its MPI_Get_library_version string."""
    text = library_version.lower()
    if "open mpi" in text:
        return "pmix"
    if "mpich" in text or "intel(r) mpi" in text or "mvapich" in text:
        configure = next((line for line in text.splitlines() if "configure" in line), "")
        return "pmix" if "pmix" in configure else "pmi2"
    return "pmix"


def library_version() -> str:
    """MPI_Get_library_version, callable before MPI_Init: nothing is initialised here."""
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    return MPI.Get_library_version()


def chosen_plugin() -> str:
    return os.environ.get(ENV) or plugin_for(library_version())


def check_world(ranks: int, timeout_s: int = 60) -> int:
    """Exit status of one rank: 0 if COMM_WORLD has `ranks` ranks. A PMI that never answers
    would hang MPI_Init: the alarm's default action ends the process instead (60 s)."""
    signal.alarm(timeout_s)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # SLURM's warning, if this early, is for the run
    from mpi4py import MPI

    return 0 if MPI.COMM_WORLD.Get_size() == ranks else 3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cfl_mpi.backends.mpi.srun", description=DESCRIPTION)
    parser.add_argument("--check-world", type=int, metavar="N", help="under srun: exit 0 iff one world of N ranks")
    args = parser.parse_args(argv)
    if args.check_world is not None:
        sys.exit(check_world(args.check_world))
    print(chosen_plugin())


if __name__ == "__main__":
    main()
