"""The MPI backend: all of cfl_mpi that knows MPI (the only package that imports mpi4py).

channel.py (a party's channel, the rank's inbox), frames.py (what travels between ranks),
liveness.py (heartbeats), placement.py (nodes and the collectives of a job's start),
backend.py (the ranks of `python -m cfl_mpi.main`, for the job runner), srun.py
(SLURM's PMI plugin).
"""
