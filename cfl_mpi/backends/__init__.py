"""How a job's ranks run and talk: the job runner every backend shares, the simulator (every rank
in one process), TCP sockets and MPI."""
