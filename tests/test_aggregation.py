"""Aggregation rules against independent references (Python's statistics, sorting by hand),
their robustness as properties (hypothesis), and the screening of a cluster's updates."""

import math
import statistics
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cfl_mpi.aggregation.rules import (
    AggregationConfig,
    ClusterSums,
    LocalWork,
    aggregate,
    clip_update,
    cluster_averages,
    coordinate_median,
    fedavg,
    norm_clipped_mean,
    screen_updates,
    trimmed_mean,
    update_norm,
)


def test_weighted_by_sample_counts():
    a = {"w": np.array([0.0, 2.0], dtype=np.float32), "steps": np.array(3, dtype=np.int64)}
    b = {"w": np.array([4.0, 6.0], dtype=np.float32), "steps": np.array(9, dtype=np.int64)}
    out = fedavg([a, b], [100, 300])
    np.testing.assert_allclose(out["w"], [3.0, 5.0])  # (1·a + 3·b) / 4
    assert out["w"].dtype == np.float32
    assert out["steps"] == 9  # integer buffer from the largest member, not averaged


def test_single_member_is_identity_and_bad_weights_fail():
    a = {"w": np.arange(3, dtype=np.float32)}
    np.testing.assert_array_equal(fedavg([a], [7])["w"], a["w"])
    with pytest.raises(ValueError):
        fedavg([a, a], [1, 0])
    with pytest.raises(ValueError):
        fedavg([a], [1, 2])


# ------------------------------------------------------------------ coordinate-wise rules

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def cohorts(draw, min_members=1, max_members=7):
    """m models of two float32 tensors and an integer buffer, of one random shape."""
    m = draw(st.integers(min_members, max_members))
    shape = draw(hnp.array_shapes(max_dims=2, max_side=4))
    return [
        {
            "w": draw(hnp.arrays(np.float32, shape, elements=finite)),
            "b": draw(hnp.arrays(np.float32, (3,), elements=finite)),
            "steps": np.array(draw(st.integers(0, 1000)), dtype=np.int64),
        }
        for _ in range(m)
    ]


def by_coordinate(models, name, reference):
    """Apply `reference` (a function of a Python list) to every coordinate: the definition, by hand."""
    stack = np.stack([m[name] for m in models]).astype(np.float64)
    flat = stack.reshape(len(models), -1)
    return np.array([reference(list(flat[:, j])) for j in range(flat.shape[1])]).reshape(stack.shape[1:])


def trimmed_reference(trim):
    def mean_of_kept(values):
        k = math.floor(trim * len(values))
        kept = sorted(values)[k : len(values) - k]
        return math.fsum(kept) / len(kept)

    return mean_of_kept


@settings(max_examples=60, deadline=None)
@given(cohorts())
def test_median_is_the_coordinatewise_median_of_statistics(models):
    out = coordinate_median(models)
    for name in ("w", "b"):
        expected = by_coordinate(models, name, statistics.median).astype(np.float32)
        np.testing.assert_array_equal(out[name], expected)
        assert out[name].dtype == np.float32
    assert out["steps"] in [m["steps"] for m in models]  # the lower median: a value a member holds


@settings(max_examples=60, deadline=None)
@given(cohorts(), st.sampled_from([0.0, 0.1, 0.2, 1 / 3, 0.45]))
def test_trimmed_mean_cuts_floor_beta_m_values_at_each_end(models, trim):
    out = trimmed_mean(models, trim)
    for name in ("w", "b"):
        expected = by_coordinate(models, name, trimmed_reference(trim))
        np.testing.assert_allclose(out[name], expected.astype(np.float32), rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(cohorts(min_members=3), st.data())
def test_a_hostile_minority_cannot_push_median_or_trimmed_mean_outside_the_honest_range(models, data):
    """Yin et al. 2018: with b hostile members, b < m/2 (median) or b <= ⌊βm⌋ (trimmed mean),
    every output coordinate lies between the honest members' smallest and largest value."""
    m = len(models)
    b = data.draw(st.integers(1, (m - 1) // 2))
    hostile = data.draw(st.sampled_from([3e38, -3e38, 1e30]))
    poisoned = [{**x, "w": np.full_like(x["w"], hostile)} for x in models[:b]] + models[b:]
    honest = np.stack([x["w"] for x in models[b:]])
    trim = (b + 0.25) / m  # ⌊βm⌋ = b, and below 1/2 since b <= (m - 1) / 2
    for out in (coordinate_median(poisoned), trimmed_mean(poisoned, trim)):
        assert np.all(out["w"] >= honest.min(axis=0)) and np.all(out["w"] <= honest.max(axis=0))


@settings(max_examples=40, deadline=None)
@given(cohorts(min_members=2), st.data())
def test_rules_are_permutation_invariant_and_move_with_a_common_shift(models, data):
    order = data.draw(st.permutations(range(len(models))))
    shift = np.float32(data.draw(st.sampled_from([0.5, -3.0, 8.0])))
    shifted = [{**x, "w": x["w"] + shift} for x in models]
    for rule in (coordinate_median, lambda ms: trimmed_mean(ms, 0.2)):
        out = rule(models)
        np.testing.assert_array_equal(rule([models[i] for i in order])["w"], out["w"])
        np.testing.assert_allclose(rule(shifted)["w"], out["w"] + shift, rtol=1e-5, atol=1e-2)


# ------------------------------------------------------------------ norms and clipping


def test_update_norm_is_the_float64_norm_of_the_floating_tensors_only():
    start = {"w": np.zeros((2, 2), np.float32), "b": np.ones(3, np.float32), "steps": np.array(0)}
    model = {"w": np.full((2, 2), 3e38, np.float32), "b": np.ones(3, np.float32), "steps": np.array(10**6)}
    assert update_norm(model, start) == pytest.approx(np.linalg.norm(np.full(4, 3e38)))  # finite, no overflow
    model = {
        "w": np.array([[3.0, 0.0], [0.0, 0.0]], np.float32),
        "b": np.array([1.0, 1.0, 5.0], np.float32),
        "steps": np.array(7),
    }
    assert update_norm(model, start) == pytest.approx(5.0)


@settings(max_examples=40, deadline=None)
@given(cohorts(min_members=2, max_members=2), st.floats(1e-3, 1e3))
def test_clipping_bounds_the_update_norm_and_keeps_its_direction(pair, bound):
    model, start = pair
    clipped = clip_update(model, start, bound)
    norm = update_norm(model, start)
    if norm <= bound:
        assert clipped is model
        return
    # the clipped model is float32 again: exact up to one rounding of every coordinate
    values = np.concatenate([np.abs(x[k]).ravel() for x in pair for k in ("w", "b")])
    rounding = float(np.spacing(np.float32(values.max()))) * np.sqrt(values.size)
    assert update_norm(clipped, start) == pytest.approx(bound, rel=1e-6, abs=rounding)
    delta, kept = model["w"].astype(np.float64) - start["w"], clipped["w"].astype(np.float64) - start["w"]
    np.testing.assert_allclose(kept, delta * bound / norm, rtol=1e-6, atol=rounding)
    assert clipped["steps"] is model["steps"]


def test_norm_clipped_mean_is_fedavg_when_nothing_exceeds_the_bound():
    start = {"w": np.zeros(3, np.float32)}
    models = [
        {"w": np.array([1.0, 0, 0], np.float32)},
        {"w": np.array([0, 2.0, 0], np.float32)},
        {"w": np.array([0, 0, 100.0], np.float32)},
    ]
    np.testing.assert_array_equal(
        norm_clipped_mean(models, [start] * 3, [1, 1, 2], 1e9)["w"], fedavg(models, [1, 1, 2])["w"]
    )
    # M = median norm (2): the third update is scaled to norm 2
    np.testing.assert_allclose(norm_clipped_mean(models, [start] * 3, [1, 1, 2])["w"], [0.25, 0.5, 1.0])


# ------------------------------------------------------------------ screening


def cluster(norms, counts, seed=0):
    """Members whose updates from a common start have the given norms, random directions."""
    rng = np.random.default_rng(seed)
    start = {"w": rng.standard_normal(50).astype(np.float32), "steps": np.array(4)}
    models = []
    for norm in norms:
        direction = rng.standard_normal(50)
        models.append(
            {"w": (start["w"] + norm * direction / np.linalg.norm(direction)).astype(np.float32), "steps": np.array(5)}
        )
    return list(range(len(norms))), models, [start] * len(norms), list(counts)


DEFAULT = AggregationConfig()
BOUNDS = {"norm_ratio": 4.0, "claim_ratio": 16.0, "count_ratio": 2.0}  # the former default's count bound
WORK = LocalWork(epochs=1, batch_size=64, momentum=0.9)  # the train: defaults' batches, one epoch


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.5, 1.5), st.integers(30, 3000)), min_size=1, max_size=8),
    st.sampled_from([WORK, LocalWork(3, 32, 0.9), LocalWork(10, None, 0.0), LocalWork(2, 64, 0.5)]),
    st.integers(0, 10**6),
)
def test_honest_peers_of_any_size_are_weighted_by_their_counts_bit_for_bit(members, work, seed):
    """Honest silos of 30 to 3,000 examples move as far as their local steps take them, at
    rates within 3x of each other: the default screening touches none, and the cluster's model
    is FedAvg's, weighted by the counts as claimed."""
    counts = [n for _, n in members]
    silos, models, starts, _ = cluster([rate * work.displacement(n) for rate, n in members], counts, seed)
    model, screened = aggregate(DEFAULT, 3, silos, models, starts, counts, {c: n for c, n in zip(silos, counts)}, work)
    assert all(d.action == "accepted" for d in screened.decisions)
    assert screened.models == models and screened.weights == counts
    expected = fedavg(models, counts)
    assert all(np.array_equal(model[k], expected[k]) for k in expected)


def test_honest_silos_of_unequal_size_trained_for_real_keep_their_updates_and_counts():
    """Six digits silos of 30 to 860 images, trained from the cluster's model for 3 rounds: the
    default leaves every update and count as it is (the former median-count bound clipped the
    two largest every round). Margins as measured: the largest update reaches 0.27 of its
    bound, and the smallest rate is 14 times the false-claim bound."""
    import torch

    from cfl_mpi.data.digits import load_digit_pool
    from cfl_mpi.models.build import load_arrays, state_arrays
    from cfl_mpi.models.simple_cnn import SimpleCNN
    from cfl_mpi.training.local import train_local
    from cfl_mpi.training.params import TrainConfig

    x, y = load_digit_pool()
    x = np.kron(x, np.ones((3, 3)))[:, None].astype(np.float32)  # 24 x 24: the CNN's two poolings fit
    sizes = [30, 60, 120, 240, 480, 860]
    parts = np.split(np.random.default_rng(0).permutation(len(y)), np.cumsum(sizes))[:-1]
    train = TrainConfig(local_epochs=2, lr=0.01, batch_size=32)
    work, silos, firsts = train.work(), list(range(len(sizes))), dict(enumerate(sizes))
    torch.manual_seed(0)
    net = SimpleCNN(1, 10, 24, channels=(8, 16), embedding_dim=32)
    start = {k: v.copy() for k, v in state_arrays(net).items()}
    upper, claims = [], []
    for t in (1, 2, 3):
        trained = []
        for c, part in enumerate(parts):
            load_arrays(net, start)
            train_local(net, x[part], y[part], train, torch.Generator().manual_seed(100 * t + c), torch.device("cpu"))
            trained.append({k: v.copy() for k, v in state_arrays(net).items()})
        norms = np.array([update_norm(m, start) for m in trained])
        reach = np.array([work.displacement(n) for n in sizes])
        rate, slowing = np.median(norms / reach), np.median(norms / np.sqrt(reach))
        upper.append(max(norms / (DEFAULT.norm_ratio * np.maximum(rate * reach, np.median(norms)))))
        claims.append(min(norms * DEFAULT.claim_ratio / np.minimum(rate * reach, slowing * np.sqrt(reach))))
        model, screened = aggregate(DEFAULT, t, silos, trained, [start] * 6, sizes, firsts, work)
        assert [d.action for d in screened.decisions] == ["accepted"] * 6 and screened.weights == sizes
        expected = fedavg(trained, sizes)
        assert all(np.array_equal(model[k], expected[k]) for k in expected)
        former = aggregate(replace(DEFAULT, count_ratio=2.0), t, silos, trained, [start] * 6, sizes, firsts, work)[1]
        assert [d.action for d in former.decisions][-2:] == ["clipped", "clipped"]
        start = model
    print(f"largest update / its bound {max(upper):.2f}; smallest rate / the false-claim bound {min(claims):.2f}")
    assert max(upper) < 0.75 and min(claims) > 2


def test_a_false_claim_is_rejected_and_a_large_silos_scaled_update_too():
    """A silo that claims 10^9 examples from its first report but moves as its peers do did far
    less than it claims; a large silo's update scaled x10 is far more than its steps give."""
    counts = [200, 300, 400, 500]
    honest = [WORK.displacement(n) for n in counts]
    silos, models, starts, _ = cluster([*honest, honest[0]], [*counts, 10**9])
    claimed = [*counts, 10**9]
    _, screened = aggregate(DEFAULT, 1, [*silos], models, starts, claimed, {}, WORK)
    (rejected,) = [d for d in screened.decisions if d.action != "accepted"]
    assert rejected.silo == 4 and rejected.reason.startswith("sample count 1000000000 claims 15625000 local steps")
    clip = replace(DEFAULT, outliers="clip")
    _, clipped = aggregate(clip, 1, silos, models, starts, claimed, {}, WORK)
    supported = clipped.weights[4]
    assert clipped.decisions[4].action == "clipped" and 200 < supported < 10**9
    for n, action in ((supported, "accepted"), (supported + WORK.batch_size, "clipped")):  # the largest it supports
        again = aggregate(clip, 1, silos, models, starts, [*counts, n], {}, WORK)[1]
        assert again.decisions[4].action == action
    silos, models, starts, _ = cluster([*honest[:3], 10 * honest[3]], counts)
    _, screened = aggregate(DEFAULT, 2, silos, models, starts, counts, {}, WORK)
    (rejected,) = [d for d in screened.decisions if d.action != "accepted"]
    assert rejected.silo == 3 and rejected.reason.endswith("at its 8 local steps")


def test_a_huge_update_is_rejected_with_sender_round_and_reason():
    silos, models, starts, counts = cluster([1.0, 1.1, 0.9, 1e30], [100, 100, 100, 100])
    model, screened = aggregate(DEFAULT, 4, silos, models, starts, counts, {}, WORK)
    (rejected,) = [d for d in screened.decisions if d.action != "accepted"]
    assert rejected.record() == {
        "silo": 3,
        "round": 4,
        "action": "rejected",
        "reason": "update norm 1e+30 above 4 x the cluster median 1.05",
    }
    assert screened.silos == [0, 1, 2]
    expected = fedavg(models[:3], counts[:3])
    assert all(np.array_equal(model[k], expected[k]) for k in expected)


def test_clip_mode_scales_the_outlier_to_the_bound():
    silos, models, starts, counts = cluster([1.0, 1.0, 1.0, 50.0], [100] * 4)
    screened = screen_updates(2, silos, models, starts, counts, {}, WORK, outliers="clip", **BOUNDS)
    assert [d.action for d in screened.decisions] == ["accepted"] * 3 + ["clipped"]
    assert update_norm(screened.models[3], starts[3]) == pytest.approx(4.0, rel=1e-5)


def test_sample_counts_are_bounded_by_the_first_report_and_the_cluster_median():
    silos, models, starts, _ = cluster([1.0, 1.0, 1.0], [0, 0, 0])
    screened = screen_updates(
        5, silos, models, starts, [100, 120, 10**9], {0: 100, 1: 120}, WORK, outliers="reject", **BOUNDS
    )
    assert screened.weights == [100, 120, 240] and screened.first_counts == {2: 10**9}  # its claim, bounded later
    assert (
        screened.decisions[2].action == "clipped" and "above 2 x the cluster median 120" in screened.decisions[2].reason
    )
    screened = screen_updates(
        6,
        silos,
        models,
        starts,
        [100, 500, 120],
        {0: 100, 1: 120, 2: 120},
        WORK,
        outliers="reject",
        **BOUNDS,
    )
    assert screened.weights == [100, 120, 120]
    assert screened.decisions[1].reason == "sample count 500 above its first report 120"


def test_a_count_may_grow_by_the_validation_rows_lent_to_the_clustering_and_no_further():
    silos, models, starts, _ = cluster([1.0, 1.0, 1.0], [0, 0, 0])
    lent = replace(WORK, growth=32)
    screened = screen_updates(
        2, silos, models, starts, [132, 100, 133], {0: 100, 1: 100, 2: 100}, lent, outliers="reject", **BOUNDS
    )
    assert screened.weights == [132, 100, 132]
    assert [d.action for d in screened.decisions] == ["accepted", "accepted", "clipped"]
    reason = "sample count 133 above its first report 100 and the 32 validation rows it lent"
    assert screened.decisions[2].reason == reason


def test_two_members_cannot_be_told_apart_but_the_first_report_still_binds():
    silos, models, starts, _ = cluster([1.0, 1e6], [0, 0])
    screened = screen_updates(
        2, silos, models, starts, [100, 10**9], {0: 100, 1: 90}, WORK, outliers="reject", **BOUNDS
    )
    assert [d.action for d in screened.decisions] == ["accepted", "clipped"] and screened.weights == [100, 90]


@pytest.mark.parametrize(
    "rule,call",
    [
        (AggregationConfig(rule="median", screen=False), lambda ms, ss, ns: coordinate_median(ms)),
        (AggregationConfig(rule="trimmed_mean", trim=0.25, screen=False), lambda ms, ss, ns: trimmed_mean(ms, 0.25)),
        (AggregationConfig(rule="norm_clip", screen=False), lambda ms, ss, ns: norm_clipped_mean(ms, ss, ns)),
        (
            AggregationConfig(rule="norm_clip", clip_norm=0.5, screen=False),
            lambda ms, ss, ns: norm_clipped_mean(ms, ss, ns, 0.5),
        ),
    ],
)
def test_aggregate_applies_the_configured_rule(rule, call):
    silos, models, starts, counts = cluster([1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40])
    model, screened = aggregate(rule, 1, silos, models, starts, counts, {}, WORK)
    np.testing.assert_array_equal(model["w"], call(models, starts, counts)["w"])
    assert screened.first_counts == {0: 10, 1: 20, 2: 30, 3: 40}


@pytest.mark.parametrize(
    "cfg",
    [AggregationConfig(screen=False), AggregationConfig(screen=False, rule="norm_clip", clip_norm=0.5)],
    ids=["fedavg", "norm_clip"],
)
def test_summing_updates_as_they_arrive_gives_cluster_averages_bits_whatever_the_order(cfg):
    """Three clusters (one of one member, one with no update this round), updates folded in a
    shuffled order: the same models, decisions and first counts as the rule over them all."""
    rng = np.random.default_rng(3)
    clusters = np.array([0, 1, 0, 2, 1, 0, 1, 0])
    starts = {c: {"w": rng.standard_normal(50).astype(np.float32), "n": np.array(c)} for c in range(8)}
    updates = {
        c: {"w": starts[c]["w"] + rng.standard_normal(50).astype(np.float32) * 0.3, "n": np.array(10 + c)}
        for c in (0, 2, 3, 5, 7)
    }
    counts = {c: int(rng.integers(10, 500)) for c in updates}
    expected_first: dict[int, int] = {0: 1}
    expected, decisions = cluster_averages(cfg, 4, clusters, updates, counts, starts, expected_first, WORK)
    for order in ([0, 2, 3, 5, 7], [7, 3, 5, 0, 2]):
        sums, first = ClusterSums(cfg, 4, clusters, starts), {0: 1}
        for c in order:
            sums.add(c, updates[c], counts[c])
        models, got = sums.averages(clusters, first)
        assert got == decisions and first == expected_first
        for c in range(8):
            assert models[c]["w"].tobytes() == expected[c]["w"].tobytes() and models[c]["n"] == expected[c]["n"]


def test_a_silo_whose_cluster_moved_after_its_update_was_summed_is_an_error():
    clusters = np.array([0, 0, 1])
    starts = {c: {"w": np.zeros(3, np.float32)} for c in range(3)}
    sums = ClusterSums(AggregationConfig(screen=False), 2, clusters, starts)
    sums.add(1, {"w": np.ones(3, np.float32)}, 5)
    clusters[1] = 1  # the strategy's own array, read as each update comes
    sums.add(2, {"w": np.ones(3, np.float32)}, 5)
    with pytest.raises(ValueError, match=r"silos \[1\] moved"):
        sums.averages(clusters, {})


def test_only_rules_that_decide_each_update_alone_sum_on_arrival():
    assert AggregationConfig(screen=False).streams
    assert AggregationConfig(screen=False, rule="norm_clip", clip_norm=1.0).streams
    for cfg in (
        AggregationConfig(),  # the screening compares each update with the cluster's median
        AggregationConfig(screen=False, rule="norm_clip"),  # the bound is the members' median norm
        AggregationConfig(screen=False, rule="median"),
        AggregationConfig(screen=False, rule="trimmed_mean"),
    ):
        assert not cfg.streams
        with pytest.raises(ValueError, match="every update"):
            ClusterSums(cfg, 1, np.zeros(2, dtype=np.int64), {})
