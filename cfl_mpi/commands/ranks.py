"""`python -m cfl_mpi.commands.ranks CONFIG [--set k=v ...]` prints the rank count the job needs:
1 + silos, or 1 + ceil(silos / runtime.silos_per_rank)."""

from __future__ import annotations

from ..cli import config_error, run_arguments
from ..config import ConfigError, load_config

DESCRIPTION = "Print the number of MPI ranks a config's job needs."


def main(argv: list[str] | None = None) -> None:
    args = run_arguments("python -m cfl_mpi.commands.ranks", DESCRIPTION, resume=False).parse_args(argv)
    try:
        print(load_config(args.config, args.overrides).world_size)
    except ConfigError as err:
        config_error(str(err))


if __name__ == "__main__":
    main()
