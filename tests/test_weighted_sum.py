"""The order-free weighted sum a server folds updates into as they arrive: the same bits in
any order, and the correctly rounded mean (math.fsum, an exact reference) to within its
stated bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cfl_mpi.aggregation.rules import fedavg
from cfl_mpi.aggregation.weighted_sum import WeightedSum


def terms(seed: int, count: int, size: int = 64) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """Models whose weights span many magnitudes (1e-7 to 1e3), and counts from 1 to 2^31."""
    rng = np.random.default_rng(seed)
    models = [
        {
            "w": (rng.standard_normal(size) * 10.0 ** rng.integers(-7, 4, size)).astype(np.float32),
            "steps": np.array(int(rng.integers(0, 100)), dtype=np.int64),
        }
        for _ in range(count)
    ]
    counts = [int(n) for n in rng.integers(1, 1 << 31, count) // 10 ** rng.integers(0, 9, count) + 1]
    return models, counts


def mean_of(models, counts, order) -> dict[str, np.ndarray]:
    total = WeightedSum(models[0])
    for i in order:
        total.add(models[i], counts[i], i)
    return total.mean()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(2, 40), shuffle=st.randoms(use_true_random=False))
def test_the_mean_has_the_same_bits_in_any_order(seed, count, shuffle):
    models, counts = terms(seed, count)
    order = list(range(count))
    reference = mean_of(models, counts, order)
    shuffle.shuffle(order)
    shuffled = mean_of(models, counts, order)
    assert shuffled["w"].tobytes() == reference["w"].tobytes()
    assert shuffled["steps"] == reference["steps"]


@pytest.mark.parametrize("seed", range(5))
def test_the_mean_is_the_exact_ones_rounding_within_the_stated_bound(seed):
    """Against math.fsum (exactly rounded): the float64 mean within 2^-41 plus its rounding, so
    the float32 result is the exact mean rounded, or its neighbour where the exact mean lies
    within that bound of a rounding boundary."""
    models, counts = terms(seed, 30, size=400)
    got = mean_of(models, counts, range(30))["w"]
    exact = np.array(
        [math.fsum(float(m["w"][j]) * n for m, n in zip(models, counts)) / sum(counts) for j in range(400)]
    )
    bound = 2.0**-41 + np.abs(exact) * 2.0**-51
    below = np.nextafter(got, np.float32(-np.inf)).astype(np.float64)
    above = np.nextafter(got, np.float32(np.inf)).astype(np.float64)
    # the exact mean lies within half an ulp of the result, widened by the bound
    assert ((exact >= (below + got) / 2 - bound) & (exact <= (got + above) / 2 + bound)).all()
    assert (got == exact.astype(np.float32)).mean() > 0.99


def test_integer_buffers_come_from_the_most_samples_the_lowest_key_among_equals():
    models = [{"w": np.ones(2, np.float32), "steps": np.array(k, dtype=np.int64)} for k in range(4)]
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        assert mean_of(models, [5, 9, 9, 1], order)["steps"] == 1


def test_the_mean_keeps_the_states_order():
    """A model message's layout follows the state's order: integer buffers stay where they are."""
    models = [{"a": np.ones(2, np.float32), "steps": np.array(k), "b": np.zeros(3, np.float32)} for k in range(3)]
    assert list(mean_of(models, [1, 2, 3], range(3))) == ["a", "steps", "b"]


def test_a_lone_term_is_its_own_mean_to_the_last_bit():
    """A cluster of one keeps its silo's model, even weights finer than the sum's quantum."""
    lone = {"w": np.array([1e-30, -3.3e-20, 0.1, 7e5], dtype=np.float32)}
    total = WeightedSum(lone)
    total.add(lone, 12345, 0)
    mean = total.mean()
    assert mean["w"].tobytes() == lone["w"].tobytes() and mean["w"] is not lone["w"]


def test_real_weights_a_soft_clustering_gives_sum_order_free_too():
    models, _ = terms(11, 9)
    weights = [float(w) for w in np.random.default_rng(2).dirichlet(np.ones(9))]
    reference = mean_of(models, weights, range(9))
    assert mean_of(models, weights, [8, 0, 7, 1, 6, 2, 5, 3, 4])["w"].tobytes() == reference["w"].tobytes()
    exact = [math.fsum(float(m["w"][j]) * w for m, w in zip(models, weights)) for j in range(64)]
    np.testing.assert_allclose(reference["w"], np.array(exact) / math.fsum(weights), rtol=1e-6, atol=1e-12)


def test_fedavg_is_the_order_free_mean():
    models, counts = terms(7, 12)
    np.testing.assert_array_equal(fedavg(models, counts)["w"], mean_of(models, counts, reversed(range(12)))["w"])


def test_huge_weights_a_hostile_silo_sends_still_sum_order_free():
    """Weights up to float32's largest, counts up to 2^31: the coarse bins take them, and an
    honest term after them is summed as exactly as before."""
    rng = np.random.default_rng(5)
    huge = np.finfo(np.float32).max
    models = [{"w": rng.standard_normal(8).astype(np.float32)} for _ in range(6)]
    models[2] = {"w": np.full(8, huge / 4, dtype=np.float32)}
    models[4] = {"w": np.full(8, -1e30, dtype=np.float32)}
    counts = [3, 1 << 30, 7, 100, 1 << 31, 9]
    reference = mean_of(models, counts, range(6))
    for order in ([5, 4, 3, 2, 1, 0], [2, 0, 4, 1, 5, 3]):
        assert mean_of(models, counts, order)["w"].tobytes() == reference["w"].tobytes()
    exact = [math.fsum(float(m["w"][j]) * n for m, n in zip(models, counts)) / sum(counts) for j in range(8)]
    np.testing.assert_allclose(reference["w"], np.array(exact, dtype=np.float32), rtol=1e-6)


def test_a_weight_that_is_not_finite_is_refused_and_nothing_is_folded():
    total = WeightedSum({"w": np.zeros(2, np.float32)})
    total.add({"w": np.array([1.0, 2.0], np.float32)}, 4, 0)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="not finite"):
            total.add({"w": np.array([bad, 0.0], np.float32)}, 1, 2)
    total.add({"w": np.array([3.0, 4.0], np.float32)}, 4, 3)
    np.testing.assert_array_equal(total.mean()["w"], [2.0, 3.0])
