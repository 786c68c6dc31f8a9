"""SIGTERM (SLURM's time-limit warning) and SIGINT (Ctrl-C) as a request to stop after the
round in progress.

SLURM signals every task of a step (`srun --signal=TERM@120`, or `scancel`); MPICH's mpiexec
passes a Ctrl-C on to every rank (a second one makes it abort the job). The server finishes
its round, writes the checkpoint and sends every silo STOP; the silos ignore both signals so
that none dies in the middle of an exchange the server is still waiting for. A stop by
Ctrl-C ends with exit code 130, as an interrupted shell command does; a second Ctrl-C ends
the server at once (the last checkpoint is intact: it is written before its round counts).
"""

from __future__ import annotations

import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: the shell's code for a command ended by Ctrl-C


class StopRequest:
    def __init__(self) -> None:
        self.reason: str | None = None
        self.failed = False  # the run itself asked to stop (too many silos left): exit code 1

    @property
    def requested(self) -> bool:
        return self.reason is not None

    @property
    def exit_code(self) -> int:
        """0 after a stop SLURM asked for (the job ends well, to be requeued); 130 after Ctrl-C;
        1 after the run's own stop."""
        return EXIT_INTERRUPTED if self.reason == signal.SIGINT.name else 1 if self.failed else 0

    def request(self, reason: str) -> None:
        """Stop after this round, as SLURM's warning asks (the checkpoint is written, exit code 0)."""
        self.reason = self.reason or reason

    def fail(self, reason: str) -> None:
        """Stop after this round, as a failed run (the checkpoint is written)."""
        self.reason, self.failed = self.reason or reason, True

    def install(self) -> None:
        """Server: remember the signal, finish the round, checkpoint, stop."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT and self.reason == signal.SIGINT.name:
            print("cfl_mpi: interrupted again: ending now; the last checkpoint is intact", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        if signum == signal.SIGINT and self.reason is None:
            print("cfl_mpi: Ctrl-C: stopping after the round in progress (Ctrl-C again to end at once)", flush=True)
        self.reason = self.reason or signal.Signals(signum).name


def defer_stop_signals() -> None:
    """Until a rank knows its role, a stop signal waits (blocked): a handler would interrupt the
    system calls of MPI's start-up, the default action would kill the rank (with a traceback,
    for SIGINT). Threads started meanwhile (MPI's) keep them blocked; `release_stop_signals`
    lets the main thread take them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))


def release_stop_signals() -> None:
    """A signal that came meanwhile now reaches the role's disposition (remembered or ignored)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))


def ignore_stop_signals() -> None:
    """Silo: the server decides when the run stops."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
