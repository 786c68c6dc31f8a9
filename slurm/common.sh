# Sourced by the sbatch scripts: prepare the data once, then start every rank with srun
# or, where srun is missing or CFL_LAUNCHER=mpirun, mpirun.
#   CFL_PYTHON     the Python of the environment holding cfl_mpi (default: python)
#   CFL_LAUNCHER   srun (default) or mpirun
#   CFL_SRUN_MPI   srun's --mpi plugin (default: the one the MPI under mpi4py speaks, pmi2 for
#                  MPICH such as the pip wheel, pmix for Open MPI: python -m cfl_mpi.backends.mpi.srun)
PYTHON=${CFL_PYTHON:-python}

cfl_ranks() {  # ranks the config needs (1 server + silo ranks), honouring --set silos=... and runtime.silos_per_rank
    "$PYTHON" -m cfl_mpi.commands.ranks "$@"
}

cfl_check_tasks() {  # the allocation must match the config, or say how to fix it
    local ranks=$1
    if [ -n "${SLURM_NTASKS:-}" ] && [ "$SLURM_NTASKS" != "$ranks" ]; then
        echo "cfl_mpi: the config needs $ranks tasks but the job has $SLURM_NTASKS (submit with --ntasks=$ranks)" >&2
        exit 2
    fi
}

cfl_prepare() {  # data preparation once per job, before any silo reads
    "$PYTHON" -m cfl_mpi.commands.prepare "$@"
}

cfl_srun_mpi() {  # cfl_srun_mpi RANKS SRUN_LAYOUT...: srun's --mpi plugin, once a probe step
    # laid out the same way has formed one MPI world of RANKS (a wrong plugin would otherwise
    # abort every rank of the real job, or start RANKS worlds of one rank); else one line, exit 2
    local ranks=$1 mpi plugins
    shift
    mpi=$("$PYTHON" -m cfl_mpi.backends.mpi.srun)
    if ! srun --mpi="$mpi" "$@" --kill-on-bad-exit=1 "$PYTHON" -m cfl_mpi.backends.mpi.srun --check-world "$ranks" > /dev/null 2>&1; then
        plugins=$(srun --mpi=list 2>&1 | awk '/^\t/ {printf "%s%s", sep, $1; sep = ", "}')
        echo "cfl_mpi: srun --mpi=$mpi did not start one MPI world of $ranks ranks with this MPI: set CFL_SRUN_MPI to the plugin it speaks (this srun has: $plugins), or CFL_LAUNCHER=mpirun" >&2
        exit 2
    fi
    echo "$mpi"
}

cfl_uses_srun() {
    [ "${CFL_LAUNCHER:-srun}" = srun ] && command -v srun > /dev/null
}

cfl_launch() {  # cfl_launch RANKS ARGS...: start the job's ranks, watched (cfl_supervised)
    local ranks=$1 mpi
    shift
    if cfl_uses_srun; then
        mpi=$(cfl_srun_mpi "$ranks" --ntasks="$ranks")
        cfl_supervised srun --mpi="$mpi" --ntasks="$ranks" --kill-on-bad-exit=1 "$PYTHON" -m cfl_mpi.main "$@"
    else
        cfl_supervised mpirun -n "$ranks" "$PYTHON" -m cfl_mpi.main "$@"
    fi
}

cfl_supervised() {  # cfl_supervised LAUNCHER ...: where the launcher ends the job before any rank
    # could say why (a rank killed, a node lost), one line of cfl_mpi's names the ranks, silos
    # and node, in the results folder's failure.txt too (cfl_mpi/commands/supervise.py)
    "$PYTHON" -m cfl_mpi.commands.supervise -- "$@"
}
