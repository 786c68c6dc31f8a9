"""Where a rank runs: its node-local group, its device and its share of the node's cores."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI


@dataclass(frozen=True)
class Placement:
    node_rank: int        # rank within the node (shared-memory split of COMM_WORLD)
    node_silos: int       # silo ranks on this node (the server is not counted)
    local_silo: int       # index of this silo among the node's silos (-1 for the server)
    cores: int            # cores this process may use

    @property
    def threads(self) -> int:
        """Torch threads so that silos × threads does not exceed the node's cores."""
        if self.local_silo < 0:
            return 1
        return max(1, self.cores // max(1, self.node_silos))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# Emulates K nodes on one machine (tests): consecutive blocks of ranks form the "nodes".
NODE_GROUPS_ENV = "CFL_NODE_GROUPS"


def place(comm: MPI.Comm, is_silo: bool) -> Placement:
    """Split COMM_WORLD by shared memory (one group per node) and count the silos in it."""
    groups = int(os.environ.get(NODE_GROUPS_ENV, "0"))
    if groups > 0:
        size = comm.Get_size()
        node = comm.Split(color=comm.Get_rank() * groups // size, key=comm.Get_rank())
    else:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        flags = np.zeros(node.Get_size(), dtype=np.int64)
        node.Allgather(np.array([int(is_silo)], dtype=np.int64), flags)
        node_rank = node.Get_rank()
    finally:
        node.Free()
    local_silo = int(flags[:node_rank].sum()) if is_silo else -1
    return Placement(node_rank, int(flags.sum()), local_silo, usable_cores())


def select_device(placement: Placement):
    """`cuda:(local silo index) % device_count` when CUDA is present, else the CPU.

    Under SLURM with one GPU per task, CUDA_VISIBLE_DEVICES already holds a single device
    and device_count() is 1, so every silo takes cuda:0 of its own view.
    """
    import torch

    if placement.local_silo >= 0 and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device(f"cuda:{placement.local_silo % torch.cuda.device_count()}")
    return torch.device("cpu")


if __name__ == "__main__":  # `mpirun -n K python -m cfl_mpi.runtime.placement`: where each rank runs
    import json

    world = MPI.COMM_WORLD
    mine = place(world, is_silo=world.Get_rank() > 0)
    fields = ("node_rank", "node_silos", "local_silo", "cores", "threads")
    row = np.array([getattr(mine, f) for f in fields], dtype=np.int64)
    table = np.empty((world.Get_size(), len(fields)), dtype=np.int64) if world.Get_rank() == 0 else None
    world.Gather(row, table, root=0)  # raw buffers: no pickle between ranks
    if world.Get_rank() == 0:
        print(json.dumps([{"rank": r, **dict(zip(fields, map(int, t)))} for r, t in enumerate(table)]))
