"""The server's batched pair distances: each entry the bits of the one-pair distance."""

import numpy as np
import pytest

from cfl_mpi.strategies.emdcfl import EmdCflConfig
from cfl_mpi.strategies.emdcfl.distances import pair_distance
from cfl_mpi.strategies.emdcfl.parts import distance_of

SETTINGS = {
    "exact cosine": EmdCflConfig(),
    "exact chordal": EmdCflConfig(ground_cost="chordal"),
    "exact sqeuclidean": EmdCflConfig(ground_cost="sqeuclidean"),
    "sinkhorn": EmdCflConfig(distance="sinkhorn"),
    "energy": EmdCflConfig(distance="energy", ground_cost="chordal"),
    "fedwad's local references": EmdCflConfig(distance="fedwad", ground_cost="euclidean"),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_batch_of_pairs_gives_each_pairs_distance_bit_for_bit(setting):
    distance = distance_of(SETTINGS[setting])
    rng = np.random.default_rng(5)
    # clouds of several sizes in one batch (equal, a multiple, neither), as a message's pairs are
    sizes = [(30, 30), (30, 30), (17, 34), (29, 31), (30, 30), (17, 34), (2, 5)]
    xs = [rng.normal(size=(n, 9)).astype(np.float32) + 0.3 * k for k, (n, _) in enumerate(sizes)]
    ys = [rng.normal(size=(m, 9)).astype(np.float32) for _, m in sizes]
    batched = distance.between(xs, ys)
    assert batched.shape == (len(sizes),)
    for k, (x, y) in enumerate(zip(xs, ys)):
        assert batched[k] == pair_distance(distance, x, y), (k, sizes[k])
