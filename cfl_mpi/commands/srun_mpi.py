"""`python -m cfl_mpi.commands.srun_mpi [--check-world N]`: the `srun --mpi=` plugin the MPI library
speaks, and a check that srun started one world (backends/mpi/srun.py; the SLURM scripts call this)."""

from __future__ import annotations

from ..backends.mpi.srun import chosen_plugin, main, plugin_for

__all__ = ["chosen_plugin", "main", "plugin_for"]

if __name__ == "__main__":
    main()
