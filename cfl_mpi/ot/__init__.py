"""Optimal transport between empirical measures: exact W1, the energy distance and Sinkhorn,
FedWaD's interpolating measures, and the solvers they call."""
