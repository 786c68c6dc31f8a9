"""`python -m cfl_mpi.backends.simulate CONFIG [--out DIR] [--resume DIR] [--set key=value ...]`

Runs any strategy with the server and every silo in this one process, each in a thread of its
own, talking through in-process channels: the same job runner, server, silos and strategies as
the MPI job, the same checks on every message, and the same results folder. One torch import
and one device for all: for developing a strategy, for tests, and for studies that fit one
machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from .. import console
from ..channel import SERVER, Channel, LocalChannel, LocalHub
from ..cli import exit_now, run_arguments
from ..config import Config
from ..runtime.placement import Placement, usable_cores
from ..runtime.stop import StopRequest
from .job import run_job, run_parties

DESCRIPTION = "Run a clustered federated learning job in one process: the server and every silo as threads."

__all__ = ["InProcess", "simulate"]


class InProcess:
    """The job runner's backend for one process hosting the server and every silo."""

    index, size, units = 0, 1, ("process", "processes")

    def parties(self, cfg: Config) -> list[list[int]]:
        return [[SERVER, *range(cfg.silos)]]

    def all_gather(self, data: bytes) -> list[bytes]:
        return [data]

    def place(self, silos: int) -> Placement:
        """Each silo's share of the machine's cores, as the MPI job gives each silo on one node."""
        return Placement(0, silos, 0, silos, usable_cores())

    @contextmanager
    def channels(
        self, cfg: Config, hub: LocalHub, hosts: list[str], lost: Callable[[str], None] | None = None
    ) -> Iterator[Callable[[int], Channel]]:
        rt = cfg.runtime
        yield lambda address: LocalChannel(address, hub, rt.message_timeout_s, rt.max_poll_sleep_ms / 1000)

    def name(self, process: int) -> str:
        return "the process"

    def who(self, role: str) -> str:
        return role

    def abort(self) -> NoReturn:
        exit_now(1)

    def finish(self) -> None:
        return None

    def exit(self, code: int) -> NoReturn:
        exit_now(code)


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
    on their data first, unless `agreed` says the config holds the agreement already. A resumed
    run keeps the silos it dropped out."""
    import torch
    from threadpoolctl import threadpool_limits

    from ..runtime.absent import Absent
    from ..runtime.agreement import agreement_in_process
    from ..runtime.checkpoint import kept_out
    from ..runtime.placement import DeviceReport, device_for

    absent = Absent(kept_out(cfg, out or cfg.results_dir(), frozenset()) if resume else frozenset())
    if not agreed:
        cfg, absent = agreement_in_process(cfg, absent.kept)
    backend = InProcess()
    placement = backend.place(cfg.silos)
    torch.set_num_threads(placement.threads)
    device = device_for(0, cfg.runtime.device)
    hub = LocalHub()
    with threadpool_limits(placement.threads), backend.channels(cfg, hub, []) as channel:
        here = backend.parties(cfg)[0]
        labels = [DeviceReport.of(device).label]
        return run_parties(
            cfg, here, channel, hub, placement, device, stop or StopRequest(), resume, labels, out, grace_s, absent
        )


def main(argv: list[str] | None = None) -> None:
    args = run_arguments("python -m cfl_mpi.backends.simulate", DESCRIPTION).parse_args(argv)
    console.setup(console.level_of(args.quiet, args.verbose))
    run_job(args, InProcess())


if __name__ == "__main__":
    main()
