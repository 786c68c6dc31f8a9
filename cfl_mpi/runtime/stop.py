"""SIGTERM as a request to stop after the round in progress (SLURM's time-limit warning).

SLURM signals every task of a step (`srun --signal=TERM@120`, or `scancel`). The server
finishes its round, writes the checkpoint and sends every silo STOP; the silos ignore the
signal so that none dies in the middle of an exchange the server is still waiting for.
"""
from __future__ import annotations

import signal


class StopRequest:
    def __init__(self) -> None:
        self.reason: str | None = None

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def install(self) -> None:
        """Server: remember the signal, finish the round, checkpoint, stop."""
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.reason = signal.Signals(signum).name


def defer_sigterm() -> None:
    """Until a rank knows its role, SLURM's warning waits (blocked): a handler would interrupt the
    system calls of MPI's start-up, the default action would kill the rank. Threads started
    meanwhile (MPI's) keep it blocked; `release_sigterm` lets the main thread take it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def release_sigterm() -> None:
    """A warning that came meanwhile now reaches the role's disposition (remembered or ignored)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def ignore_sigterm() -> None:
    """Silo: the server decides when the run stops."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
