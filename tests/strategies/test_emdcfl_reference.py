"""The silo's reference distance τ and noise scale (the pair distance's `reference`)."""

import numpy as np
import ot

from cfl_mpi.ot.wasserstein import w1
from cfl_mpi.strategies.emdcfl import EmdCflConfig
from cfl_mpi.strategies.emdcfl.distances import sample_size
from cfl_mpi.strategies.emdcfl.parts import distance_of

W1 = distance_of(EmdCflConfig(match_classes=False))  # τ of the whole samples


def clouds(seed, n, scale=1.0):
    """Non-negative (ReLU-like) embeddings; `scale` stretches the first half of the features."""
    x = np.abs(np.random.default_rng(seed).normal(size=(n, 32)))
    x[:, :16] *= scale
    return x.astype(np.float32)


def test_tau_is_w1_between_training_and_validation_embeddings():
    """At unequal sizes the larger cloud is cut to evenly spaced rows, here 40 of the 60."""
    z, v = clouds(0, 60), clouds(1, 40)
    tau, noise = W1.reference(z, v, 28, np.random.default_rng(0))
    cut = z[np.linspace(0, 59, 40).round().astype(int)]
    cost = ot.dist(cut.astype(np.float64), v.astype(np.float64), metric="cosine")
    assert abs(tau - ot.emd2(np.full(40, 1 / 40), np.full(40, 1 / 40), cost)) < 1e-9
    assert noise > 0


def test_noise_is_the_spread_of_w_under_the_same_distribution():
    """A W entry between two silos of one distribution lies within a few noise units of 0;
    one between different distributions lies far outside."""
    z, v = clouds(0, 200), clouds(1, 200)
    tau, noise = W1.reference(z, v, 28, np.random.default_rng(0))
    rng = np.random.default_rng(5)
    r = rng.standard_normal((32, 28)).astype(np.float32)
    same = w1(z @ r, clouds(2, 200) @ r) - tau
    other = w1(z @ r, clouds(3, 200, scale=10.0) @ r) - tau
    assert abs(same) < 3.5 * noise < other


def test_deterministic_given_the_generator_and_sample_size_rule():
    z, v = clouds(0, 50), clouds(1, 30)
    a = W1.reference(z, v, 28, np.random.default_rng(7))
    b = W1.reference(z, v, 28, np.random.default_rng(7))
    assert a == b
    s = EmdCflConfig()
    sizes = ((647, 72), (100_000, 11_111), (2_000, 222), (90, 10), (46, 30), (5, 1))  # (training, validation)
    assert [sample_size(0.1, s.max_rows, n, v) for n, v in sizes] == [65, 512, 200, 9, 5, 2]  # the paper's 10 %
    assert [sample_size(s.sample_fraction, s.max_rows, n, v) for n, v in sizes] == [72, 512, 222, 10, 30, 2]
