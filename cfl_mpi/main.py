"""`mpirun -n <ranks> python -m cfl_mpi.main CONFIG [--out DIR] [--resume DIR] [--set key=value ...]`

Rank 0 is the server; ranks 1..R host the silos, one each (R = silos) or in blocks of
consecutive silos that share the rank's device and torch (`runtime.silos_per_rank`, or
derived from the rank count). The MPI backend (backends/mpi/backend.py) runs the ranks.
"""

from __future__ import annotations

import os

# numpy's OpenBLAS starts a thread per core as it loads, in every rank (41 ranks on a node: 41
# such pools, each thread spinning a while): it starts with one, and the job runner sets the
# rank's share of the node's cores once the rank is placed (backends/job.py, limit_threads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from . import console  # noqa: E402 - after the thread count numpy's BLAS reads as it loads
from .cli import run_arguments  # noqa: E402
from .runtime.stop import defer_stop_signals  # noqa: E402
from .runtime.timeline import mark  # noqa: E402

DESCRIPTION = "Run a clustered federated learning job under MPI: rank 0 is the server, the other ranks host the silos."


def cli(argv: list[str] | None = None) -> None:
    # SLURM's warning or a Ctrl-C may come while the ranks still start (a requeued job's first
    # seconds): it waits until each rank knows whether it is the server (stop after the round)
    # or a silo.
    defer_stop_signals()
    mark("imports")
    args = run_arguments("python -m cfl_mpi.main", DESCRIPTION).parse_args(argv)
    console.setup(console.level_of(args.quiet, args.verbose))
    from .backends.mpi.backend import run_rank

    run_rank(args)


if __name__ == "__main__":
    cli()
