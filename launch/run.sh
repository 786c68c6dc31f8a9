#!/usr/bin/env bash
# Start a cfl_mpi job locally with the rank count its config needs (1 server + silo ranks,
# honouring runtime.silos_per_rank), so nobody miscounts `mpirun -n`; --print shows the
# mpirun, srun and sbatch lines instead.   Usage: launch/run.sh [--print] CONFIG [--out DIR] [--set k=v ...]
# ($MPIRUN: the mpirun to use.)  This is `python -m cfl_mpi.launch`.
exec python -m cfl_mpi.launch "$@"
