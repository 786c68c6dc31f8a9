"""`python -m cfl_mpi.commands.prepare CONFIG [--set key=value ...]`: get a job's data and weights ready.

Checks the config, then the data set's files in `data.root` (downloading missing MNIST or
CIFAR-10 files with torchvision where a network is reachable) and, for `model.pretrained`,
the weights (torchvision's, into torch's cache; or the given file). The MPI job's rank 0
runs the same `prepare` before any silo reads, so on a cluster run this first where the
network is (a login node), then start the job: `python -m cfl_mpi.commands.prepare C && srun ... C`.
Exit code 2 with one line on any problem.
"""

from __future__ import annotations

from ..cli import config_error, run_arguments
from ..config import Config, ConfigError, load_config

DESCRIPTION = "Get a job's data and pretrained weights ready (download what is missing) before it runs."


def prepare(cfg: Config) -> None:
    """Data files, then weights; a ConfigError (one line naming folder and fix) if impossible.
    Where the silos read files of their own, the weights are checked by the job, once the silos
    agreed on the shape of their examples."""
    cfg.data.prepare(cfg.data_facts())
    if not cfg.data.per_silo_files and cfg.model.has_weights_to_check:
        from ..models.build import prepare_weights  # torch: only where there are weights to check

        prepare_weights(cfg.architecture)


def main(argv: list[str] | None = None) -> None:
    args = run_arguments("python -m cfl_mpi.commands.prepare", DESCRIPTION, resume=False).parse_args(argv)
    try:
        cfg = load_config(args.config, [*args.overrides, *([f"out={args.out}"] if args.out else [])])
        prepare(cfg)
    except ConfigError as err:
        config_error(str(err))
    root = cfg.data.root
    where = f" in {root}" if root else " (embedded)" if not cfg.data.per_silo_files else " (read by each silo)"
    weights = "" if cfg.model.pretrained is False else f"; weights for {cfg.model.name} ready"
    print(f"{cfg.data.name}: data ready{where}{weights}")


if __name__ == "__main__":
    main()
