"""The MPI backend: the ranks of `python -m cfl_mpi.main` (main.py parses its arguments; the
job runner, backends/job.py, runs the job on them). Rank 0 hosts the server; ranks 1..R host the
silos, one each (R = silos) or in blocks of consecutive silos that share the rank's device and
torch (`runtime.silos_per_rank`, or derived from the rank count). The ranks' start-up
collectives are non-blocking calls waited for asleep (`wait_quietly`); once the config is
agreed, a failure on any rank aborts the whole job.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from ...channel import SERVER, Channel, LocalHub, RankLayout
from ...cli import exit_rank
from ...config import Config, check_world
from ...runtime.placement import Placement
from ...runtime.timeline import mark
from ..job import run_job
from .placement import place, wait_quietly

__all__ = ["MpiBackend", "run_rank"]

# Seconds between a failing rank's last words and MPI_Abort: the launcher's proxy forwards what
# the rank wrote only while the rank lives (output before MPI_Abort can be lost: see
# results.record_failure, which keeps it in the results folder in any case).
ABORT_GRACE_S = 1.0


class MpiBackend:
    """The job's processes are the ranks of `comm`."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.index, self.size, self.units = comm.Get_rank(), comm.Get_size(), ("rank", "ranks")
        self.layout: RankLayout | None = None

    def parties(self, cfg: Config) -> list[list[int]]:
        self.layout = RankLayout(cfg.silos, check_world(cfg, self.size))
        return [[SERVER] if r == 0 else list(self.layout.silos_on(r)) for r in range(self.size)]

    def all_gather(self, data: bytes) -> list[bytes]:
        sizes = np.empty(self.size, dtype=np.int64)
        wait_quietly(self.comm.Iallgather(np.array([len(data)], dtype=np.int64), sizes))
        every = np.empty(int(sizes.sum()), dtype=np.uint8)
        wait_quietly(self.comm.Iallgatherv(np.frombuffer(data, dtype=np.uint8), [every, sizes.tolist()]))
        ends = np.cumsum(sizes)
        return [every[end - size : end].tobytes() for size, end in zip(sizes.tolist(), ends.tolist())]

    def place(self, silos: int) -> Placement:
        return place(self.comm, silos)

    @contextmanager
    def channels(
        self, cfg: Config, hub: LocalHub, hosts: list[str], lost: Callable[[str], None]
    ) -> Iterator[Callable[[int], Channel]]:
        """The rank's inbox (with heartbeats to the ranks it watches) and its parties' channels."""
        from .channel import MpiChannel, MpiInbox
        from .liveness import Liveness

        assert self.layout is not None, "parties() places the silos on the ranks first"
        rt, layout = cfg.runtime, self.layout
        liveness = Liveness(self.comm, layout, hosts, rt.heartbeat_s, rt.heartbeat_timeout_s)
        max_sleep_s = rt.max_poll_sleep_ms / 1000
        with MpiInbox(self.comm, layout, hub, threading.Lock(), max_sleep_s, liveness, lost) as inbox:

            def channel(address: int) -> Channel:
                return MpiChannel(address, inbox, rt.message_timeout_s, max_sleep_s, rt.payload_timeout_s)

            yield channel

    def name(self, process: int) -> str:
        return f"rank {process}"

    def who(self, role: str) -> str:
        return f"rank {self.index} ({role})"

    def abort(self) -> NoReturn:
        time.sleep(ABORT_GRACE_S)
        self.comm.Abort(1)
        # MPICH's MPI_Abort has returned in the inbox's thread (a node's loss, while the job was
        # already going down): end the process here, not with an error that buries the cause
        os._exit(1)

    def finish(self) -> None:
        """MPI_Finalize waits for every rank, spinning: the silos, done at STOP, wait here
        asleep while the server writes the results folder. mpi4py would finalize only after the
        interpreter's own teardown (Py_AtExit), which ends at different times on different
        ranks, the first ones spinning meanwhile; finalizing now, all ranks together, avoids that."""
        wait_quietly(self.comm.Ibarrier())
        MPI.Finalize()

    def exit(self, code: int) -> NoReturn:
        exit_rank(code)


def run_rank(args: argparse.Namespace) -> NoReturn:
    """This rank's part of the job `args` describe."""
    mark("mpi_init")
    run_job(args, MpiBackend(MPI.COMM_WORLD))
