#!/usr/bin/env bash
# Start a cfl_mpi job locally with the rank count its config needs (1 server + silo ranks,
# honouring runtime.silos_per_rank), so nobody miscounts `mpirun -n`; --print shows the
# mpirun, srun and sbatch lines instead.   Usage: launch/run.sh [--print] CONFIG [--out DIR] [--set k=v ...]
# ($MPIRUN: the mpirun to use.)  This is `python -m cfl_mpi.commands.launch`, with the project's own
# virtual environment (.venv) when there is one and no other is active.
set -euo pipefail
project="$(cd "$(dirname "$0")/.." && pwd)"
python=python3
if [ -n "${VIRTUAL_ENV:-}" ]; then
    python="$VIRTUAL_ENV/bin/python"
elif [ -x "$project/.venv/bin/python" ]; then
    python="$project/.venv/bin/python"
fi
if ! "$python" -c "import cfl_mpi" 2>/dev/null; then
    echo "launch/run.sh: $python cannot import cfl_mpi: install it first (README, Install), or activate its virtual environment" >&2
    exit 2
fi
exec "$python" -m cfl_mpi.commands.launch "$@"
