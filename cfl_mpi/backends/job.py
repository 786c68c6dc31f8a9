"""The job runner: one federated job on the processes a backend offers.

A backend says how a job's processes reach each other: the ranks of an MPI job
(mpi/backend.py), one process (simulate.py), processes of one machine over local sockets
(sockets.py). The runner does everything else, the same way on each: the config checked on
every process and the outcome agreed before any work (a config error is one line and exit
code 2 everywhere, never a hang), the data and the weights prepared once, the silos' own
files agreed on, each process placed on its node's cores and device, then the server and
the silos of each process run; a failure anywhere ends the job, naming its process and party.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from ..channel import SERVER, Channel, ChannelClosed, LocalHub, party_name
from ..cli import EXIT_CONFIG, announce, check_results_folder, load_run_config, prepare_results_folder
from ..config import Config, ConfigError
from ..reporting.results import record_failure, write_nodes
from ..runtime.absent import Absent
from ..runtime.compute import ComputePool
from ..runtime.memory import FreedMemory
from ..runtime.parties import PartyFailure, PartyThreads
from ..runtime.placement import DEVICE_RECORD_BYTES, DeviceReport, Placement, describe_devices, require_gpu
from ..runtime.stop import StopRequest, ignore_stop_signals, release_stop_signals
from ..runtime.timeline import mark
from ..runtime.timeline import write as write_timeline

if TYPE_CHECKING:
    import torch

__all__ = ["Backend", "run_job", "run_parties"]

# What the OpenMP and BLAS libraries read when they load: the ones a process loads only later
# (POT's and scikit-learn's OpenMP, when a strategy first needs them) start no more threads.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
HOST_BYTES = 64  # a host name's width in the start's gather (longer ones are cut)
GRACE_S = 10.0  # how long the parties of a process that failed get to stop, before it ends


class Backend(Protocol):
    """What a job needs of its processes. Process 0 hosts the server."""

    index: int  # this process
    size: int  # the job's processes
    units: tuple[str, str]  # what a process is called, one and several ("rank", "ranks")

    def parties(self, cfg: Config) -> list[list[int]]:
        """The parties (SERVER, silo indices) of every process; ConfigError where the config
        does not fit the processes."""

    def all_gather(self, data: bytes) -> list[bytes]:
        """Every process's `data`, in process order; waits without spinning a core."""

    def place(self, silos: int) -> Placement:
        """This process's place on its node: its share of the cores, the silos beside it."""

    def channels(
        self, cfg: Config, hub: LocalHub, hosts: list[str], lost: Callable[[str], None]
    ) -> AbstractContextManager[Callable[[int], Channel]]:
        """Open this process's channels for the job (a party's by its address); `lost` is
        called with why, should another process be gone."""

    def name(self, process: int) -> str:
        """A process as the job's messages name it ("rank 3")."""

    def who(self, role: str) -> str:
        """This process and a party of it, as a failure names them ("rank 3 (silo 2)")."""

    def abort(self) -> NoReturn:
        """End every process of the job at once, after a failure this process has reported."""

    def finish(self) -> None:
        """Every process is done with the job (the processes wait for each other, asleep)."""

    def exit(self, code: int) -> NoReturn:
        """End this process, its results on disk."""


def limit_threads(threads: int) -> None:
    """numpy/scipy's BLAS and the OpenMP pools would start a thread per core in every process:
    on a node shared by many processes that oversubscribes it, and the threads of one take the
    cores from the others. The libraries loaded now (torch's OpenMP among them: every process
    computes with torch) are limited at once; those imported later, where they are needed,
    read the variables."""
    import torch

    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    threadpool_limits(threads)
    torch.set_num_threads(threads)


def exit_if_any_failed(backend: Backend, error: str | None) -> None:
    """Every process learns whether any failed, and exits 2 if one did; the lowest failing
    process prints its message."""
    said = backend.all_gather(b"" if error is None else b"!" + error.encode())
    first = next((i for i, text in enumerate(said) if text), None)
    if first is None:
        return
    if first == backend.index:
        print(f"cfl_mpi: config error: {error}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG)


def validated(backend: Backend, args: argparse.Namespace) -> Started:
    """Config checks on every process and the results folder's on process 0, with the silos a
    resumed run keeps out (before any torch import: a mistaken --resume is one line at once);
    the silos' own files read and agreed on, where the data set has them (before any torch
    import too: a missing or damaged file is one line within seconds; a per-silo-files data
    set prepares nothing on process 0 first); each process placed on its node and device (a
    silo process without the GPU `runtime.device: cuda` asks for is a config error) and the
    job's first line; data preparation on process 0; then the weights and the rest of the
    folder's checks on process 0. Exit 2 on any error, on every process."""
    from ..runtime.placement import select_device

    error, first, kept = None, backend.index == 0, ""
    try:
        cfg = load_run_config(args)
        parties = backend.parties(cfg)
        if first:  # process 0 is the one sure to see the folder
            check_results_folder(cfg, args)
            kept = kept_silos(cfg, args)
    except ConfigError as err:
        error = str(err)
    exit_if_any_failed(backend, error)
    absent = Absent(told_kept(backend, cfg, kept) if args.resume else frozenset())
    mark("config")
    if cfg.data.per_silo_files:
        cfg, absent = agree_on_data(backend, parties, cfg, absent.kept)
        mark("agreement")
    silos = [p for p in parties[backend.index] if p != SERVER]
    placement = backend.place(len(silos))
    mark("placement")
    limit_threads(placement.threads)
    mark("torch")
    device = None
    try:
        if silos:
            require_gpu(cfg.runtime.device, f"{backend.name(backend.index)} on {platform.node()}")
            device = select_device(placement, cfg.runtime.device)
    except ConfigError as err:
        error = str(err)
    exit_if_any_failed(backend, error)
    mark("device")
    devices = gathered_devices(backend, parties, device)
    mark("devices_gathered")
    if first:
        announce(cfg, f"{hosted(backend, parties)} {describe_devices(devices)}")
    try:
        if first:
            cfg.data.prepare(cfg.data_facts())  # data files, once per job
    except ConfigError as err:
        error = str(err)
    exit_if_any_failed(backend, error)
    try:
        if first and cfg.model.has_weights_to_check:  # once per job; torch only then
            from ..models.build import prepare_weights

            prepare_weights(cfg.architecture)
        if first:
            prepare_results_folder(cfg, args)  # a resume's arrays against θ(0): after prepare
    except ConfigError as err:
        error = str(err)
    exit_if_any_failed(backend, error)
    return Started(cfg, parties, placement, device, [d.label for d in devices], absent)


@dataclass(frozen=True)
class Started:
    """A process of a job whose config every process agreed on, placed on its device."""

    cfg: Config
    parties: list[list[int]]  # every process's
    placement: Placement
    device: Any  # its silos' torch device (None: it hosts none)
    devices: list[str]  # every silo process's device, at process 0
    absent: Absent  # the silos out of the job before its first round (runtime.on_silo_failure: drop)


def hosted(backend: Backend, parties: list[list[int]]) -> str:
    """Where the silos run, as the job's first line says it."""
    if backend.size == 1:
        return "in one process"
    most, (one, several), n = max(len(p) for p in parties[1:]), backend.units, backend.size - 1
    return f"on {n} {one if n == 1 else several} ({'one' if most == 1 else f'up to {most}'} per {one})"


def kept_silos(cfg: Config, args: argparse.Namespace) -> str:
    """Process 0, on `--resume`: the silos the run being resumed dropped and keeps out (all but
    those `--readmit` names), as the text every process is told; "" on a fresh run."""
    from ..runtime.absent import parse_silo_list, silo_list
    from ..runtime.checkpoint import dropped_in, kept_out

    if not args.resume:
        return ""
    out, given = cfg.results_dir(), getattr(args, "readmit", None) or ""
    readmit = dropped_in(out) if given == "all" else parse_silo_list(given, cfg.silos, "--readmit")
    return silo_list(kept_out(cfg, out, readmit))


def told_kept(backend: Backend, cfg: Config, kept: str) -> frozenset[int]:
    """Every process learns the silos process 0 found the resumed run keeps out (a list of
    indices, checked as any peer's word)."""
    from ..runtime.absent import parse_silo_list

    said = backend.all_gather(kept.encode())[0]
    error, silos = None, frozenset[int]()
    try:
        silos = parse_silo_list(said.decode(errors="replace"), cfg.silos, "the resumed run's dropped silos")
    except ConfigError as err:
        error = str(err)
    exit_if_any_failed(backend, error)
    return silos


def agree_on_data(
    backend: Backend, parties: list[list[int]], cfg: Config, kept: frozenset[int]
) -> tuple[Config, Absent]:
    """The agreement before the first round (runtime/agreement.py): each process reads its own
    silos' files (but those `kept` out), every process gathers every report (fixed-width frames)
    and checks them the same way, so all reach the same config and the same silos out, or the
    same error."""
    from ..runtime.agreement import local_reports, read_reports, report_frame, settled
    from ..wire.messages import ProtocolError

    error, mine = None, {}
    here = [p for p in parties[backend.index] if p != SERVER and p not in kept]
    try:
        mine = local_reports(cfg, here)
    except ConfigError as err:
        error = str(err)
    exit_if_any_failed(backend, error)
    frames = b"".join(backend.all_gather(b"".join(report_frame(s, mine[s]) for s in here)))
    absent = Absent(kept)
    try:
        order = [s for silos in parties for s in silos if s != SERVER and s not in kept]
        cfg, absent = settled(cfg, read_reports(frames, order, cfg.runtime.on_silo_failure == "drop"), kept)
    except (ConfigError, ProtocolError) as err:
        error = str(err)
    exit_if_any_failed(backend, error)
    return cfg, absent


def gathered_devices(backend: Backend, parties: list[list[int]], device: torch.device | None) -> list[DeviceReport]:
    """Every silo process's device, at process 0 (the others get []): one fixed-size raw
    record each, checked as the untrusted input it is."""
    mine = bytes(DEVICE_RECORD_BYTES) if device is None else DeviceReport.of(device).encode().tobytes()
    records = backend.all_gather(mine)
    if backend.index:
        return []
    return [
        DeviceReport.decode(np.frombuffer(record, dtype=np.uint8), backend.name(i))
        for i, record in enumerate(records)
        if any(p != SERVER for p in parties[i])
    ]


def run_parties(
    cfg: Config,
    here: list[int],
    channel: Callable[[int], Channel],
    hub: LocalHub,
    placement: Placement,
    device: Any,
    stop: StopRequest,
    resume: bool = False,
    devices: list[str] | None = None,
    out: Path | None = None,
    grace_s: float | None = None,
    absent: Absent | None = None,
) -> dict | None:
    """This process's parties: the server first where it hosts it (θ(0) is drawn before any
    silo thread exists), its silos on `device`, in this thread where it hosts one silo alone,
    else a thread each; a silo `absent` (out of the job before its first round) is not started.
    The server's summary (None where it was stopped after a checkpoint, or the process hosts no
    server). A failing party raises `PartyFailure` naming it after the others stopped (waiting
    at most `grace_s` for a party that hangs)."""
    from ..runtime.server import start_server
    from ..runtime.silo import run_silo

    absent = absent or Absent()
    silos = [p for p in here if p != SERVER and p not in absent.silos]  # each other's mates (run_silo)
    pool = ComputePool.for_share(placement.cores, placement.threads, placement.silos, placement.node_silos)
    freeing: AbstractContextManager = FreedMemory() if silos and cfg.runtime.silo_models == "shared" else nullcontext()
    with pool as compute, freeing:
        server = None
        if SERVER in here:
            server = start_server(
                cfg, channel(SERVER), out or cfg.results_dir(), stop, resume, placement.cores, devices or [], absent
            )
            if not silos:  # the silos wait while the server clusters: it may use the node's cores meanwhile
                return server.run()
        if server is None and len(silos) == 1:
            run_silo(cfg, channel(silos[0]), device, silos[0], compute, silos)
            return None
        if server is None and not silos:
            return None  # every silo of the process is out of the job
        parties = PartyThreads(hub)
        for silo in silos:
            parties.start(party_name(silo), partial(run_silo, cfg, channel(silo), device, silo, compute, silos))
        summary = None
        if server is not None:
            try:
                summary = server.run()
            except ChannelClosed:
                parties.join(grace_s)  # a silo failed first: raise its failure
                raise
            except BaseException as err:  # noqa: BLE001 - the silos stop, the server's failure is raised
                parties.fail("the server", err)
        parties.join(grace_s)
        return summary


def run_job(args: argparse.Namespace, backend: Backend) -> NoReturn:
    """The job `args` describe, this process's part of it; exits with the job's code (130
    after a Ctrl-C: an interrupted command, its checkpoint intact). Stop signals (SLURM's
    warning, Ctrl-C), deferred by the caller while the process started, now reach process 0,
    which stops after the round; the others ignore them."""
    from ..runtime.faults import InjectedExit

    rank = backend.index
    stop = StopRequest()
    if rank == 0:
        stop.install()
    else:
        ignore_stop_signals()
    release_stop_signals()
    try:
        started = validated(backend, args)
    except Exception as exc:  # noqa: BLE001 - not a config error (a bug, an unreadable file): the other
        detail = "".join(traceback.format_exception(exc)).rstrip()  # processes wait to agree; an abort ends them
        print(
            f"cfl_mpi: {backend.name(rank)} failed while checking the config: {type(exc).__name__}: {exc}\n{detail}",
            file=sys.stderr,
            flush=True,
        )
        backend.abort()
    cfg, parties, placement = started.cfg, started.parties, started.placement
    here = parties[rank]
    role = role_of(here)
    stopped = False  # before the last round (the server's verdict)
    try:
        hosts = [h.rstrip(b"\0").decode(errors="replace") for h in backend.all_gather(host_record())]
        pids = [int.from_bytes(p, "little") for p in backend.all_gather(os.getpid().to_bytes(8, "little"))]
        if rank == 0 and backend.size > 1:
            write_nodes(cfg.results_dir(), hosts, pids, [[p for p in ps if p != SERVER] for ps in parties])
        lost = on_lost_peer(cfg, backend, "" if rank == 0 else f"{backend.who(role)}: ")
        hub = LocalHub()
        with threadpool_limits(placement.threads), backend.channels(cfg, hub, hosts, lost) as channel:
            summary = run_parties(
                cfg,
                here,
                channel,
                hub,
                placement,
                started.device,
                stop,
                bool(args.resume),
                started.devices,
                grace_s=GRACE_S,
                absent=started.absent,
            )
            stopped = summary is None and SERVER in here
        backend.finish()
        write_timeline(rank, role)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        if isinstance(exc, PartyFailure):
            role, exc = exc.party, exc.error
        if isinstance(exc, InjectedExit):
            os._exit(3)  # dies without a word, as a killed process does
        detail = "".join(traceback.format_exception(exc)).rstrip()
        text = f"cfl_mpi: {backend.who(role)} failed: {type(exc).__name__}: {exc}\n{detail}"
        print(text, file=sys.stderr, flush=True)
        record_failure(cfg.results_dir(), text)
        backend.abort()
    backend.exit(stop.exit_code if stopped else 0)


def role_of(here: list[int]) -> str:
    """What a process hosts, as its failure names it: "server", "silo 3", "silos 4-7"."""
    silos = [p for p in here if p != SERVER]
    if SERVER in here:
        return "server" if not silos else "the job"
    return party_name(silos[0]) if len(silos) == 1 else f"silos {silos[0]}-{silos[-1]}"


def host_record() -> bytes:
    """This host's name, as fixed-width bytes."""
    return platform.node().encode()[:HOST_BYTES].ljust(HOST_BYTES, b"\0")


def on_lost_peer(cfg: Config, backend: Backend, who: str) -> Callable[[str], None]:
    """What a process does when another is lost (a backend's heartbeats say so): one line
    naming it and what to resume from; failure.txt; the job ends."""
    from ..runtime.checkpoint import resume_hint

    def lost(why: str) -> None:
        out = cfg.results_dir()
        text = f"cfl_mpi: {who}{why}; {resume_hint(out)}"
        print(text, file=sys.stderr, flush=True)
        record_failure(out, text)
        backend.abort()

    return lost
