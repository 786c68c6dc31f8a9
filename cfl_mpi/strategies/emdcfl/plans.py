"""Which pairs of silos a clustering round measures, stage by stage, and the clusters they give.

A pair plan is one of EMD-CFL's two parts (the other, the distance of a pair: distances.py):
the server half sends each stage's directions, measures them, and asks the plan for the next
stage until none follows, then for the clusters. `AllPairs` is the paper's (Algorithm 1: every
pair not yet measured, both ways, one stage); `StagedPairs` plans stages from the distances
measured so far (staged_pairs.py), for populations whose C(C−1)/2 pairs cost too much.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ...clustering.extraction import (
    ExtractionReport,
    extract_clusters,
    noise_or_one,
    partition_report,
    place_newcomer,
    symmetrised,
)
from ...clustering.labels import relabel_by_first_appearance
from ...console import say
from .pairs import Pair, both_ways
from .staged_pairs import StagedPlan

if TYPE_CHECKING:
    from ..base import RunFacts, ServerRound


class PairPlan(Protocol):
    """One clustering round's stages: `start` before the silos train, `stage` with W and the
    noise measured so far, `clusters` once a stage said that none follows."""

    def start(self, ctx: ServerRound) -> None:
        """A new round over the silos training in it (`ctx.participants`)."""

    def stage(self, W: np.ndarray, noise: np.ndarray) -> tuple[list[Pair], bool]:
        """The next stage's directions (r, c) to measure, and whether another stage follows."""

    def clusters(
        self, ctx: ServerRound, W: np.ndarray, noise: np.ndarray, seconds: list[float], earlier: dict
    ) -> tuple[np.ndarray, dict] | None:
        """The round's clusters and extraction report (`earlier`: the last round's), given each
        stage's seconds; None where the round measured nothing and the clusters stay."""

    def may_move(self) -> bool:
        """Whether, once the round's first stage is planned, `clusters` may give new ones."""


@dataclass(frozen=True)
class Neighbourhoods:
    """The paper's rule: silos c and c' are neighbours when W < ε both ways, and a cluster is
    a set of identical neighbourhoods (`rule: neighbourhoods`); a late silo joins by complete
    linkage at ε."""

    epsilon: float

    def extract(self, W: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, ExtractionReport]:
        return extract_clusters(W, rule="neighbourhoods", epsilon=self.epsilon)

    def placing(self, W: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, float, str]:
        """(the distances a late silo is placed by, the cut, the linkage)."""
        return symmetrised(W), self.epsilon, "complete"


@dataclass(frozen=True)
class Robust:
    """Average-linkage clusters cut at `noise_multiple` times each silo's measured noise
    (`rule: robust`); a late silo joins by average linkage in the same units."""

    noise_multiple: float
    clear_gap: float | None  # keep a split only where its clusters join this many times higher

    def extract(self, W: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, ExtractionReport]:
        return extract_clusters(
            W, rule="robust", noise=noise, noise_multiple=self.noise_multiple, clear_gap=self.clear_gap
        )

    def placing(self, W: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, float, str]:
        return symmetrised(W, noise), self.noise_multiple, "average"


ClusterRule = Neighbourhoods | Robust


def extract(W: np.ndarray, noise: np.ndarray, rule: ClusterRule, run: RunFacts) -> tuple[np.ndarray, dict]:
    """Clusters of the silos present from round 1 (re-extracted whenever partial participation
    has measured more pairs), then each late silo placed in order of arrival, so a late silo
    never moves anyone (place_newcomer); and the extraction report."""
    late = [c for c, _ in run.late_joins]
    base = [c for c in range(run.silos) if c not in late]
    noise = noise_or_one(noise)  # a silo never measured stays alone (its row is all NaN)
    labels, report = rule.extract(W[np.ix_(base, base)], noise[base])
    D, cut, how = rule.placing(W, noise)
    clusters = np.full(run.silos, -1, dtype=np.int64)
    clusters[base] = labels
    for x in late:
        clusters[x] = place_newcomer(D[x], clusters, cut, how)
    return relabel_by_first_appearance(clusters), dataclasses.asdict(report)


@dataclass(frozen=True)
class Staging:
    """A staged plan's parameters (`pairs: staged`, staged_pairs.py)."""

    sample: int
    representatives: int
    retest: int
    one_way: bool  # `placement: one_way`
    noise_multiple: float


class AllPairs:
    """The paper's plan: the pairs of silos training now that were never measured, both ways,
    in one stage (a pair is measured the first round both silos train, Appendix E.4). A
    direction whose clouds share no class (`unmatched`: the server's set) counts as measured."""

    def __init__(self, rule: ClusterRule, run: RunFacts, unmatched: set[Pair]) -> None:
        self.rule, self.run, self.unmatched = rule, run, unmatched
        self.silos: list[int] = []
        self.measured = False

    def start(self, ctx: ServerRound) -> None:
        self.silos, self.measured = sorted(ctx.participants), False

    def stage(self, W: np.ndarray, noise: np.ndarray) -> tuple[list[Pair], bool]:
        silos = self.silos

        def unmeasured(a: int, b: int) -> bool:
            return any(np.isnan(W[d]) and d not in self.unmatched for d in ((a, b), (b, a)))

        wanted = both_ways([(a, b) for i, a in enumerate(silos) for b in silos[i + 1 :] if unmeasured(a, b)])
        self.measured = bool(wanted)
        return wanted, False

    def clusters(
        self, ctx: ServerRound, W: np.ndarray, noise: np.ndarray, seconds: list[float], earlier: dict
    ) -> tuple[np.ndarray, dict] | None:
        return extract(W, noise, self.rule, self.run) if self.measured else None

    def may_move(self) -> bool:
        return self.measured


class StagedPairs:
    """Stages planned from the distances so far (`pairs: staged`, staged_pairs.py) over the
    silos training now that no earlier round's plan placed, against the earlier clusters'
    members training now; the pairs a plan left unmeasured stay so in later rounds. `placed`
    (-1: not placed) is the server's array, updated in place, so a checkpoint holds it."""

    def __init__(self, staging: Staging, run: RunFacts, placed: np.ndarray) -> None:
        self.staging, self.run, self.placed = staging, run, placed
        self.plan: StagedPlan | None = None
        self.training: list[int] = []  # the round's participants, less those that leave as it goes

    def start(self, ctx: ServerRound) -> None:
        s, silos = self.staging, sorted(ctx.participants)
        self.training = ctx.participants  # the server's own list: a silo that leaves is taken out of it
        self.plan = None  # no new silo: placed by pairs measured earlier, or by none
        if new := [c for c in silos if self.placed[c] < 0]:
            self.plan = StagedPlan(
                new,
                self.run.silos,
                sample=s.sample,
                representatives=s.representatives,
                noise_multiple=s.noise_multiple,
                rng=np.random.default_rng([self.run.seed, 13, ctx.round]),
                retest=s.retest,
                one_way=s.one_way,
                placed=self.placed,
                members=[c for c in silos if self.placed[c] >= 0],
            )

    def stage(self, W: np.ndarray, noise: np.ndarray) -> tuple[list[Pair], bool]:
        """The next stage, planned without the silos that left the federation since the round
        began (`runtime.on_silo_failure: drop`): their pairs stay unmeasured, and they alone."""
        if self.plan is None:
            return [], False
        for silo in set(self.plan.taking_part) - set(self.training):
            self.plan.drop(silo)
        wanted = self.plan.next_pairs(W, noise)
        return wanted or [], wanted is not None

    def may_move(self) -> bool:
        return self.plan is not None  # a silo to place

    def clusters(
        self, ctx: ServerRound, W: np.ndarray, noise: np.ndarray, seconds: list[float], earlier: dict
    ) -> tuple[np.ndarray, dict] | None:
        """The plan's clusters (a silo not placed yet trains alone, as one all-pairs never
        measured), the report over the pairs measured, and every round's plan so far."""
        if self.plan is None:
            return None
        stages = [
            {
                "stage": stage.name,
                "silos": stage.silos,
                "pairs": stage.pairs,
                "directions": len(stage.directions),
                "seconds": round(spent, 4),
                **(
                    {"orphans": stage.orphans}
                    if stage.name in ("representatives", "retest")
                    else {"clusters": stage.clusters}
                ),
            }
            for stage, spent in zip(self.plan.stages, seconds, strict=True)
        ]
        silos = self.plan.silos  # of the round's start: with those that left since
        measured = sum(stage.pairs_measured(W) for stage in self.plan.stages)
        every = len(silos) * (len(silos) - 1) // 2
        self.placed[...] = self.plan.labels
        labels = self.placed.copy()
        alone = np.flatnonzero(labels < 0)
        labels[alone] = labels.max(initial=-1) + 1 + np.arange(len(alone))
        clusters = relabel_by_first_appearance(labels)
        report = partition_report(W, clusters, noise, self.staging.noise_multiple)
        unplaced = len(self.plan.unplaced)
        this_round = {"pairs": measured, "all_pairs": every, "stages": stages, "unplaced": unplaced}
        ctx.facts["pair_plan"] = {"plan": "staged", **this_round}
        rounds = [*earlier.get("pair_plan", {}).get("rounds", []), {"round": ctx.round, **this_round}]
        so_far = {
            "plan": "staged",
            "pairs": sum(r["pairs"] for r in rounds),  # summary.json's extraction.pair_plan
            "all_pairs": self.run.silos * (self.run.silos - 1) // 2,
            "unplaced": unplaced,
            "rounds": rounds,
        }
        parts = [
            f"{x['stage']}: {x['pairs']} pairs of {x['silos']} silos, "
            + ("one way, " if x["pairs"] and x["directions"] == x["pairs"] else "")
            + (f"{x['orphans']} near no cluster" if "orphans" in x else f"{x['clusters']} clusters")
            for x in stages
        ]
        if unplaced:
            parts.append(f"{unplaced} near no cluster with a member training: alone until a later round")
        say(
            f"round {ctx.round}: staged pair plan measured {measured} of {every} pairs "
            f"({100 * measured / max(every, 1):.1f} %) in {len(stages)} stages: " + "; ".join(parts)
        )
        return clusters, {**dataclasses.asdict(report), "pair_plan": so_far}
