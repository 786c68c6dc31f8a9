"""The staged pair plan (strategies/emdcfl/staged_pairs.py): each stage's decisions on matrices whose
answer is known, replayed as look-ups into a full W, as the server fills W stage by stage."""

from __future__ import annotations

import json

import numpy as np
import pytest
from emdcfl_wire import batch, server_with_plan
from jobs import PROJECT_ROOT, run_job, simulate_job
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.clustering.extraction import extract_clusters
from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.strategies.emdcfl.staged_pairs import StagedPlan


def clustered_W(sizes: list[int], seed: int = 0, gap: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """W in noise units: |N(0, 1)| within a cluster, `gap` + |N(0, 1)| between; and the truth."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    W = np.abs(rng.normal(size=(len(truth), len(truth)))) + gap * (truth[:, None] != truth[None, :])
    np.fill_diagonal(W, 0.0)
    return W, truth


def replay(
    W: np.ndarray,
    sample: int,
    representatives: int = 1,
    seed: int = 0,
    retest: int = 0,
    before_stage=None,
    one_way: bool = False,
    silos=None,
    placed=None,
    members=(),
    measured=None,
) -> StagedPlan:
    """Run a plan over `silos` (default: all) to the end, filling `measured` (default: a fresh
    NaN matrix) from W with the directions it asks for (`before_stage(plan, directions)` may
    edit W before a stage's entries are read from it); `placed` and `members` as in a later
    round."""
    C = len(W)
    plan = StagedPlan(
        list(range(C)) if silos is None else silos,
        C,
        sample=sample,
        representatives=representatives,
        noise_multiple=3.5,
        rng=np.random.default_rng(seed),
        retest=retest,
        one_way=one_way,
        placed=placed,
        members=members,
    )
    if measured is None:
        measured = np.full_like(W, np.nan)
        np.fill_diagonal(measured, 0.0)
    while (directions := plan.next_pairs(measured, np.ones(C))) is not None:
        if before_stage:
            before_stage(plan, directions)
        for r, c in directions:
            assert np.isnan(measured[r, c]), f"direction {(r, c)} planned twice"
            measured[r, c] = W[r, c]
    return plan


@pytest.mark.parametrize("one_way", [False, True])
def test_well_separated_clusters_are_found_with_a_fraction_of_the_pairs(one_way):
    W, truth = clustered_W([50, 50, 50, 50])
    plan = replay(W, sample=20, representatives=2, one_way=one_way)
    assert adjusted_rand_score(truth, plan.labels) == 1.0
    names = [s.name for s in plan.stages]
    assert names == ["sample", "representatives"]
    assert plan.stages[0].clusters == 4 and plan.stages[1].orphans == 0
    # sample²/2 + representatives · K · (C − sample)
    assert [s.pairs for s in plan.stages] == [190, 2 * 4 * 180]
    assert [len(s.directions) for s in plan.stages] == [2 * 190, (1 if one_way else 2) * 2 * 4 * 180]
    assert sum(s.pairs for s in plan.stages) < 0.3 * 200 * 199 / 2


def test_a_cluster_the_sample_misses_is_found_among_the_silos_near_no_representative():
    W, truth = clustered_W([40, 40, 3])  # the third cluster: 3 of 83 silos
    missed = 0
    for seed in range(10):
        plan = replay(W, sample=10, seed=seed)
        assert adjusted_rand_score(truth, plan.labels) == 1.0, seed
        if plan.stages[0].clusters == 2:  # this sample drew none of the third cluster
            missed += 1
            assert plan.stages[1].orphans == 3 and plan.stages[2].name == "all" and plan.stages[2].clusters == 1
    assert missed >= 3  # 10 of 83 silos miss 3 of them with probability ~0.67


@pytest.mark.parametrize("one_way", [False, True])
def test_a_member_just_beyond_its_representatives_cut_joins_its_cluster_on_retest(one_way):
    """Silo x's distance to both representatives of its cluster is 3.8 (cut 3.5), to every other
    member ~0.8: it joins after `retest` more members; with no retest it is a cluster alone.
    One way, x is measured under the members' models only: W[member][x]."""
    W, truth = clustered_W([30, 30], seed=4)
    seen = {}

    def beyond_reps(plan: StagedPlan, directions: list[tuple[int, int]]) -> None:
        if plan.stages[-1].name == "representatives":
            drawn = {s for d in plan.stages[0].directions for s in d}
            reps = sorted(drawn & {s for d in directions for s in d})
            assert not one_way or all(r in reps for r, _ in directions)
            left = sorted({s for d in directions for s in d} - set(reps))
            x = seen["x"] = next(c for c in left if truth[c] == 0)
            same = [r for r in reps if truth[r] == 0]
            W[x, same] = W[same, x] = 3.8

    plan = replay(W, sample=12, representatives=2, retest=4, before_stage=beyond_reps, one_way=one_way)
    assert [s.name for s in plan.stages] == ["sample", "representatives", "retest"]
    assert plan.stages[1].orphans == 1 and plan.stages[2].orphans == 0 and plan.stages[2].pairs == 4
    retest = plan.stages[2].directions
    assert len(retest) == (4 if one_way else 8) and all(
        seen["x"] in d and truth[list(d)].tolist() == [0, 0] for d in retest
    )
    assert not one_way or all(c == seen["x"] for _, c in retest)
    assert adjusted_rand_score(truth, plan.labels) == 1.0
    alone = replay(W, sample=12, representatives=2, retest=0, before_stage=beyond_reps, one_way=one_way)
    assert [s.name for s in alone.stages] == ["sample", "representatives"]  # x: a cluster alone, no stage
    assert len(set(alone.labels)) == 3 and np.sum(alone.labels == alone.labels[seen["x"]]) == 1


def test_a_missed_cluster_is_still_found_after_its_silos_are_retested():
    W, truth = clustered_W([40, 40, 3])
    for seed in range(10):
        plan = replay(W, sample=10, seed=seed, retest=4)
        assert adjusted_rand_score(truth, plan.labels) == 1.0, seed
        if plan.stages[0].clusters == 2:
            assert [s.name for s in plan.stages[1:]] == ["representatives", "retest", "all"]
            assert plan.stages[2].orphans == 3 and plan.stages[2].pairs == 3 * 4


def test_with_no_more_silos_than_the_sample_the_plan_is_all_pairs_and_the_robust_rule():
    W, truth = clustered_W([5, 5, 2], seed=3)
    plan = replay(W, sample=12)
    assert [s.name for s in plan.stages] == ["all"] and plan.stages[0].pairs == 66
    np.testing.assert_array_equal(plan.labels, extract_clusters(W, noise=np.ones(12))[0])


def test_the_representatives_are_the_medoids_not_an_outlying_member():
    W, _ = clustered_W([6, 6], seed=1)
    W[0, 1:6] = W[1:6, 0] = 3.0  # silo 0 is inside its cluster's cut but farther than the rest
    plan = StagedPlan(
        list(range(12)), 12, sample=8, representatives=1, noise_multiple=3.5, rng=np.random.default_rng(0), one_way=True
    )
    measured = np.full_like(W, np.nan)
    np.fill_diagonal(measured, 0.0)
    pairs = plan.next_pairs(measured, np.ones(12))
    drawn = sorted({s for p in pairs for s in p})
    for a, b in pairs:
        measured[[a, b], [b, a]] = W[[a, b], [b, a]]
    reps = sorted({r for r, _ in plan.next_pairs(measured, np.ones(12))})  # one way: (representative, silo)
    assert 0 in drawn and 0 not in reps and len(reps) == 2


def later_round(
    W: np.ndarray,
    first: list[int],
    new: list[int],
    members: list[int],
    seed: int = 0,
    representatives: int = 1,
    retest: int = 0,
) -> tuple[StagedPlan, StagedPlan, np.ndarray]:
    """A plan over the silos `first` of round 1, then one over `new` silos in a later round
    in which the placed silos `members` train (late silos, partial participation)."""
    measured = np.full_like(W, np.nan)
    np.fill_diagonal(measured, 0.0)
    first_plan = replay(
        W, sample=10, representatives=representatives, seed=seed, one_way=True, silos=first, measured=measured
    )
    later = replay(
        W,
        sample=10,
        representatives=representatives,
        seed=seed + 1,
        retest=retest,
        one_way=True,
        silos=new,
        placed=first_plan.labels,
        members=members,
        measured=measured,
    )
    return first_plan, later, measured


def test_silos_new_in_a_later_round_join_the_clusters_of_the_members_training_with_them():
    W, truth = clustered_W([30, 30, 30], seed=5)
    rng = np.random.default_rng(0)
    order = rng.permutation(90)
    first, new = sorted(order[:60].tolist()), sorted(order[60:].tolist())
    members = sorted(rng.choice(first, 20, replace=False).tolist())  # a third of the placed silos train
    first_plan, later, measured = later_round(W, first, new, members, representatives=2)
    assert (later.labels[first] == first_plan.labels[first]).all()  # nobody placed earlier moves
    assert adjusted_rand_score(truth, later.labels) == 1.0 and later.unplaced == []
    assert [s.name for s in later.stages] == ["representatives"]
    reps = sorted({r for r, _ in later.stages[0].directions})
    assert set(reps) <= set(members) and sorted(truth[reps].tolist()) == [0, 0, 1, 1, 2, 2]
    assert later.stages[0].pairs == len(reps) * len(new) and np.isnan(measured[np.ix_(new, new)]).sum() == 30 * 29


def test_an_earlier_representative_training_again_represents_its_cluster_again():
    """The best measured members first: an earlier representative was measured against every
    silo it placed, a silo it placed against one or two members only."""
    W, truth = clustered_W([30, 30], seed=3)
    measured = np.full_like(W, np.nan)
    np.fill_diagonal(measured, 0.0)
    first_plan = replay(W, sample=10, one_way=True, silos=list(range(50)), measured=measured)
    earlier = sorted({r for r, _ in first_plan.stages[1].directions})
    placed_only = [c for c in range(50) if c not in {s for d in first_plan.stages[0].directions for s in d}]
    members = sorted(earlier + placed_only[:10])
    later = replay(
        W,
        sample=10,
        one_way=True,
        silos=list(range(50, 60)),
        placed=first_plan.labels,
        members=members,
        measured=measured,
    )
    assert sorted({r for r, _ in later.stages[0].directions}) == earlier
    assert adjusted_rand_score(truth, later.labels) == 1.0


def test_a_new_cluster_among_the_new_silos_is_found_when_every_cluster_has_a_member_training():
    W, truth = clustered_W([30, 30, 15], seed=6)
    # round 1: 50 silos of the first two clusters; later: the other 10 and the third cluster's 15
    _, later, _ = later_round(W, list(range(50)), list(range(50, 75)), members=[0, 1, 2, 30, 31, 32], retest=2)
    assert adjusted_rand_score(truth, later.labels) == 1.0 and later.unplaced == []
    assert [s.name for s in later.stages] == ["representatives", "retest", "sample", "representatives"]
    assert later.stages[0].orphans == later.stages[1].orphans == 15 and later.stages[2].clusters == 1
    assert {m for m, _ in later.stages[1].directions} <= {0, 1, 2, 30, 31, 32, *range(50, 75)}  # training now


def test_silos_near_no_cluster_wait_unplaced_while_a_cluster_has_no_member_training():
    W, truth = clustered_W([30, 30], seed=7)
    first, new = list(range(20)) + list(range(30, 50)), list(range(20, 30)) + list(range(50, 60))
    first_plan, later, measured = later_round(W, first, new, members=[0, 1, 2])  # only cluster 0 trains
    assert [s.name for s in later.stages] == ["representatives"] and later.stages[0].orphans == 10
    assert later.unplaced == list(range(50, 60)) and (later.labels[50:60] == -1).all()
    assert (later.labels[20:30] == later.labels[0]).all()
    # a later round in which cluster 1 has a member: they join it
    again = replay(
        W,
        sample=10,
        seed=9,
        one_way=True,
        silos=later.unplaced,
        placed=later.labels,
        members=[0, 30],
        measured=measured,
    )
    assert adjusted_rand_score(truth, again.labels) == 1.0 and again.unplaced == []


def test_one_silo_near_no_cluster_is_a_cluster_of_its_own_without_a_stage():
    W, truth = clustered_W([20, 20, 1], seed=9)
    _, later, _ = later_round(W, list(range(40)), [10, 40], members=[0, 20])
    assert [s.name for s in later.stages] == ["representatives"] and later.stages[0].orphans == 1
    assert adjusted_rand_score(truth, later.labels) == 1.0 and later.unplaced == []
    alone = replay(W, sample=10, silos=[40])  # a first round in which one silo trains
    assert alone.stages == [] and alone.labels[40] == 0 and (np.delete(alone.labels, 40) == -1).all()


def test_with_no_member_of_any_cluster_training_the_plan_places_nobody():
    W, _ = clustered_W([20, 20], seed=8)
    _, later, _ = later_round(W, list(range(10)) + list(range(20, 30)), [10, 11, 30], members=[])
    assert later.stages == [] and later.unplaced == [10, 11, 30]


def test_the_plan_is_a_function_of_its_seed():
    W, _ = clustered_W([30, 30, 30], seed=2)
    a, b, c = (replay(W, sample=15, seed=s) for s in (4, 4, 5))
    assert [s.directions for s in a.stages] == [s.directions for s in b.stages] != [s.directions for s in c.stages]


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "strategy.pairs=staged --set strategy.rule=neighbourhoods",
            "strategy.pairs: staged places silos by the robust rule's cut",
        ),
        ("strategy.pair_sample=1", "strategy.pair_sample: must be at least 2, got 1"),
        ("strategy.representatives=0", "strategy.representatives: must be at least 1, got 0"),
        ("strategy.retest=-1", "strategy.retest: must be at least 0, got -1"),
    ],
)
def test_option_errors_name_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(PROJECT_ROOT / "configs/digits.yaml", override.split(" --set "))
    assert message in str(err.value) and "\n" not in str(err.value)


# 8 digit silos (2 per rotation), small CNN: the first sample of 4 silos holds 3 rotations,
# so the fourth's 2 silos are near no representative, are retested against the one member of
# their nearest cluster not measured yet (every cluster then holds 2 silos, 1 of them the
# representative), and are measured among themselves.
STAGED = [
    "silos=8",
    "train.rounds=1",
    "model.channels=[16,32]",
    "strategy.pairs=staged",
    "strategy.pair_sample=4",
    "strategy.representatives=1",
    "strategy.pair_keys=seeded",
]


def assert_found_with_an_orphan_stage(records: list[dict], summary: dict) -> None:
    plan = records[0]["pair_plan"]
    assert records[0]["ari"] == 1.0 and summary["n_clusters"] == 4  # all-pairs finds the 4 rotations too
    assert [(s["stage"], s["pairs"]) for s in plan["stages"]] == [
        ("sample", 6),
        ("representatives", 12),
        ("retest", 2),
        ("all", 1),
    ]
    assert plan["stages"][0]["clusters"] == 3 and plan["stages"][1]["orphans"] == plan["stages"][2]["orphans"] == 2
    # the sample and the last silos both ways, the placing stages one way (placement: one_way)
    assert [s["directions"] for s in plan["stages"]] == [12, 12, 2, 2]
    assert plan["pairs"] == 21 and plan["all_pairs"] == 28
    round_1 = {"round": 1, **{k: v for k, v in plan.items() if k != "plan"}}
    assert summary["extraction"]["pair_plan"] == {
        "plan": "staged",
        "pairs": 21,
        "all_pairs": 28,
        "unplaced": 0,
        "rounds": [round_1],
    }
    assert summary["extraction"]["unmeasured_pairs"] == 28 - 21


@pytest.mark.mpi
def test_staged_plan_through_mpirun_finds_the_rotations_and_the_cluster_its_sample_missed(tmp_path):
    proc, summary, records = run_job("configs/digits.yaml", tmp_path, *STAGED, n=3)
    assert "staged pair plan measured 21 of 28 pairs" in proc.stdout
    assert "representatives: 12 pairs of 7 silos, one way, 2 near no cluster" in proc.stdout
    assert_found_with_an_orphan_stage(records, summary)


@pytest.mark.job
def test_staged_plan_in_fedwad_mode(tmp_path):
    summary, records = simulate_job(
        "configs/digits.yaml", tmp_path, *STAGED, "strategy.distance=fedwad", "strategy.ground_cost=chordal"
    )
    assert_found_with_an_orphan_stage(records, summary)


@pytest.mark.job
def test_staged_plan_measures_nothing_after_its_round(tmp_path):
    """The pairs the plan left unmeasured stay so: round 2 swaps no ω and sends no embeddings
    (it measured all 9 the plan skipped at first, a C = 400 run all 76,140)."""
    summary, records = simulate_job("configs/digits.yaml", tmp_path, *STAGED, "train.rounds=2")
    assert_found_with_an_orphan_stage(records[:1], summary)
    assert records[1]["clusters"] == records[0]["clusters"] and "pair_plan" not in records[1]
    assert records[1]["bytes"]["embedding_model"] == records[1]["bytes"]["embeddings"] == 0


# Half of 8 digit silos (two rotations) train a round, silo 5 arrives in round 3. Seed 0 draws
# silos 1, 2 | 6, 7 for round 1 (found by the plan's "all" stage), then 0-3 (0 and 3 join the
# first cluster; the second has no member training), 0, 1, 5, 6 (the late silo 5 joins the
# second) and 1, 2, 4, 6 (4 joins it too): each later round one representative per cluster.
LATE_AND_HALF = [
    "silos=8",
    "data.rotations=[0,90]",
    "participation.fraction=0.5",
    "late_silos=[{silo: 5, round: 3}]",
    "train.rounds=4",
    "model.channels=[16,32]",
    "strategy.pairs=staged",
    "strategy.pair_sample=4",
    "strategy.representatives=1",
    "strategy.pair_keys=seeded",
]


def assert_each_silo_placed_once_where_it_belongs(records: list[dict], summary: dict, W: np.ndarray) -> None:
    placed: dict[int, int] = {}  # silo -> the round its cluster was decided
    for r in records:
        plan = r["pair_plan"]
        assert [s["stage"] for s in plan["stages"]] == (["all"] if r["round"] == 1 else ["representatives"])
        assert plan["unplaced"] == 0 and all(s.get("orphans", 0) == 0 for s in plan["stages"])
        assert (5 in r["participants"]) == (r["round"] == 3) or r["round"] > 3  # the late silo arrives in round 3
        before = list(placed)
        if before:  # nobody placed earlier moves
            earlier = np.asarray(records[r["round"] - 2]["clusters"])[before]
            assert adjusted_rand_score(earlier, np.asarray(r["clusters"])[before]) == 1.0
        placed.update({c: r["round"] for c in r["participants"] if c not in placed})
    assert sorted(placed) == list(range(8)) and placed[5] == 3
    assert records[-1]["ari"] == 1.0 and summary["ari"] == 1.0
    # the summary keeps every round's plan, not only the last one's
    plans = summary["extraction"]["pair_plan"]
    assert plans["rounds"] == [
        {"round": r["round"], **{k: v for k, v in r["pair_plan"].items() if k != "plan"}} for r in records
    ]
    assert plans["pairs"] == sum(r["pair_plan"]["pairs"] for r in records) and plans["all_pairs"] == 28
    together = np.eye(8, dtype=bool)
    for r in records:
        together[np.ix_(r["participants"], r["participants"])] = True
    measured = np.isfinite(W) | np.isfinite(W.T)
    assert (measured <= together).all() and measured.sum() < together.sum()  # fewer pairs than all-pairs


@pytest.mark.mpi
def test_staged_plan_places_late_silos_and_those_partial_participation_left_out(tmp_path):
    proc, summary, records = run_job("configs/digits.yaml", tmp_path, *LATE_AND_HALF, n=3)
    assert "round 3: staged pair plan measured 2 of 6 pairs" in proc.stdout
    assert_each_silo_placed_once_where_it_belongs(records, summary, np.load(tmp_path / "W.npy"))


@pytest.mark.job
def test_staged_plan_with_late_silos_and_partial_participation_in_fedwad_mode(tmp_path):
    summary, records = simulate_job(
        "configs/digits.yaml", tmp_path, *LATE_AND_HALF, "strategy.distance=fedwad", "strategy.ground_cost=chordal"
    )
    assert_each_silo_placed_once_where_it_belongs(records, summary, np.load(tmp_path / "W.npy"))


@pytest.mark.job
def test_a_staged_run_stopped_before_its_late_silo_resumes_to_the_uninterrupted_run(tmp_path):
    """The plans' clusters so far are part of the checkpoint: resumed after round 2, round 3
    places the late silo against them instead of planning every silo afresh."""
    from cfl_mpi.backends.simulate import simulate
    from cfl_mpi.runtime.stop import StopRequest

    class StopAfterRound2(StopRequest):  # as SLURM's SIGTERM would, once round 2 is recorded
        @property
        def requested(self) -> bool:
            metrics = tmp_path / "cut" / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                self.reason = "SIGTERM"
            return self.reason is not None

    full_summary, full = simulate_job("configs/digits.yaml", tmp_path / "full", *LATE_AND_HALF)
    cfg = load_config(PROJECT_ROOT / "configs/digits.yaml", [*LATE_AND_HALF, f"out={tmp_path / 'cut'}"])
    assert simulate(cfg, stop=StopAfterRound2()) is None
    summary = simulate(cfg, resume=True)
    again = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert summary["resumed_after_round"] == 2 and [r["round"] for r in again] == [1, 2, 3, 4]
    for a, b in zip(full, again):
        assert (a["clusters"], a["participants"], a["pair_plan"]["pairs"]) == (
            b["clusters"],
            b["participants"],
            b["pair_plan"]["pairs"],
        )
    np.testing.assert_array_equal(np.load(tmp_path / "cut" / "W.npy"), np.load(tmp_path / "full" / "W.npy"))
    assert summary["ari"] == full_summary["ari"] == 1.0
    # the rounds before the stop keep their plans in the summary: the checkpoint carries them
    pairs = [
        [(r["round"], r["pairs"]) for r in run["extraction"]["pair_plan"]["rounds"]] for run in (summary, full_summary)
    ]
    assert pairs[0] == pairs[1] == [(r["round"], r["pair_plan"]["pairs"]) for r in full]


# ------------------------------------------------------------------ one-way pairs on the wire


def test_a_one_way_pair_fills_w_from_the_model_owners_cloud_and_the_others_cross_cloud():
    """Clouds arrive in batches, as a silo sends whatever is ready: silo 0's own clouds for both
    partners it serves in one message, its cross cloud for silo 2 in another."""
    from cfl_mpi.strategies.emdcfl.distances import pair_distance
    from cfl_mpi.strategies.emdcfl.messages import Embeddings
    from cfl_mpi.strategies.emdcfl.pairs import MEASURE, SERVE

    server, ctx, silos = server_with_plan([(0, 1), (0, 2), (2, 0)])
    assert server.partners == {0: [(2, SERVE | MEASURE), (1, SERVE)], 1: [(0, MEASURE)], 2: [(0, SERVE | MEASURE)]}
    rng = np.random.default_rng(0)
    dim = server.dim_r
    cloud = {k: rng.normal(size=(6, dim)).astype(np.float32) for k in ("0own", "0cross", "1cross", "2own", "2cross")}
    for silo, arrays, noise in (
        (0, batch(dim, [1, 2], [cloud["0own"]] * 2, [0.5, 0.5]), 0.01),
        (1, batch(dim, measured=[0], cross=[cloud["1cross"]]), 0.0),  # it only measures
        (0, batch(dim, measured=[2], cross=[cloud["0cross"]]), 0.0),
        (2, batch(dim, [0], [cloud["2own"]], [0.1], [0], [cloud["2cross"]]), 0.02),
    ):
        silos[silo].send(-1, Embeddings.KIND, 1, arrays, noise=noise)
    server._measure(ctx, server.partners)
    s = server.parts.distance
    assert server.W[0, 1] == pytest.approx(pair_distance(s, cloud["0own"], cloud["1cross"]) - 0.5)
    assert np.isnan(server.W[1, 0])  # silo 1's model embedded nothing
    assert server.W[0, 2] == pytest.approx(pair_distance(s, cloud["0own"], cloud["2cross"]) - 0.5)
    assert server.W[2, 0] == pytest.approx(pair_distance(s, cloud["2own"], cloud["0cross"]) - 0.1)
    assert np.isnan(server.tau[1]) and np.isnan(server.noise[1])  # they belong to no entry measured
    assert server.noise[[0, 2]].tolist() == [0.01, 0.02]


def test_a_silo_that_states_a_noise_where_it_only_measures_is_named():
    """The noise belongs to the rows of W a silo serves: a batch that serves no partner states
    0, and anything else is a message its plan did not ask for."""
    from cfl_mpi.strategies.emdcfl.messages import Embeddings
    from cfl_mpi.wire.messages import ProtocolError

    server, ctx, silos = server_with_plan([(0, 1)])
    silos[1].send(
        -1, Embeddings.KIND, 1, batch(server.dim_r, measured=[0], cross=[np.ones((6, server.dim_r))]), noise=0.1
    )
    with pytest.raises(
        ProtocolError, match="silo 1 sent embeddings of round 1 with noise 0.1 where it serves no partner"
    ):
        server._measure(ctx, server.partners)


@pytest.mark.parametrize(
    "case, words",
    [
        ("own cloud", "partners served \\[0\\]: one it does not serve"),
        ("cross twice", "partners measured \\[0\\]: one it does not measure with or sent already"),
        ("no cloud", "no cloud and no partner skipped \\(at least one\\)"),
        ("skips one not gone", "partners skipped \\[0\\]: one it was not told left"),
        ("one row", "clouds of \\[1\\] rows"),
        ("two sizes", "clouds of \\[6\\] rows, expected 5"),
        ("no τ", "'tau' of 0 along 'served' where 'served' has 1"),
    ],
)
def test_a_batch_its_plan_did_not_ask_for_is_named(case, words):
    """Silo 1 only measures with silo 0 (one cross cloud); silo 0 serves silo 1 (one own
    cloud, its τ and noise); both ways in two cases. Anything else names the silo, the kind,
    the round and the fault."""
    from cfl_mpi.strategies.emdcfl.messages import Embeddings
    from cfl_mpi.wire.messages import ProtocolError

    server, ctx, silos = server_with_plan([(0, 1), (1, 0)] if case in ("two sizes", "cross twice") else [(0, 1)])
    dim = server.dim_r
    ones = np.ones((6, dim))
    sender, sent = {
        "own cloud": (1, [batch(dim, [0], [ones], [0.0])]),
        "cross twice": (1, [batch(dim, measured=[0], cross=[ones])] * 2),  # its own cloud still due
        "no cloud": (1, [batch(dim)]),
        "skips one not gone": (1, [batch(dim, skipped=[0])]),  # silo 0 did not leave
        "one row": (1, [batch(dim, measured=[0], cross=[ones[:1]])]),
        # silo 0 serves and measures silo 1: its second batch's cloud is larger than its first's
        "two sizes": (0, [batch(dim, [1], [ones[:5]], [0.1]), batch(dim, measured=[1], cross=[ones])]),
        "no τ": (0, [batch(dim, [1], [ones])]),
    }[case]
    for arrays in sent:
        silos[sender].send(-1, Embeddings.KIND, 1, arrays, noise=0.01 if len(arrays["served"]) else 0.0)
    with pytest.raises(ProtocolError, match=f"silo {sender} sent embeddings of round 1 with .*{words}"):
        server._measure(ctx, server.partners)
