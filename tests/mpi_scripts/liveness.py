"""Run under `mpirun -n 4` (one machine). Rank 0 watches ranks 1-3 (silos 0-2) with heartbeats
every 0.2 s and a 1.2 s timeout: rank 1 beats, then says goodbye; rank 2 beats throughout;
rank 3 stops beating. Then rank 1 sends a heartbeat of the wrong size. Rank 0 prints a JSON report."""

import json
import time

import numpy as np
from mpi4py import MPI

from cfl_mpi.backends.mpi.liveness import Liveness
from cfl_mpi.channel import RankLayout
from cfl_mpi.wire.messages import ProtocolError

world = MPI.COMM_WORLD
rank = world.Get_rank()
liveness = Liveness(world, RankLayout(3, 3), ["vm"] * 4, interval_s=0.2, timeout_s=1.2)
report: dict = {}
start = time.monotonic()
if rank == 0:
    lost = None
    while lost is None and time.monotonic() - start < 10:
        lost = liveness.poll(time.monotonic())
        time.sleep(0.01)
    report["lost"], report["after_s"] = lost, round(time.monotonic() - start, 2)
    report["watched"] = sorted(liveness.heard)
    world.Barrier()
    try:
        while time.monotonic() - start < 20:
            liveness.poll(time.monotonic())
            time.sleep(0.01)
    except ProtocolError as err:
        report["hostile"] = str(err)
    print(json.dumps(report), flush=True)
elif rank == 1:
    while time.monotonic() - start < 0.5:
        liveness.poll(time.monotonic())
        time.sleep(0.01)
    liveness.goodbye()
    world.Barrier()
    liveness.comm.Send(np.zeros(5, dtype=np.uint8), dest=0)
elif rank == 2:
    while time.monotonic() - start < 3:
        liveness.poll(time.monotonic())
        time.sleep(0.01)
    world.Barrier()
else:
    world.Barrier()  # rank 3 never beats
