"""Client-level differential privacy (`privacy.dp: central`, DP-FedAvg): the ε a run reports is
the accountant's, the cluster model is the clipped mean with noise of the stated scale, the
settings it does not cover are config errors, and EMD-CFL's clusters do not move with it."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from config_files import config_from
from jobs import simulate_job

from cfl_mpi.aggregation.rules import DpNoise, dp_fedavg
from cfl_mpi.config import ConfigError
from cfl_mpi.privacy.dp import PrivacyConfig, epsilon_spent, noise_multiplier_for
from cfl_mpi.runtime.halves import server_half
from cfl_mpi.strategies.base import ServerRound

dp_accounting = pytest.importorskip("dp_accounting", reason="privacy.dp's accountant (pip install dp-accounting)")


@pytest.mark.parametrize(("z", "rounds", "delta"), [(0.8, 1, 1e-5), (1.1, 10, 1e-5), (4.0, 50, 1e-6)])
def test_epsilon_is_the_rdp_accountant_s_and_within_the_classic_bound(z, rounds, delta):
    """Google's RDP accountant for T compositions of the Gaussian mechanism, and no more than
    Mironov's conversion of its Rényi divergence T·α / (2z²) (CSF 2017, Prop. 3), minimised
    over integer orders."""
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(z), rounds)
    ours = PrivacyConfig(dp="central", noise_multiplier=z, delta=delta).spent(rounds)
    assert ours == accountant.get_epsilon(delta)
    classic = min(rounds * a / (2 * z * z) + math.log(1 / delta) / (a - 1) for a in range(2, 2000))
    assert 0 < ours <= classic + 1e-9
    assert epsilon_spent(z, 0, delta) == 0.0


@pytest.mark.parametrize(("epsilon", "rounds"), [(1.0, 5), (3.0, 10), (8.0, 50)])
def test_the_noise_for_a_budget_is_the_smallest_that_fits_it(epsilon, rounds):
    z = noise_multiplier_for(epsilon, rounds, 1e-5)
    assert epsilon_spent(z, rounds, 1e-5) <= epsilon < epsilon_spent(z * 0.99, rounds, 1e-5)


def test_a_budget_the_noise_would_exceed_is_refused_with_the_noise_that_fits(tmp_path):
    with pytest.raises(ConfigError) as err:
        config_from(
            tmp_path,
            {"silos": 4, "data": {"name": "rotated_digits"}, "train": {"rounds": 5},
             "privacy": {"dp": "central", "noise_multiplier": 1.0, "epsilon": 3}},
        )  # fmt: skip
    z = noise_multiplier_for(3, 5, 1e-5)
    assert str(err.value) == (
        f"privacy.epsilon: noise_multiplier 1 spends ε = {epsilon_spent(1.0, 5, 1e-5):.3g} in 5 rounds, over 3 "
        f"(set privacy.noise_multiplier to {z:g} or more)"
    )
    fits = {"dp": "central", "noise_multiplier": z, "epsilon": 3}
    config_from(tmp_path, {"silos": 4, "data": {"name": "rotated_digits"}, "train": {"rounds": 5}, "privacy": fits})


def model(rng: np.random.Generator, size: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "w": (scale * rng.standard_normal(size)).astype(np.float32),
        "steps": np.array(7, dtype=np.int64),
    }


def test_the_cluster_model_is_the_clipped_sum_over_the_cluster_s_size():
    """Zero-mean noise of scale 1e-12 aside: s̄ + Σ clip(Δ_c, C) / W, W the cluster's size (5
    here, 3 updates came), an update of norm 10 scaled to C = 1, one within C kept whole."""
    rng = np.random.default_rng(0)
    start = model(rng, 1000)
    big = {"w": start["w"] + 10 * np.eye(1000, dtype=np.float32)[0], "steps": np.array(9)}
    small = {"w": start["w"] + 0.5 * np.eye(1000, dtype=np.float32)[1], "steps": np.array(9)}
    same = {k: v.copy() for k, v in start.items()}
    privacy = PrivacyConfig(dp="central", clip=1.0, noise_multiplier=1e-12)
    out = dp_fedavg([big, small, same], [start] * 3, [start] * 5, DpNoise(privacy, 5, np.random.default_rng(1)))
    expected = start["w"].astype(np.float64)
    expected[0] += 1.0 / 5
    expected[1] += 0.5 / 5
    np.testing.assert_allclose(out["w"], expected, atol=1e-6)
    assert out["w"].dtype == np.float32 and out["steps"] == 7  # integers: the start's


def test_the_noise_is_gaussian_of_z_c_over_the_cluster_s_size():
    rng = np.random.default_rng(2)
    start = model(rng, 200_000)
    privacy = PrivacyConfig(dp="central", clip=0.5, noise_multiplier=2.0)
    out = dp_fedavg([start], [start], [start] * 4, DpNoise(privacy, 4, np.random.default_rng(3)))
    noise = out["w"].astype(np.float64) - start["w"]
    assert abs(noise.std() - 2.0 * 0.5 / 4) < 0.01 * 0.25 and abs(noise.mean()) < 0.005


def test_seeded_noise_repeats_and_ephemeral_noise_does_not():
    seeded = PrivacyConfig(dp="central", noise="seeded")
    ephemeral = PrivacyConfig(dp="central")
    assert seeded.noise_generator(0, 1, 2).random() == seeded.noise_generator(0, 1, 2).random()
    assert seeded.noise_generator(0, 1, 2).random() != seeded.noise_generator(0, 2, 2).random()
    assert ephemeral.noise_generator(0, 1, 2).random() != ephemeral.noise_generator(0, 1, 2).random()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"privacy": {"dp": "central", "clip": 0}}, "privacy.clip: must be positive, got 0"),
        ({"privacy": {"dp": "central", "noise_multiplier": -1}}, "privacy.noise_multiplier: must be positive"),
        ({"privacy": {"dp": "central", "delta": 1}}, "privacy.delta: must lie in (0, 1), got 1"),
        (
            {"privacy": {"dp": "central"}, "aggregation": {"rule": "median"}},
            "privacy.dp: noises DP-FedAvg's clipped sum, not aggregation.rule median (set aggregation.rule: fedavg)",
        ),
        ({"privacy": {"dp": "central"}, "strategy": {"name": "ifca", "k": 2}}, "privacy.dp: ifca aggregates its own"),
    ],
)
def test_what_dp_does_not_cover_is_a_config_error(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        config_from(tmp_path, {"silos": 4, "data": {"name": "rotated_digits"}, **overrides})
    assert message in str(err.value)


@pytest.mark.job
def test_a_dp_run_reports_the_accountant_s_epsilon_and_keeps_emd_cfl_s_clusters(tmp_path):
    """Two rounds of the digits federation, screened off (the server would otherwise sum the
    updates as they come): ε after each round is the accountant's, and the clusters, which
    EMD-CFL fixes in round 1 before any noise, are those of the same run without DP."""
    common = ["train.rounds=2", "train.local_epochs=2", "strategy.pair_keys=seeded", "aggregation.screen=false"]
    plain, plain_records = simulate_job("configs/digits.yaml", tmp_path / "plain", *common)
    private = ["privacy.dp=central", "privacy.clip=0.05", "privacy.noise_multiplier=1.5", "privacy.noise=seeded"]
    summary, records = simulate_job("configs/digits.yaml", tmp_path / "dp", *common, *private)
    assert [r["privacy"]["epsilon"] for r in records] == [epsilon_spent(1.5, t, 1e-5) for t in (1, 2)]
    every = {"epsilon": epsilon_spent(1.5, 2, 1e-5), "rounds": 2}
    clusters = sorted(set(records[-1]["clusters"]))
    assert summary["privacy"] == {**every, "delta": 1e-5, "per_cluster": [{"cluster": k, **every} for k in clusters]}
    assert [r["clusters"] for r in records] == [r["clusters"] for r in plain_records]
    assert summary["ari"] == plain["ari"] == 1.0


def test_the_fixed_denominator_is_the_cluster_s_members_drawn_to_train(tmp_path):
    """Under sampled participation W counts the members drawn in the round (public: the draw
    is a function of the seed), whether or not their updates come, not the cluster's size:
    dividing by all members would shrink every update by the share drawn."""
    cfg = config_from(
        tmp_path,
        {"silos": 8, "data": {"name": "rotated_digits"}, "strategy": {"name": "oracle"}, "privacy": {"dp": "central"}},
    )
    strategy = server_half(cfg)
    truth = cfg.data.true_clusters(8)
    drawn = [0, 1, 3, 6]
    ctx = ServerRound(2, None, drawn, {}, {})  # type: ignore[arg-type]
    noise = strategy._dp_noise(ctx)
    for k in np.unique(truth):
        assert noise(int(k)).size == sum(truth[c] == k for c in drawn)


@pytest.mark.job
def test_under_sampled_participation_epsilon_counts_the_rounds_each_silo_took_part_in(tmp_path):
    """Half the silos a round: ε is the accountant's for the silo whose update entered the
    most rounds (sampling amplifies nothing where the draw is known), never more than every
    round's; each cluster's, for its member that entered the most."""
    private = ["privacy.dp=central", "privacy.clip=0.05", "privacy.noise_multiplier=2", "privacy.noise=seeded"]
    sampled = ["train.rounds=4", "participation.fraction=0.5", "strategy.name=oracle"]
    summary, records = simulate_job("configs/digits.yaml", tmp_path, *sampled, *private)
    for t, record in enumerate(records, 1):
        taken = Counter(c for r in records[:t] for c in r["participants"])
        assert record["privacy"]["rounds"] == max(taken.values()) <= t
        assert record["privacy"]["epsilon"] == epsilon_spent(2.0, max(taken.values()), 1e-5)
        clusters = record["clusters"]
        for entry in record["privacy"]["per_cluster"]:
            most = max(taken[c] for c in range(len(clusters)) if clusters[c] == entry["cluster"])
            assert entry == {"cluster": entry["cluster"], "epsilon": epsilon_spent(2.0, most, 1e-5), "rounds": most}
        assert [e["cluster"] for e in record["privacy"]["per_cluster"]] == sorted(set(clusters))
    assert any(len(r["participants"]) < len(r["accuracy"]) for r in records)
    final = [e["rounds"] for e in summary["privacy"]["per_cluster"]]
    assert len(final) == 4 and min(final) < max(final)  # the clusters spent differently: a real check
    assert summary["privacy"] == records[-1]["privacy"]
