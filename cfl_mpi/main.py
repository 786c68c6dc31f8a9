"""`mpirun -n <silos+1> python -m cfl_mpi.main CONFIG [--out DIR] [--set key=value ...]`

Rank 0 is the server, ranks 1..N the silos. Every rank validates the config; all ranks
agree on the outcome before any work, so a config error is one line and exit code 2 on
every rank instead of a hang. After that, an exception on any rank aborts the whole job.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from .config import Config, ConfigError, check_resumable, check_world, load_config
from .runtime.stop import StopRequest, ignore_sigterm

EXIT_CONFIG = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cfl_mpi.main", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="YAML config, e.g. configs/digits.yaml")
    parser.add_argument("--out", help="results folder (overrides the config's `out`)")
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the run whose results folder is DIR from its last checkpoint "
                             "(same config and --set options; starts afresh if DIR has no checkpoint)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value by its dotted key, e.g. --set train.rounds=2")
    return parser.parse_args(argv)


def _agree_on_error(comm, error: str | None) -> str | None:
    """All ranks learn whether any rank failed; the lowest failing rank's message wins."""
    from mpi4py import MPI

    mine = np.array([comm.Get_rank() if error is not None else comm.Get_size()], dtype=np.int64)
    first = np.empty(1, dtype=np.int64)
    comm.Allreduce(mine, first, op=MPI.MIN)
    if first[0] == comm.Get_size():
        return None
    return error if first[0] == comm.Get_rank() else ""


def _validated(comm, args: argparse.Namespace) -> Config:
    """Config checks on every rank, then data preparation on rank 0; exit 2 on any error."""
    from .data import check_data
    from .prepare import prepare

    cfg, error = None, None
    try:
        out = args.resume or args.out
        overrides = [*args.overrides, *([f"out={out}"] if out else [])]
        cfg = load_config(args.config, overrides)
        check_world(cfg, comm.Get_size())
        if args.resume:
            check_resumable(cfg, Path(args.resume))
        check_data(cfg)
    except ConfigError as err:
        error = str(err)
    for step in ("validation", "preparation"):
        if step == "preparation" and comm.Get_rank() == 0:
            try:
                prepare(cfg)  # data files and pretrained weights, once per job
            except ConfigError as err:
                error = str(err)
        agreed = _agree_on_error(comm, error)
        if agreed is not None:
            if agreed:
                print(f"cfl_mpi: config error: {agreed}", file=sys.stderr, flush=True)
            sys.exit(EXIT_CONFIG)
    return cfg


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    stop = StopRequest()
    if rank == 0:
        stop.install()  # before anything slow: SIGTERM from now on means "stop after this round"
    else:
        ignore_sigterm()
    cfg = _validated(comm, args)
    role = "server" if rank == 0 else f"silo {rank - 1}"
    try:
        from .runtime.placement import place
        from .wire.transport import Transport

        placement = place(comm, is_silo=rank > 0)
        # numpy/scipy's BLAS would start a thread per core in every rank: on a node shared by
        # many ranks that oversubscribes it (measured 2.5x slower FedWaD with 9 ranks on 2 cores).
        threadpool_limits(placement.threads)
        transport = Transport(comm, cfg.runtime.message_timeout_s, cfg.runtime.max_poll_sleep_ms / 1000)
        if rank == 0:
            from .runtime.server import run_server

            run_server(cfg, transport, cfg.results_dir(), stop, resume=bool(args.resume))
        else:
            from .runtime.silo import run_silo

            run_silo(cfg, transport, placement, rank - 1)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        detail = "".join(traceback.format_exception(exc)).rstrip()
        print(f"cfl_mpi: rank {rank} ({role}) failed: {type(exc).__name__}: {exc}\n{detail}",
              file=sys.stderr, flush=True)
        comm.Abort(1)


if __name__ == "__main__":
    cli()
