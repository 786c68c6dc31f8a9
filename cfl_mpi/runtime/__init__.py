"""The rounds of a job, whatever the backend: the server and silo loops, placement of silos on
ranks and devices, agreement on the data, checkpoints, failures and stops."""
