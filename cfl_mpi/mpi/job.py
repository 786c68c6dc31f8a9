"""The ranks of `python -m cfl_mpi.main` (main.py parses its arguments): rank 0 is the
server; ranks 1..R host the silos, one each (R = silos) or in blocks of consecutive silos
that share the rank's device and torch (`runtime.silos_per_rank`, or derived from the rank
count). Every rank validates the config; all ranks agree on the outcome before any work, so
a config error is one line and exit code 2 on every rank instead of a hang. After that, an
exception on any rank aborts the whole job.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..channel import SERVER, LocalHub, RankLayout, party_name
from ..cli import (
    EXIT_CONFIG,
    announce,
    check_results_folder,
    exit_rank,
    load_run_config,
    prepare_results_folder,
)
from ..config import Config, ConfigError, check_world
from ..console import count
from ..results import record_failure, write_nodes
from ..runtime.compute import ComputePool
from ..runtime.parties import PartyFailure, PartyThreads
from ..runtime.placement import Placement, require_gpu
from ..runtime.stop import StopRequest, ignore_stop_signals, release_stop_signals
from ..runtime.timeline import mark
from ..runtime.timeline import write as write_timeline
from .placement import wait_quietly

# Seconds between a failing rank's last words and MPI_Abort: the launcher's proxy forwards what
# the rank wrote only while the rank lives (output before MPI_Abort can be lost: see
# results.record_failure, which keeps it in the results folder in any case).
ABORT_GRACE_S = 1.0
# What the OpenMP and BLAS libraries read when they load: the ones a rank loads only later (POT's
# and scikit-learn's OpenMP, when a strategy first needs them) start no more threads than the rest.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def limit_threads(threads: int) -> None:
    """numpy/scipy's BLAS and the OpenMP pools would start a thread per core in every rank: on
    a node shared by many ranks that oversubscribes it, and the threads of one rank take the
    cores from the others. The libraries loaded now (torch's OpenMP among them: every rank
    computes with torch) are limited at once; those imported later, where they are needed,
    read the variables."""
    import torch  # noqa: F401 - loads torch's OpenMP library, so that the limit covers it

    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    threadpool_limits(threads)


def _exit_on_error(comm, error: str | None) -> None:
    """All ranks learn whether any rank failed, and exit 2 if one did; the lowest failing
    rank prints its message."""
    from mpi4py import MPI

    mine = np.array([comm.Get_rank() if error is not None else comm.Get_size()], dtype=np.int64)
    first = np.empty(1, dtype=np.int64)
    wait_quietly(comm.Iallreduce(mine, first, op=MPI.MIN))
    if first[0] == comm.Get_size():
        return
    if first[0] == comm.Get_rank():
        print(f"cfl_mpi: config error: {error}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG)


def _validated(comm, args) -> tuple[Config, RankLayout]:
    """Config checks on every rank and the results folder's on rank 0 (before any torch import:
    a mistaken --resume is one line at once); then data preparation on rank 0 while the silo
    ranks read their own files for the agreement (where the data set has them); then the
    weights and the rest of the folder's checks on rank 0; exit 2 on any error."""
    from ..prepare import prepare_weights

    error = None
    try:
        cfg = load_run_config(args)
        layout = RankLayout(cfg.silos, check_world(cfg, comm.Get_size()))
        if comm.Get_rank() == 0:  # rank 0 is the one rank sure to see the folder
            check_results_folder(cfg, args)
    except ConfigError as err:
        error = str(err)
    _exit_on_error(comm, error)
    try:
        if comm.Get_rank() == 0:
            cfg.data.prepare(cfg.data_facts())  # data files, once per job
        else:  # meanwhile the silo ranks: runtime.device: cuda needs a GPU on each
            require_gpu(cfg.runtime.device, f"rank {comm.Get_rank()} on {platform.node()}")
    except ConfigError as err:
        error = str(err)
    _exit_on_error(comm, error)
    if cfg.data.per_silo_files:
        cfg = _agreed(comm, layout, cfg)
    try:
        if comm.Get_rank() == 0:
            prepare_weights(cfg)  # pretrained weights, once per job
            prepare_results_folder(cfg, args)  # a resume's arrays against θ(0): after prepare
    except ConfigError as err:
        error = str(err)
    _exit_on_error(comm, error)
    return cfg, layout


def _agreed(comm, layout: RankLayout, cfg: Config) -> Config:
    """The agreement before the first round (runtime/agreement.py): each silo rank reads its own
    silos' files, every rank gathers every report (fixed-width frames, one collective) and checks
    them the same way, so all reach the same config or the same error."""
    from ..data.agreement import REPORT_BYTES, frame, read_frames
    from ..runtime.agreement import agreed_config, local_reports
    from ..wire.messages import ProtocolError

    error, mine = None, {}
    here = layout.silos_on(comm.Get_rank())
    try:
        mine = local_reports(cfg, here)
    except ConfigError as err:
        error = str(err)
    _exit_on_error(comm, error)
    send = np.frombuffer(bytearray(b"".join(frame(s, mine[s]) for s in here)), dtype=np.uint8)
    counts = [len(layout.silos_on(r)) * REPORT_BYTES for r in range(comm.Get_size())]
    frames = np.empty(sum(counts), dtype=np.uint8)
    wait_quietly(comm.Iallgatherv(send, [frames, counts]))
    try:
        order = [s for r in range(comm.Get_size()) for s in layout.silos_on(r)]
        cfg = agreed_config(cfg, read_frames(frames.tobytes(), order))
    except (ConfigError, ProtocolError) as err:
        error = str(err)
    _exit_on_error(comm, error)
    return cfg


def on_lost_peer(cfg: Config, comm, who: str) -> Callable[[str], None]:
    """What a rank does when its heartbeats say a peer is lost (liveness.py): one line
    naming the node, its ranks and silos, and what to resume from; failure.txt; the job ends."""
    from ..runtime.checkpoint import resume_hint

    def lost(why: str) -> None:
        out = cfg.results_dir()
        text = f"cfl_mpi: {who}{why}; {resume_hint(out)}"
        print(text, file=sys.stderr, flush=True)
        record_failure(out, text)
        time.sleep(ABORT_GRACE_S)
        comm.Abort(1)

    return lost


def run_silos(cfg: Config, channels: dict, hub: LocalHub, placement: Placement, device: Any) -> None:
    """This rank's silos, on `device`: in this thread when it hosts one, else a thread each."""
    import torch

    from ..runtime.silo import run_silo

    torch.set_num_threads(placement.threads)
    with ComputePool.for_share(placement.cores, placement.threads, placement.silos, placement.node_silos) as compute:
        if len(channels) == 1:
            ((silo, channel),) = channels.items()
            run_silo(cfg, channel, device, silo, compute, [silo])
            return
        threads = PartyThreads(hub)
        for silo, channel in channels.items():
            threads.start(party_name(silo), partial(run_silo, cfg, channel, device, silo, compute, sorted(channels)))
        threads.join()


def run_rank(args: argparse.Namespace) -> None:
    """This rank's part of the job `args` describe (stop signals deferred by the caller)."""
    from mpi4py import MPI

    from ..runtime.faults import InjectedExit
    from ..runtime.placement import describe_devices, select_device
    from .channel import MpiChannel, MpiInbox
    from .liveness import Liveness
    from .placement import gather_devices, gather_hosts, gather_pids, place

    mark("mpi_init")

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    stop = StopRequest()
    if rank == 0:
        stop.install()
    else:
        ignore_stop_signals()
    release_stop_signals()
    try:
        cfg, layout = _validated(comm, args)
    except Exception as exc:  # noqa: BLE001 - not a config error (a bug, an unreadable file): the other
        detail = "".join(traceback.format_exception(exc)).rstrip()  # ranks wait to agree; an abort ends them
        print(
            f"cfl_mpi: rank {rank} failed while checking the config: {type(exc).__name__}: {exc}\n{detail}",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(ABORT_GRACE_S)
        comm.Abort(1)
    mark("config")
    here = layout.silos_on(rank)
    role = "server" if rank == 0 else party_name(here[0]) if len(here) == 1 else f"silos {here[0]}-{here[-1]}"
    stopped = False  # before the last round (the server's verdict)
    try:
        placement = place(comm, len(here))
        mark("placement")
        limit_threads(placement.threads)
        mark("torch")
        device = select_device(placement, cfg.runtime.device) if here else None
        mark("device")
        devices = gather_devices(comm, device)
        mark("devices_gathered")
        if rank == 0:
            per_rank = "one" if layout.slots == 1 else f"up to {layout.slots}"
            announce(cfg, f"on {count(layout.silo_ranks, 'rank')} ({per_rank} per rank) {describe_devices(devices)}")
        rt, hosts, pids = cfg.runtime, gather_hosts(comm), gather_pids(comm)
        if rank == 0:
            write_nodes(cfg.results_dir(), hosts, pids, [list(layout.silos_on(r)) for r in range(comm.Get_size())])
        liveness = Liveness(comm, layout, hosts, rt.heartbeat_s, rt.heartbeat_timeout_s)
        lost = on_lost_peer(cfg, comm, "" if rank == 0 else f"rank {rank} ({role}): ")
        hub, max_sleep_s = LocalHub(), rt.max_poll_sleep_ms / 1000
        with MpiInbox(comm, layout, hub, threading.Lock(), max_sleep_s, liveness, lost) as inbox:

            def channel(address: int) -> MpiChannel:
                return MpiChannel(
                    address, inbox, cfg.runtime.message_timeout_s, max_sleep_s, cfg.runtime.payload_timeout_s
                )

            if rank == 0:
                from ..runtime.server import start_server

                # the silos wait while the server clusters: it may use the node's cores meanwhile
                stopped = (
                    start_server(
                        cfg,
                        channel(SERVER),
                        cfg.results_dir(),
                        stop,
                        resume=bool(args.resume),
                        cores=placement.cores,
                        devices=[d.label for d in devices],
                    ).run()
                    is None
                )
            else:
                run_silos(cfg, {c: channel(c) for c in here}, hub, placement, device)
        # MPI_Finalize waits for every rank, spinning: the silos, done at STOP, wait here asleep
        # while the server writes the results folder. mpi4py would finalize only after the
        # interpreter's own teardown (Py_AtExit), which ends at different times on different
        # ranks, the first ones spinning meanwhile; finalizing now, all ranks together, avoids that.
        wait_quietly(comm.Ibarrier())
        MPI.Finalize()
        write_timeline(rank, role)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        if isinstance(exc, PartyFailure):
            role, exc = exc.party, exc.error
        if isinstance(exc, InjectedExit):
            os._exit(3)  # dies without a word, as a killed process does
        detail = "".join(traceback.format_exception(exc)).rstrip()
        text = f"cfl_mpi: rank {rank} ({role}) failed: {type(exc).__name__}: {exc}\n{detail}"
        print(text, file=sys.stderr, flush=True)
        record_failure(cfg.results_dir(), text)
        time.sleep(ABORT_GRACE_S)
        comm.Abort(1)
    exit_rank(stop.exit_code if stopped else 0)  # 130 after a Ctrl-C: an interrupted command, its checkpoint intact
