"""The wire: messages through the MPI channel against raw mpi4py buffers of the same bytes,
and how much waiting ranks slow a working one.

    python -m benchmarks.wire [--quick]

1. Two ranks, one way (server → silo 0): from posting a message of 1, 3.5 (the simple CNN's
   ω), 14 and 45 MB until the receiver holds it, checked. `MpiChannel` (typed header, raw
   buffers, a fresh array per message, the finite check) side by side with raw mpi4py `Send`
   / `Recv` of the same bytes, into a reused buffer and into a fresh one, in one job; ratios
   are channel / raw throughput. The clocks are CLOCK_MONOTONIC (`time.perf_counter`), one
   clock for every process of the machine.
2. One rank doing fixed work (single-threaded matrix products, the shape of a silo embedding)
   alone, and with 8 more ranks blocked in `recv` on the same cores (a real run's waiting
   silos): the slowdown is what the channel's polling costs the ranks that work.
3. 1, 100 and 500 silos on one rank, each waiting in `recv` on its thread for 5 s: the
   rank's CPU seconds per second (one rank of a many-silo run while others compute).
4. The server sends each of 100 and 1,200 silos on each of two ranks one message of two
   small arrays (EMD-CFL's plan at C = 2,400), all waiting in `recv`: seconds until every
   silo holds its own.
5. EMD-CFL's placing stage at C = 2,400 without its computations (`--worker handshake
   --parties 1200` under `mpirun -n 3`): every silo takes its plan, offers its key to 4
   representatives (two on each rank) and takes theirs, takes their ω and sends the server
   its clouds; each representative offers its key and ω to every other silo, takes their keys
   in order and sends its own clouds. Seconds until the server holds every silo's clouds, and
   the CPU seconds of each rank: the channel's share of the stage's burst, in which 1,200
   silo threads of a rank wake at once.
6. An update fan-in at C = 2,400 (`--worker fanin --parties 1200` under `mpirun -n 3`): every
   silo of the two silo ranks sends the server an update of IFCA's MLP (784-200-10, 636 KB),
   which the server takes only after FAN_IN_DELAY_S (it is still waiting for the last silos'
   identity step, say), while each silo rank's main thread computes as a compute worker does.
   That work's seconds with the rank's silos waiting on their sends against alone (the same
   process, just before), the seconds until the server holds every update, and each rank's
   CPU seconds and context switches.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import threading
import time

import numpy as np

SIZES_MB = (1, 3.5, 14, 45)
WAITING = 8
PARTIES = (1, 100, 500)  # silos waiting on one rank
FAN_OUT = (100, 1200)  # silos on each of two ranks, each sent one message (a staged plan's shape)
HANDSHAKE_PARTIES = 1200  # silos on each of two ranks: C = 2,400
FAN_IN_DELAY_S = 5.0  # the server takes the updates this long after they are sent
FAN_IN_WORK = 60  # the silo ranks' work meanwhile (a few seconds on one core)
WAIT_S = 5.0
PATHS = ("channel", "raw, reused buffer", "raw, fresh buffer")


def work(repeats: int) -> float:
    """Seconds of fixed work, single-threaded under `worker`'s thread limit."""
    a = np.random.default_rng(0).normal(size=(512, 512)).astype(np.float32)
    start = time.perf_counter()
    for _ in range(repeats):
        a = np.tanh(a @ a.T / 512)
    return time.perf_counter() - start


def one_way(comm, send, receive, repeats: int) -> float:
    """Median seconds from rank 0 posting a message to rank 1 holding it."""
    from mpi4py import MPI

    times = np.empty(repeats)
    for r in range(repeats):
        comm.Barrier()
        stamp = np.array([time.perf_counter()])
        if comm.Get_rank() == 0:
            send(r)
        else:
            receive(r)
            stamp[0] = time.perf_counter()
        posted, held = (np.empty(1) for _ in range(2))
        comm.Allreduce(stamp if comm.Get_rank() == 0 else np.array([np.inf]), posted, op=MPI.MIN)
        comm.Allreduce(stamp if comm.Get_rank() == 1 else np.array([-np.inf]), held, op=MPI.MAX)
        times[r] = held[0] - posted[0]
    return float(np.median(times))


def print_transfer(comm, channel, blob, repeats: int) -> None:
    """One row per size: MB/s of each path and the channel's ratio to raw mpi4py."""
    from mpi4py import MPI

    from cfl_mpi.channel import SERVER
    from cfl_mpi.wire.messages import Expect

    if comm.Get_rank() == 0:
        print(
            f"| MB | {' MB/s | '.join(PATHS)} MB/s | channel / raw, reused | channel / raw, fresh |\n"
            f"|---|---|---|---|---|---|",
            flush=True,
        )
    for mb in SIZES_MB:
        data = np.ones(int(mb * (1 << 20)) // 4, dtype=np.float32)
        raw = data.view(np.uint8)
        expect = lambda r: Expect.like(blob, r, {"w": data})  # noqa: E731, B023
        paths = {
            "channel": (lambda r: channel.send(0, blob, r, {"w": data}), lambda r: channel.recv(SERVER, expect(r))),  # noqa: B023 - called within this iteration
            "raw, reused buffer": (
                lambda r: comm.Send([raw, MPI.BYTE], 1, 1),  # noqa: B023 - called within this iteration
                lambda r: comm.Recv([raw, MPI.BYTE], 0, 1),  # noqa: B023 - called within this iteration
            ),
            "raw, fresh buffer": (
                lambda r: comm.Send([raw, MPI.BYTE], 1, 1),  # noqa: B023 - called within this iteration
                lambda r: comm.Recv([np.empty_like(raw), MPI.BYTE], 0, 1),  # noqa: B023 - called within this iteration
            ),
        }
        seconds = {path: [] for path in PATHS}
        for _ in range(repeats):  # interleaved: every path sees the same machine load
            for path, (send, receive) in paths.items():
                seconds[path].append(one_way(comm, send, receive, 3))
        if comm.Get_rank() == 0:
            rate = {path: mb / 1.048576 / float(np.median(t)) for path, t in seconds.items()}
            print(
                f"| {mb:g} | {' | '.join(f'{rate[p]:.0f}' for p in PATHS)} | "
                f"{rate['channel'] / rate['raw, reused buffer']:.2f} | "
                f"{rate['channel'] / rate['raw, fresh buffer']:.2f} |",
                flush=True,
            )


def worker(mode: str, repeats: int, parties: int) -> None:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # as a rank of a run with more ranks than cores (cfl_mpi.backends.job.limit_threads)
        _worker(mode, repeats, parties)


def _worker(mode: str, repeats: int, parties: int) -> None:
    from mpi4py import MPI

    from cfl_mpi.backends.mpi.channel import MpiChannel, MpiInbox
    from cfl_mpi.channel import SERVER
    from cfl_mpi.channel.layout import RankLayout
    from cfl_mpi.channel.local import LocalHub
    from cfl_mpi.config.runtime import RuntimeConfig
    from cfl_mpi.wire.messages import Expect, message_kind

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:  # the baseline: no rank waits beside the working one
        print(f"{work(repeats):.4f}", flush=True)
        return
    layout = (
        RankLayout(parties, 1)
        if mode == "parties"
        else RankLayout(parties * (size - 1), size - 1)
        if mode in ("fanout", "handshake", "fanin")
        else RankLayout(size - 1, size - 1)
    )
    here = [SERVER] if rank == 0 else list(layout.silos_on(rank))
    rt = RuntimeConfig()  # the runtime's default polling
    blob, ack = message_kind("bench_blob"), message_kind("bench_ack")
    # the channel's own communicator: the raw transfers below use COMM_WORLD
    with MpiInbox(comm.Dup(), layout, LocalHub(), threading.Lock(), rt.max_poll_sleep_ms / 1000) as inbox:
        channels = [
            MpiChannel(me, inbox, rt.message_timeout_s, rt.max_poll_sleep_ms / 1000, rt.payload_timeout_s)
            for me in here
        ]
        if mode == "transfer":
            print_transfer(comm, channels[0], blob, repeats)
        elif mode == "parties":  # rank 1's parties wait in recv, each on its thread, for WAIT_S
            if rank == 0:
                time.sleep(WAIT_S)
                for silo in range(parties):
                    channels[0].send(silo, ack, 0)
            else:
                cpu, start = time.process_time(), time.monotonic()
                threads = [threading.Thread(target=c.recv, args=(SERVER, Expect(ack, 0))) for c in channels]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                print(f"{(time.process_time() - cpu) / (time.monotonic() - start):.3f}", flush=True)
        elif mode == "fanout":  # the server sends each silo a plan-sized message; all wait in recv
            plan = {"partners": np.arange(4, dtype=np.int64), "roles": np.ones(4, dtype=np.uint8)}
            comm.Barrier()
            start = time.perf_counter()
            if rank == 0:
                sends = [channels[0].isend(silo, blob, 0, plan, more=1) for silo in range(layout.silos)]
                for pending in sends:
                    pending.wait()
            else:
                expect = Expect.like(blob, 0, plan, {"more": int})
                threads = [threading.Thread(target=c.recv, args=(SERVER, expect)) for c in channels]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            done = np.array([time.perf_counter() - start])
            slowest = np.empty(1)
            comm.Reduce(done, slowest, op=MPI.MAX, root=0)
            if rank == 0:
                print(f"{slowest[0]:.3f}", flush=True)
        elif mode == "handshake":
            placing_stage(comm, layout, channels)
        elif mode == "fanin":
            update_fan_in(comm, layout, channels, repeats)
        elif rank == 0:  # waiting: rank 0 works; every other rank waits in recv until it is done
            seconds = work(repeats)
            for silo in range(size - 1):
                channels[0].send(silo, ack, 0)
            print(f"{seconds:.4f}", flush=True)
        else:
            channels[0].recv(SERVER, Expect(ack, 0))


def placing_stage(comm, layout, channels) -> None:
    """Section 5: the messages of EMD-CFL's placing stage (strategies/emdcfl/server.py,
    silo.py), timed from a barrier."""
    from cfl_mpi.channel import SERVER
    from cfl_mpi.channel.base import wait_all
    from cfl_mpi.wire.messages import ArraySpec, Expect, message_kind

    plan_kind, key_kind, omega_kind, clouds_kind = (
        message_kind(f"bench_{k}") for k in ("plan", "key", "omega", "clouds")
    )
    silos = layout.silos
    reps = [0, 1, silos // 2, silos // 2 + 1]
    # the narrow CNN's ω (16 and 32 channels, 64-dimensional embedding) and projected clouds
    # of 90 images in 57 dimensions, as at C = 2,400 (configs/rotated_mnist_ifca_shape.yaml)
    omega = {f"w{i}": np.ones(n, np.float32) for i, n in enumerate((144, 16, 4608, 32, 100352, 64))}
    cloud = np.ones((90, 57), np.float32)
    plan_expect = Expect(plan_kind, 0, (ArraySpec("partners", "int64", (None,)),))
    key_expect = Expect(key_kind, 0, (ArraySpec("public_key", "uint8", (32,)),))
    omega_expect = Expect.like(omega_kind, 0, omega)
    clouds_expect = Expect(clouds_kind, 0, (ArraySpec("clouds", "float32", (None, 90, 57)),))

    def partners_of(silo: int) -> list[int]:
        return [s for s in range(silos) if s not in reps] if silo in reps else reps

    def silo(channel) -> None:
        partners = [int(p) for p in channel.recv(SERVER, plan_expect).arrays["partners"]]
        keys = channel.isend_all(partners, key_kind, 0, {"public_key": np.zeros(32, np.uint8)})
        omegas = channel.isend_all(partners, omega_kind, 0, omega) if channel.me in reps else None
        for p in partners:  # in order, as `_pair_seeds`
            channel.recv(p, key_expect)
        if omegas is None:
            for _ in channel.recv_each(partners, lambda _: omega_expect):
                pass
        channel.send(SERVER, clouds_kind, 0, {"clouds": np.stack([cloud] * len(partners))})
        wait_all([keys] + ([omegas] if omegas else []))

    comm.Barrier()
    start, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    if comm.Get_rank() == 0:
        server = channels[0]
        wait_all(
            [server.isend(s, plan_kind, 0, {"partners": np.array(partners_of(s), np.int64)}) for s in range(silos)]
        )
        for _ in server.recv_each(range(silos), lambda _: clouds_expect):
            pass
    else:
        threads = [threading.Thread(target=silo, args=(c,)) for c in channels]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    end = resource.getrusage(resource.RUSAGE_SELF)
    rows = comm.gather(
        (
            time.perf_counter() - start,
            end.ru_utime - usage.ru_utime,
            end.ru_stime - usage.ru_stime,
            end.ru_nvcsw - usage.ru_nvcsw + end.ru_nivcsw - usage.ru_nivcsw,
        ),
        root=0,
    )
    if comm.Get_rank() == 0:  # wall, then user + system CPU seconds and context switches per rank
        print(
            f"{max(r[0] for r in rows):.2f} s | "
            + " | ".join(f"{user:.2f} + {system:.2f} s, {switches / 1000:.0f}k" for _, user, system, switches in rows),
            flush=True,
        )


def update_fan_in(comm, layout, channels, repeats: int) -> None:
    """Section 6: the silos' updates wait for a busy server while their rank computes."""
    from cfl_mpi.channel import SERVER
    from cfl_mpi.wire.messages import Expect, message_kind

    update_kind = message_kind("bench_update")
    # IFCA's MLP (784-200-10); the silos of a rank send views of one set of arrays
    update = {"w0": np.ones((200, 784), np.float32), "b0": np.ones(200, np.float32)}
    update |= {"w1": np.ones((10, 200), np.float32), "b1": np.ones(10, np.float32)}
    alone = work(repeats) if comm.Get_rank() else 0.0
    comm.Barrier()
    start, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    if comm.Get_rank() == 0:
        time.sleep(FAN_IN_DELAY_S)
        expect = Expect.like(update_kind, 0, update)
        for _ in channels[0].recv_each(range(layout.silos), lambda _: expect):
            pass
        waited = 0.0
    else:
        threads = [threading.Thread(target=c.send, args=(SERVER, update_kind, 0, update)) for c in channels]
        for t in threads:
            t.start()
        waited = work(repeats)
        for t in threads:
            t.join()
    end = resource.getrusage(resource.RUSAGE_SELF)
    rows = comm.gather(
        (
            time.perf_counter() - start,
            waited / alone if alone else 0.0,
            end.ru_utime - usage.ru_utime + end.ru_stime - usage.ru_stime,
            end.ru_nvcsw - usage.ru_nvcsw + end.ru_nivcsw - usage.ru_nivcsw,
        ),
        root=0,
    )
    if comm.Get_rank() == 0:  # wall, the silo ranks' work with senders waiting / alone, CPU and switches per rank
        print(
            f"{max(r[0] for r in rows):.2f} s | "
            + ", ".join(f"{r[1]:.2f}" for r in rows[1:])
            + " | "
            + " | ".join(f"{cpu:.2f} s, {switches / 1000:.0f}k" for _, _, cpu, switches in rows),
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", choices=["transfer", "waiting", "parties", "fanout", "handshake", "fanin"])
    parser.add_argument("--parties", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.repeats, args.parties)
        return
    from .runs import ROOT, mpirun

    def launch(n: int, mode: str, repeats: int, parties: int = 1) -> str:
        cmd = [
            mpirun(),
            "-n",
            str(n),
            sys.executable,
            "-m",
            "benchmarks.wire",
            "--worker",
            mode,
            "--repeats",
            str(repeats),
            "--parties",
            str(parties),
        ]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout

    repeats = 3 if args.quick else 5
    print(launch(2, "transfer", repeats).strip())
    steps = 60 if args.quick else 200
    alone, waited = [], []
    for _ in range(repeats):  # interleaved: both see the same machine load
        alone.append(float(launch(1, "waiting", steps)))
        waited.append(float(launch(1 + WAITING, "waiting", steps)))
    print(
        f"\nworking rank with {WAITING} ranks waiting in recv / alone: "
        f"{np.median(waited) / np.median(alone):.2f} (median of {repeats}; "
        f"{np.median(alone):.2f} s alone)"
    )
    print("\n| silos waiting in recv on one rank | that rank's CPU seconds per second |\n|---|---|")
    for parties in PARTIES:
        print(f"| {parties} | {launch(2, 'parties', 1, parties).strip()} |", flush=True)
    print(
        "\n| silos on each of 2 ranks | seconds until each holds its message from the server (median of "
        f"{repeats}) |\n|---|---|"
    )
    for parties in FAN_OUT:
        seconds = [float(launch(3, "fanout", 1, parties)) for _ in range(repeats)]
        print(f"| {parties} | {np.median(seconds):.2f} |", flush=True)
    print(
        "\n| EMD-CFL's placing stage, 1,200 silos on each of 2 ranks | seconds | rank 0, 1, 2: user + system CPU "
        "seconds, context switches |\n|---|---|---|"
    )
    for _ in range(repeats):
        wall, ranks = launch(3, "handshake", 1, HANDSHAKE_PARTIES).strip().split(" s | ", 1)
        print(f"| | {wall} | {ranks} |", flush=True)
    print(
        "\n| updates of 1,200 silos on each of 2 ranks, taken after "
        f"{FAN_IN_DELAY_S:g} s | seconds | work with the senders waiting / alone, ranks 1, 2 | rank 0, 1, 2: "
        "CPU seconds, context switches |\n|---|---|---|---|"
    )
    for _ in range(repeats):
        wall, work_ratios, ranks = launch(3, "fanin", FAN_IN_WORK, HANDSHAKE_PARTIES).strip().split(" | ", 2)
        print(f"| | {wall} | {work_ratios} | {ranks} |", flush=True)


if __name__ == "__main__":
    main()
