"""Partial participation, late silos, resumable strategy state and config checks, without MPI."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import yaml
from config_files import config_from
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.clustering.extraction import place_newcomer, symmetrised
from cfl_mpi.config import ConfigError
from cfl_mpi.config.runtime import FaultConfig
from cfl_mpi.runtime.checkpoint import check_resumable
from cfl_mpi.runtime.control import participants, present
from cfl_mpi.runtime.faults import SiloFaults
from cfl_mpi.runtime.halves import server_half
from cfl_mpi.strategies.base import ServerRound
from cfl_mpi.strategies.emdcfl.plans import extract

BASE = """
name: t
silos: 8
data: {name: rotated_digits}
train: {rounds: 6, local_epochs: 1}
strategy: {name: emdcfl}
"""


def json_round_trip(meta):
    return json.loads(json.dumps(meta))


# ------------------------------------------------------------------ who trains


def test_participants_are_a_seeded_sample_that_always_includes_arrivals(tmp_path):
    cfg = config_from(
        tmp_path, BASE, "participation.fraction=0.5", "late_silos=[{silo: 6, round: 3}, {silo: 7, round: 3}]"
    )
    assert present(cfg, 2) == [0, 1, 2, 3, 4, 5] and present(cfg, 3) == list(range(8))
    draws = [participants(cfg, t) for t in range(1, 7)]
    assert all(len(d) == n for d, n in zip(draws, [3, 3, 4, 4, 4, 4]))
    assert {6, 7} <= set(draws[2]) and not {6, 7} & set(draws[0] + draws[1])
    assert draws == [participants(cfg, t) for t in range(1, 7)]  # a function of (seed, round)
    assert len({tuple(d) for d in draws}) > 1
    other_seed = config_from(tmp_path, BASE, "participation.fraction=0.5", "seed=1")
    same_seed = config_from(tmp_path, BASE, "participation.fraction=0.5")
    assert [participants(other_seed, t) for t in range(1, 7)] != [participants(same_seed, t) for t in range(1, 7)]
    assert participants(config_from(tmp_path, BASE, "participation.count=2"), 1).__len__() == 2
    assert participants(config_from(tmp_path, BASE), 4) == list(range(8))


@pytest.mark.parametrize(
    "override, message",
    [
        ("participation={fraction: 0.5, count: 2}", "participation: give either fraction or count"),
        ("participation.fraction=0", "participation.fraction: must lie in (0, 1]"),
        ("participation.count=9", "participation.count: must lie between 1 and silos (8)"),
        ("late_silos=[{silo: 8, round: 2}]", "late_silos[0].silo: must be a distinct silo index in 0..7"),
        ("late_silos=[{silo: 1, round: 1}]", "late_silos[0].round: must lie between 2 and train.rounds (6)"),
        ("late_silos=[{silo: 1, round: 2}, {silo: 1, round: 3}]", "late_silos[1].silo"),
        ("late_silos=[{silo: 1}]", "late_silos[0].round: missing"),
        ("runtime.fault={silo: 1, round: 7}", "runtime.fault.round: must lie between 1 and train.rounds (6)"),
        ("runtime.fault={silo: 1, round: 2, kind: boom}", "runtime.fault.kind: expected one of"),
        ("runtime.fault={silo: 1, round: 2, kind: slow}", "runtime.fault.delay_s: must be > 0 with kind slow"),
        ("runtime.fault={silo: 1, round: 2, delay_s: 1}", "runtime.fault.delay_s: must be > 0 with kind slow"),
    ],
)
def test_federation_config_errors_name_the_field(tmp_path, override, message):
    with pytest.raises(ConfigError, match=None) as err:
        config_from(tmp_path, BASE, override)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_resume_refuses_another_experiment_but_not_other_runtime_settings(tmp_path):
    cfg = config_from(tmp_path, BASE, f"out={tmp_path / 'run'}")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    check_resumable(config_from(tmp_path, BASE, "runtime.message_timeout_s=5"), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^train.lr: differs from the run being resumed"):
        check_resumable(config_from(tmp_path, BASE, "train.lr=0.5"), tmp_path / "run")
    check_resumable(cfg, tmp_path / "nothing-yet")  # no saved config: the checkpoint decides (test_checkpoint.py)


# ------------------------------------------------------------------ late silos


def two_groups_W(rng, size=8, late=(), noise=0.01):
    """W of two clusters (silos < size/2 and the rest); late silos' rows not measured yet."""
    truth = (np.arange(size) >= size // 2).astype(int)
    W = np.where(truth[:, None] == truth[None], 0.0, 0.5) + noise * rng.standard_normal((size, size))
    np.fill_diagonal(W, 0.0)
    for x in late:
        W[x, :] = W[:, x] = np.nan
        W[x, x] = 0.0
    return W, truth


def test_emdcfl_places_a_late_silo_without_moving_anyone(tmp_path):
    rng = np.random.default_rng(0)
    cfg = config_from(tmp_path, BASE, "late_silos=[{silo: 3, round: 3}]")
    strategy = server_half(cfg)
    full, truth = two_groups_W(rng)
    strategy.W[...] = two_groups_W(np.random.default_rng(0), late=[3])[0]
    strategy.noise[...] = 0.01
    before, _ = extract(strategy.W, strategy.noise, strategy.parts.rule, strategy.run)
    assert len(set(before[[0, 1, 2]])) == 1 and before[3] not in before[[0, 1, 2, 4]]
    strategy.W[3, :], strategy.W[:, 3] = full[3, :], full[:, 3]  # measured on arrival
    after, _ = extract(strategy.W, strategy.noise, strategy.parts.rule, strategy.run)
    others = [0, 1, 2, 4, 5, 6, 7]
    assert adjusted_rand_score(before[others], after[others]) == 1.0 and after[3] == after[0]
    arrays, meta = strategy.state_dict()
    again = server_half(cfg)
    again.load_state_dict({k: v.copy() for k, v in arrays.items()}, json_round_trip(meta))
    np.testing.assert_array_equal(again.W, strategy.W)
    assert again.artifacts["W"] is again.W


def test_a_newcomer_far_from_everyone_opens_a_cluster():
    labels = np.array([0, 0, 1, 1, -1])
    D = symmetrised(
        np.array(
            [[0, 0.1, 5, 5, 9], [0.1, 0, 5, 5, 9], [5, 5, 0, 0.1, 8], [5, 5, 0.1, 0, 8], [9, 9, 8, 8, 0]], dtype=float
        )
    )
    assert place_newcomer(D[4], labels, cut=3.5) == 2
    assert place_newcomer(np.array([0.1, 0.2, 5, np.nan, 0]), labels, cut=3.5) == 0
    assert place_newcomer(np.array([1.0, 4.0, 5, 5, 0]), labels, cut=3.5, linkage_method="complete") == 2


def test_cfl_routes_a_late_silo_down_the_tree(tmp_path):
    cfg = config_from(
        tmp_path,
        BASE,
        "strategy.name=cfl",
        "strategy.warmup_rounds=0",
        "strategy.eps1=10",
        "strategy.eps2=0.1",
        "late_silos=[{silo: 7, round: 3}]",
    )
    strategy = server_half(cfg)
    assert strategy.tree.members(0) == list(range(7))
    rng = np.random.default_rng(0)
    directions = rng.standard_normal((2, 50))
    zero = {"w": np.zeros(50, dtype=np.float32)}
    start = {c: zero for c in range(8)}

    def update(c):
        return {"w": (directions[c % 2] + 0.05 * rng.standard_normal(50)).astype(np.float32)}

    ctx = ServerRound(1, None, list(range(7)), {c: update(c) for c in range(7)}, {c: 10 for c in range(7)}, start)
    clusters = strategy.after_training(ctx).copy()
    assert len(strategy.splits) == 1 and clusters[7] == 0  # split by direction; silo 7 not there
    assert len(set(clusters[[0, 2, 4, 6]])) == 1 and clusters[0] != clusters[1]
    ctx = ServerRound(3, None, [7], {7: update(7)}, {7: 10}, start, first={7})
    clusters = strategy.after_training(ctx)
    assert clusters[7] == clusters[1] and 7 in strategy.tree.members(int(clusters[1]))
    arrays, meta = strategy.state_dict()
    again = server_half(cfg)
    again.load_state_dict(arrays, json_round_trip(meta))
    assert again.tree.to_dict() == strategy.tree.to_dict()
    assert again.tree.route(directions[0]) == strategy.tree.route(directions[0])


def test_ifca_state_round_trip(tmp_path):
    cfg = config_from(tmp_path, BASE, "strategy.name=ifca", "strategy.k=2")
    strategy = server_half(cfg)
    arrays, meta = strategy.state_dict()
    again = server_half(cfg)
    again.load_state_dict(arrays, json_round_trip(meta))
    assert again.models is None
    strategy.models = [{"w": np.full(3, k, dtype=np.float32)} for k in range(2)]
    strategy.clusters[:] = [0, 1] * 4
    arrays, meta = strategy.state_dict()
    again.load_state_dict(arrays, json_round_trip(meta))
    assert [m["w"].tolist() for m in again.models] == [[0, 0, 0], [1, 1, 1]]
    assert again.clusters.tolist() == [0, 1] * 4


def test_a_slow_silo_starts_each_round_late_from_its_round_on_and_no_other_does():
    fault = FaultConfig(silo=1, round=2, kind="slow", delay_s=0.2)
    slow, other = SiloFaults(fault, 1), SiloFaults(fault, 0)
    assert [slow.kind(t) for t in (1, 2, 3)] == [None, "slow", "slow"] and other.kind(3) is None
    start = time.monotonic()
    slow.at_round_start(3, channel=None)  # type: ignore[arg-type]  # a delay sends nothing
    assert time.monotonic() - start >= 0.2
