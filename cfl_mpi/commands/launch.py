"""`python -m cfl_mpi.commands.launch [--print] CONFIG [--out DIR] [--set k=v ...]`: start CONFIG under
`mpirun` with the rank count it needs, or with --print show the mpirun, srun and sbatch lines
that start it, so nobody miscounts ranks.

The count is 1 (the server) + one rank per silo, or per block of `runtime.silos_per_rank`
silos sharing that rank's device (`Config.world_size`, as `python -m cfl_mpi.commands.ranks` prints).
`launch/run.sh` is this command. It watches mpirun (supervise.py): a job the launcher ends
before any rank could say why still ends with cfl_mpi's line, naming the node lost.
"""

from __future__ import annotations

import os
import shlex
import sys

from ..backends.mpi.srun import chosen_plugin
from ..cli import NO_MPIRUN, config_error, find_mpirun, run_arguments
from ..config import Config, ConfigError, load_config
from .supervise import supervise

DESCRIPTION = (
    "Start a config's job under mpirun with the rank count it needs (or print the mpirun, srun and sbatch lines)."
)

PRINT = "--print"


def command_lines(cfg: Config, run_args: list[str], srun_mpi: str, mpirun: str = "mpirun") -> list[str]:
    """The lines that start the config: locally, inside an allocation, and as batch jobs."""
    ranks = cfg.world_size
    per_rank = cfg.runtime.silos_per_rank or 1
    args = shlex.join(run_args)
    main = f"python -m cfl_mpi.main {args}"
    return [
        f"# {cfg.name}: {cfg.silos} silos, {per_rank} per rank: {ranks} ranks (1 server + {ranks - 1} silo ranks)",
        f"{mpirun} -n {ranks} {main}",
        f"srun --mpi={srun_mpi} --ntasks={ranks} --kill-on-bad-exit=1 {main}",
        f"sbatch --ntasks={ranks} slurm/single_node.sbatch {args}",
        f"sbatch --ntasks={ranks} slurm/requeue.sbatch {args}",
        f"sbatch --ntasks=1 : --ntasks={ranks - 1} slurm/multi_node_gpu.sbatch {args}",
    ]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    show = PRINT in argv
    run_args = [a for a in argv if a != PRINT]
    parser = run_arguments("python -m cfl_mpi.commands.launch", DESCRIPTION)
    parser.add_argument(PRINT, action="store_true", help="print the command lines instead of running mpirun")
    args = parser.parse_args(argv)
    out = args.resume or args.out
    try:
        cfg = load_config(args.config, [*args.overrides, *([f"out={out}"] if out else [])])
    except ConfigError as err:
        config_error(str(err))
    if show:  # lines to copy: the mpirun of the environment they will run in
        print("\n".join(command_lines(cfg, run_args, chosen_plugin(), os.environ.get("MPIRUN", "mpirun"))))
        return
    mpirun = os.environ.get("MPIRUN") or find_mpirun()
    if not mpirun:
        config_error(f"{NO_MPIRUN}, or set $MPIRUN", prog="cfl_mpi.commands.launch")
    command = [mpirun, "-n", str(cfg.world_size), sys.executable, "-m", "cfl_mpi.main", *run_args]
    sys.exit(supervise(command, cfg.results_dir()))


if __name__ == "__main__":
    main()
