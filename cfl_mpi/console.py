"""What the job says on the console, at one of three levels (`--quiet`, the default,
`--verbose`): one logger, `cfl_mpi`, writing plain lines to standard output. Quiet keeps the
warnings (an update the aggregation rule turned away, a run stopped early); the default adds
the run's progress, a line a round; verbose adds the details of how a round went (a staged
pair plan's stages). Errors that end a process go to standard error as they always do."""

from __future__ import annotations

import logging
import sys

LOG = logging.getLogger("cfl_mpi")
LEVELS = {"quiet": logging.WARNING, "normal": logging.INFO, "verbose": logging.DEBUG}


class _Stdout(logging.StreamHandler):
    """Lines to whatever `sys.stdout` is when they are written (a test may have swapped it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stdout)
        super().emit(record)


def setup(level: str = "normal") -> None:
    """The console at `level` (one of LEVELS), for this process."""
    handler = _Stdout()
    handler.setFormatter(logging.Formatter("%(message)s"))
    LOG.handlers[:] = [handler]
    LOG.propagate = False
    LOG.setLevel(LEVELS[level])


def _logger() -> logging.Logger:
    if not LOG.handlers:  # used as a library, or before a command set the level: the default
        setup()
    return LOG


def say(text: str) -> None:
    """The run's progress (shown unless quiet)."""
    _logger().info(text)


def detail(text: str) -> None:
    """How a step went, for the curious (shown with --verbose)."""
    _logger().debug(text)


def warn(text: str) -> None:
    """What the user should know even when quiet."""
    _logger().warning(text)


def level_of(quiet: bool, verbose: bool) -> str:
    return "quiet" if quiet else "verbose" if verbose else "normal"


def count(n: int, noun: str) -> str:
    """ "1 round", "3 rounds"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def spans(numbers: list[int]) -> str:
    """[2, 3, 4, 7] as "2-4, 7"."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def numbered(noun: str, numbers: list[int]) -> str:
    """("silo", [2, 3, 4]) as "silos 2-4", ("rank", [4]) as "rank 4", ("silo", []) as "no silo"."""
    if not numbers:
        return f"no {noun}"
    return f"{noun}{'s' if len(numbers) > 1 else ''} {spans(numbers)}"
