"""The staged pair plan (strategies/emdcfl/staged_pairs.py) when silos leave the federation in
its round (`runtime.on_silo_failure: drop`): the stages after a silo left are planned without
it, and the silos still there are clustered as ever. Replayed on matrices whose answer is
known, as the server fills W stage by stage (a silo that left leaves its pairs unmeasured)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.strategies.emdcfl.staged_pairs import StagedPlan


def test_silos_that_leave_during_the_plan_are_planned_no_more_and_the_others_are_clustered():
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(3), 8)  # 24 silos in 3 clusters; W in noise units
    W = np.abs(rng.normal(size=(24, 24))) + 10.0 * (truth[:, None] != truth[None, :])
    np.fill_diagonal(W, 0.0)
    plan = StagedPlan(list(range(24)), 24, sample=6, representatives=1, noise_multiple=3.5,
                      rng=np.random.default_rng(1), retest=2, one_way=True)  # fmt: skip
    measured = np.full_like(W, np.nan)
    np.fill_diagonal(measured, 0.0)
    gone: set[int] = set()
    stages = []
    while (directions := plan.next_pairs(measured, np.ones(24))) is not None:
        assert not {s for d in directions for s in d} & gone, "a silo that left is planned again"
        if not stages:  # in the sample stage: one of the sample, and one silo still to place
            sampled = sorted({s for d in directions for s in d})
            leaving = {sampled[0], next(c for c in range(24) if c not in sampled)}
        else:
            leaving = set()
        for r, c in directions:
            if not {r, c} & leaving:  # a silo that leaves during the stage sends none of its pairs
                measured[r, c] = W[r, c]
        for silo in leaving:
            plan.drop(silo)
        gone |= leaving
        stages.append(len(directions))
    here = [c for c in range(24) if c not in gone]
    assert len(stages) >= 2 and (plan.labels[sorted(gone)] == -1).all() and not plan.unplaced
    assert adjusted_rand_score(truth[here], plan.labels[here]) == 1.0
    assert sorted(plan.taking_part) == here
