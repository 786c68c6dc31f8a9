"""Where the ranks of an MPI job run: the node each is on (a shared-memory split of the world),
and the wait for a collective of the job's start that spins no core.

`mpirun -n K python -m cfl_mpi.backends.mpi.placement` prints where each rank runs.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from ...config.runtime import RuntimeConfig
from ...runtime.placement import Placement, select_device, usable_cores

# Emulates K nodes on one machine (tests): consecutive blocks of ranks form the "nodes".
NODE_GROUPS_ENV = "CFL_NODE_GROUPS"


def place(comm: MPI.Comm, silos: int) -> Placement:
    """Split COMM_WORLD by shared memory (one group per node) and count the silos in it."""
    groups = int(os.environ.get(NODE_GROUPS_ENV, "0"))
    if groups > 0:
        size = comm.Get_size()
        node = comm.Split(color=comm.Get_rank() * groups // size, key=comm.Get_rank())
    else:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        hosted = np.zeros(node.Get_size(), dtype=np.int64)
        node.Allgather(np.array([silos], dtype=np.int64), hosted)
        node_rank = node.Get_rank()
    finally:
        node.Free()
    local_rank = int(np.count_nonzero(hosted[:node_rank])) if silos else -1
    return Placement(node_rank, int(hosted.sum()), local_rank, silos, usable_cores())


# Longest sleep between two tests of a request that waits for other ranks: the channels'
# default back-off cap (these waits come before the config is agreed on).
MAX_QUIET_SLEEP_S = RuntimeConfig.max_poll_sleep_ms / 1000


def wait_quietly(request) -> None:
    """Wait for a non-blocking MPI request, testing it between sleeps that double up to
    MAX_QUIET_SLEEP_S. MPICH's (and Open MPI's) blocking calls spin a core until the other
    ranks arrive: where many ranks share a node's cores, the ranks that arrive first would
    take the CPU from those still starting up, and at the end of a run from the server that
    writes the results."""
    sleep = 5e-5
    while not request.Test():
        time.sleep(sleep)
        sleep = min(2 * sleep, MAX_QUIET_SLEEP_S)


def main() -> None:
    """`mpirun -n K python -m cfl_mpi.backends.mpi.placement`: one JSON line, where each rank runs."""
    import argparse
    import json

    argparse.ArgumentParser(
        prog="python -m cfl_mpi.backends.mpi.placement",
        description="Print, as one JSON line from rank 0, the node, local rank, silos, cores, threads and "
        "GPU of every rank of the MPI job it is started in (under mpirun or srun).",
    ).parse_args()
    world = MPI.COMM_WORLD
    mine = place(world, silos=int(world.Get_rank() > 0))
    fields = ("node_rank", "node_silos", "local_rank", "silos", "cores", "threads", "cuda_index")
    device = select_device(mine)
    row = np.array(
        [getattr(mine, f) for f in fields[:-1]] + [-1 if device.index is None else device.index], dtype=np.int64
    )
    if world.Get_rank():
        world.Gather(row, None, root=0)  # raw buffers: no pickle between ranks
    else:  # cuda_index -1: the CPU
        table = np.empty((world.Get_size(), len(fields)), dtype=np.int64)
        world.Gather(row, table, root=0)
        print(json.dumps([{"rank": r, **dict(zip(fields, map(int, t)))} for r, t in enumerate(table)]))


if __name__ == "__main__":
    main()
