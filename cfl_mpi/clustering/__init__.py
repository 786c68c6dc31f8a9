"""The clustering maths the strategies use: cluster extraction from a distance matrix (EMD-CFL),
optimal bipartition (CFL), principal angles between subspaces (PACFL), label order. No
messages, no MPI: plain NumPy/SciPy on matrices."""
