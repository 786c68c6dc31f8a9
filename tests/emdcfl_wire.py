"""An EMD-CFL server that has sent three silos their plan, and the arrays of an embeddings
message: what the tests of the server's half of a clustering round send it."""

from __future__ import annotations

import numpy as np
from jobs import PROJECT_ROOT

from cfl_mpi.config import load_config


def server_with_plan(directions: list[tuple[int, int]], *overrides: str):
    """An EmdCfl server that has sent 3 silos the plan for `directions`, with their channels
    (the whole samples' W unless `overrides` say otherwise)."""
    from cfl_mpi.channel import SERVER
    from cfl_mpi.channel.local import LocalChannel, LocalHub
    from cfl_mpi.runtime.halves import server_half
    from cfl_mpi.strategies.base import ServerRound

    sets = ["silos=3", "data.rotations=[0,90,180]", "strategy.match_classes=false", *overrides]
    cfg = load_config(PROJECT_ROOT / "configs/digits.yaml", sets)
    hub = LocalHub()
    server = server_half(cfg)
    ctx = ServerRound(1, LocalChannel(SERVER, hub, 5.0, 0.01), [0, 1, 2], {}, {}, first={0, 1, 2})
    server._send_plan(ctx, [0, 1, 2], directions, more=False)
    return server, ctx, {s: LocalChannel(s, hub, 5.0, 0.01) for s in range(3)}


def batch(
    dim: int,
    served=(),
    own=(),
    tau=(),
    measured=(),
    cross=(),
    skipped=(),
    own_labels=(),
    val=(),
    val_labels=(),
    cross_labels=(),
) -> dict[str, np.ndarray]:
    """The arrays of one embeddings message (a silo's batch of pairs); labels and validation
    clouds only where classes are matched."""

    def clouds(arrays):
        return np.stack(arrays).astype(np.float32) if len(arrays) else np.zeros((0, 0, dim), np.float32)

    def labels(arrays):
        return np.stack(arrays).astype(np.int64) if len(arrays) else np.zeros((0, 0), np.int64)

    return {
        "served": np.asarray(served, np.int64),
        "own": clouds(own),
        "tau": np.asarray(tau, np.float64),
        "measured": np.asarray(measured, np.int64),
        "cross": clouds(cross),
        "skipped": np.asarray(skipped, np.int64),
        "own_labels": labels(own_labels),
        "val": clouds(val),
        "val_labels": labels(val_labels),
        "cross_labels": labels(cross_labels),
    }
