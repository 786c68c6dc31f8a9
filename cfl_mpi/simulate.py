"""`python -m cfl_mpi.simulate CONFIG [--out DIR] [--resume DIR] [--set key=value ...]`

Runs any strategy with the server and every silo in this one process, each in a thread of its
own, talking through in-process channels: the same server, silos and strategies as the MPI
job, the same checks on every message, and the same results folder. One torch import and one
device for all: for developing a strategy, for tests, and for studies that fit one machine.
"""

from __future__ import annotations

import sys
import traceback
from functools import partial
from pathlib import Path

from . import console
from .channel import SERVER, ChannelClosed, LocalChannel, LocalHub, party_name
from .cli import (
    announce,
    check_results_folder,
    config_error,
    exit_now,
    load_run_config,
    prepare_results_folder,
    run_arguments,
)
from .config import Config, ConfigError
from .results import record_failure
from .runtime.compute import ComputePool
from .runtime.parties import PartyFailure, PartyThreads
from .runtime.stop import StopRequest

DESCRIPTION = "Run a clustered federated learning job in one process: the server and every silo as threads."

__all__ = ["simulate"]


def simulate(
    cfg: Config,
    out: Path | None = None,
    stop: StopRequest | None = None,
    resume: bool = False,
    grace_s: float = 10.0,
    agreed: bool = False,
) -> dict | None:
    """The whole run in-process; the summary, or None if it was stopped (SIGTERM, Ctrl-C) after a
    checkpoint. A failing party raises `PartyFailure` naming it after the others stopped
    (waiting at most `grace_s` for a party that hangs). Silos reading files of their own agree
    on their data first, unless `agreed` says the config holds the agreement already."""
    import torch
    from threadpoolctl import threadpool_limits

    from .runtime.agreement import agreed_in_process
    from .runtime.placement import DeviceReport, device_for, usable_cores
    from .runtime.server import start_server
    from .runtime.silo import run_silo

    if not agreed:
        cfg = agreed_in_process(cfg)
    # Process-wide settings, as the MPI job gives each silo on one node: its share of the cores.
    cores = usable_cores()
    threads = max(1, cores // cfg.silos)
    torch.set_num_threads(threads)
    device = device_for(0, cfg.runtime.device)
    hub = LocalHub()

    def channel(address: int) -> LocalChannel:
        return LocalChannel(address, hub, cfg.runtime.message_timeout_s, cfg.runtime.max_poll_sleep_ms / 1000)

    with threadpool_limits(threads), ComputePool.for_share(cores, threads, cfg.silos, cfg.silos) as compute:
        # the server first: θ(0) is drawn before any silo thread exists
        server = start_server(
            cfg,
            channel(SERVER),
            out or cfg.results_dir(),
            stop or StopRequest(),
            resume,
            cores,
            [DeviceReport.of(device).label],
        )
        parties = PartyThreads(hub)
        for silo in range(cfg.silos):
            parties.start(
                party_name(silo), partial(run_silo, cfg, channel(silo), device, silo, compute, range(cfg.silos))
            )
        try:
            summary = server.run()
        except ChannelClosed:
            parties.join(grace_s)  # a silo failed first: raise its failure
            raise
        except BaseException as err:
            parties.fail("the server", err)
            parties.join(grace_s)
        parties.join(grace_s)
    return summary


def main(argv: list[str] | None = None) -> None:
    args = run_arguments("python -m cfl_mpi.simulate", DESCRIPTION).parse_args(argv)
    console.setup(console.level_of(args.quiet, args.verbose))
    from .prepare import prepare_weights
    from .runtime.agreement import agreed_in_process
    from .runtime.placement import DeviceReport, describe_devices, device_for

    stop = StopRequest()
    stop.install()
    try:
        cfg = load_run_config(args)
        check_results_folder(cfg, args)  # before torch: a mistaken --resume or --out at once
        device = device_for(0, cfg.runtime.device)  # runtime.device: cuda without a GPU is a config error
        announce(cfg, f"in one process {describe_devices([DeviceReport.of(device)])}")
        cfg.data.prepare(cfg.data_facts())
        cfg = agreed_in_process(cfg)  # every silo's files read and checked before any training
        prepare_weights(cfg)
        prepare_results_folder(cfg, args)
    except ConfigError as err:
        config_error(str(err))
    try:
        stopped = simulate(cfg, stop=stop, resume=bool(args.resume), agreed=True) is None
    except PartyFailure as failure:
        detail = "".join(traceback.format_exception(failure.error)).rstrip()
        text = f"cfl_mpi: {failure}\n{detail}"
        print(text, file=sys.stderr, flush=True)
        record_failure(cfg.results_dir(), text)
        exit_now(1)
    exit_now(stop.exit_code if stopped else 0)  # 130 after a Ctrl-C: an interrupted command, its checkpoint intact


if __name__ == "__main__":
    main()
