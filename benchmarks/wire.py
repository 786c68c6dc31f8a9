"""The wire: model transfer through the MPI channel against a memcpy of the same bytes, and
how much waiting ranks slow a working one.

    python -m benchmarks.wire [--quick]

1. Two ranks (server → silo 0 through `MpiChannel`, raw buffers behind a typed header): the
   time from posting a message of 1, 14 and 45 MB until the receiver's acknowledgement, as
   throughput, next to `np.copyto` of the same bytes in one process.
2. One rank doing fixed work (single-threaded matrix products, the shape of a silo embedding)
   alone, and with 8 more ranks blocked in `recv` on the same cores (a real run's waiting
   silos): the slowdown is what the channel's polling costs the ranks that work.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import numpy as np

SIZES_MB = (1, 14, 45)
WAITING = 8


def work(repeats: int) -> float:
    """Seconds of fixed single-threaded work."""
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).normal(size=(512, 512)).astype(np.float32)
    with threadpool_limits(1):
        start = time.perf_counter()
        for _ in range(repeats):
            a = np.tanh(a @ a.T / 512)
        return time.perf_counter() - start


def worker(mode: str, repeats: int) -> None:
    from mpi4py import MPI

    from cfl_mpi.channel import SERVER
    from cfl_mpi.channel.layout import RankLayout
    from cfl_mpi.channel.local import LocalHub
    from cfl_mpi.channel.mpi import MpiChannel
    from cfl_mpi.config import RuntimeConfig
    from cfl_mpi.wire.messages import Expect, message_kind

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:  # the baseline: no rank waits beside the working one
        print(f"{work(repeats):.4f}", flush=True)
        return
    layout = RankLayout(size - 1, size - 1)
    me = SERVER if rank == 0 else layout.silos_on(rank)[0]
    rt = RuntimeConfig()  # the runtime's default polling
    channel = MpiChannel(me, comm, layout, LocalHub(), threading.Lock(), rt.message_timeout_s,
                         rt.max_poll_sleep_ms / 1000, rt.payload_timeout_s)
    blob, ack = message_kind("bench_blob"), message_kind("bench_ack")
    if mode == "transfer":
        for i, mb in enumerate(SIZES_MB):
            arrays = {"w": np.ones(mb * (1 << 20) // 4, dtype=np.float32)}
            times = []
            for r in range(repeats):
                comm.Barrier()
                if rank == 0:
                    start = time.perf_counter()
                    channel.send(0, blob, i * 100 + r, arrays)
                    channel.recv(0, Expect(ack, i * 100 + r))
                    times.append(time.perf_counter() - start)
                else:
                    channel.recv(SERVER, Expect.like(blob, i * 100 + r, arrays))
                    channel.send(SERVER, ack, i * 100 + r)
            if rank == 0:
                copy = np.empty_like(arrays["w"])
                copies = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    np.copyto(copy, arrays["w"])
                    copies.append(time.perf_counter() - start)
                t, c = float(np.median(times)), float(np.median(copies))
                print(f"| {mb} | {mb / 1.048576 / t:.0f} | {mb / 1.048576 / c:.0f} | {t / c:.1f} |", flush=True)
    else:  # rank 0 works; every other rank waits in recv until it is done
        if rank == 0:
            seconds = work(repeats)
            for silo in range(size - 1):
                channel.send(silo, ack, 0)
            print(f"{seconds:.4f}", flush=True)
        else:
            channel.recv(SERVER, Expect(ack, 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", choices=["transfer", "waiting"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.repeats)
        return
    from .runs import ROOT, mpirun

    def launch(n: int, mode: str, repeats: int) -> str:
        cmd = [mpirun(), "-n", str(n), sys.executable, "-m", "benchmarks.wire", "--worker", mode,
               "--repeats", str(repeats)]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout

    repeats = 3 if args.quick else 5
    print("| MB | channel MB/s | memcpy MB/s | channel / memcpy time |\n|---|---|---|---|")
    print(launch(2, "transfer", repeats).strip())
    steps = 60 if args.quick else 200
    alone, waited = [], []
    for _ in range(repeats):  # interleaved: both see the same machine load
        alone.append(float(launch(1, "waiting", steps)))
        waited.append(float(launch(1 + WAITING, "waiting", steps)))
    print(f"\nworking rank with {WAITING} ranks waiting in recv / alone: "
          f"{np.median(waited) / np.median(alone):.2f} (median of {repeats}; "
          f"{np.median(alone):.2f} s alone)")


if __name__ == "__main__":
    main()
