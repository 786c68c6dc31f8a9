"""Where a rank runs: its node-local group, its device and its share of the node's cores."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ..config import RuntimeConfig


@dataclass(frozen=True)
class Placement:
    node_rank: int        # rank within the node (shared-memory split of COMM_WORLD)
    node_silos: int       # silos hosted on this node (the server is not one)
    local_rank: int       # index of this rank among the node's silo ranks: its device (-1: the server)
    silos: int            # silos this rank hosts
    cores: int            # cores this process may use

    @property
    def threads(self) -> int:
        """Torch (and BLAS) threads per silo, so that the node's silos × threads fit its cores."""
        if self.silos == 0:
            return 1
        return max(1, self.cores // max(1, self.node_silos))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# Emulates K nodes on one machine (tests): consecutive blocks of ranks form the "nodes".
NODE_GROUPS_ENV = "CFL_NODE_GROUPS"


def place(comm, silos: int) -> Placement:
    """Split COMM_WORLD by shared memory (one group per node) and count the silos in it."""
    from mpi4py import MPI

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
    writes the results (41 ranks on 2 cores: 10 s to write them instead of 0.5 s)."""
    sleep = 5e-5
    while not request.Test():
        time.sleep(sleep)
        sleep = min(2 * sleep, MAX_QUIET_SLEEP_S)


def device_for(local_rank: int):
    """`cuda:(local_rank % device_count)` when CUDA is present and the party is a silo rank,
    else the CPU (the server needs no GPU and never initialises CUDA).

    Under SLURM with one GPU per task, CUDA_VISIBLE_DEVICES already holds a single device
    and device_count() is 1, so every silo takes cuda:0 of its own view. Several silos of a
    rank (`runtime.silos_per_rank`) share its device.
    """
    import torch

    if local_rank >= 0 and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        deterministic_cuda()
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    return torch.device("cpu")


def deterministic_cuda() -> None:
    """A run stays a function of its config and seed on a GPU too (same hardware): cuDNN picks
    deterministic kernels rather than the fastest of a timing race, and cuBLAS gets the fixed
    workspace its deterministic mode needs (read when its first handle is made, so set before
    any CUDA work). Operations without a deterministic kernel warn instead of failing."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


def select_device(placement: Placement):
    """The device this rank's silos share."""
    return device_for(placement.local_rank)


if __name__ == "__main__":  # `mpirun -n K python -m cfl_mpi.runtime.placement`: where each rank runs
    import json

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    mine = place(world, silos=int(world.Get_rank() > 0))
    fields = ("node_rank", "node_silos", "local_rank", "silos", "cores", "threads", "cuda_index")
    device = select_device(mine)
    row = np.array([getattr(mine, f) for f in fields[:-1]] + [-1 if device.index is None else device.index],
                   dtype=np.int64)
    table = np.empty((world.Get_size(), len(fields)), dtype=np.int64) if world.Get_rank() == 0 else None
    world.Gather(row, table, root=0)  # raw buffers: no pickle between ranks
    if world.Get_rank() == 0:  # cuda_index -1: the CPU
        print(json.dumps([{"rank": r, **dict(zip(fields, map(int, t)))} for r, t in enumerate(table)]))
