"""What more than one strategy runs: FedWaD's exchange between silos, which FedWaD clustering
and EMD-CFL's FedWaD mode both import (each strategy reads no other's halves)."""
