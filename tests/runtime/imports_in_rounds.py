"""Run one simulated job and print, as JSON, every module first imported while a party was in
a round: the server's rounds, the silo halves' steps, and training, embedding and evaluation
on the compute workers (tests/runtime/test_imports_in_rounds.py).

    python tests/runtime/imports_in_rounds.py CONFIG [KEY=VALUE ...]
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import threading

IN_ROUND = threading.local()
IMPORTED: list[tuple[str, str]] = []  # (module, thread) of each import inside a round


def record(event: str, args: tuple) -> None:
    if event == "import" and getattr(IN_ROUND, "depth", 0):
        IMPORTED.append((args[0], threading.current_thread().name))


def in_round(fn):
    """`fn`, with its thread marked as in a round while it runs."""

    @functools.wraps(fn)
    def marked(*args, **kwargs):
        IN_ROUND.depth = getattr(IN_ROUND, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            IN_ROUND.depth -= 1

    return marked


def main(argv: list[str]) -> None:
    from cfl_mpi.backends.simulate import simulate
    from cfl_mpi.config import load_config
    from cfl_mpi.runtime.halves import halves as halves_of
    from cfl_mpi.runtime.server import Server
    from cfl_mpi.training import local as training

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(argv[0], [*argv[1:], f"out={out}"])
        halves = halves_of(cfg)
        for cls, names in (
            (Server, ("round",)),
            (halves.silo, ("before_training", "after_training")),
            (training, ("train_local", "embed", "evaluate")),
        ):
            for name in names:
                setattr(cls, name, in_round(getattr(cls, name)))
        sys.addaudithook(record)
        simulate(cfg)
    print(json.dumps(IMPORTED))


if __name__ == "__main__":
    main(sys.argv[1:])
    from cfl_mpi.cli import exit_now

    exit_now(0)  # as the simulator's command ends: the interpreter's teardown once aborted a finished run
