"""Which pairs EMD-CFL measures when all C(C−1)/2 of them cost too much: stages planned from
the distances measured so far, inside the one clustering round (`strategy.pairs: staged`).

Clustering from pairwise questions fixed in advance needs Ω(C²) of them, but Θ(C·K) when each
batch may depend on the answers so far (Black, Lee, Mazumdar & Saha, NeurIPS 2024); landmarks
measured one-vs-all recover a well-separated clustering (Voevodski et al., JMLR 2012). Here:

1. **sample**: every pair among `sample` silos drawn at random from those not placed yet,
   clustered by the robust rule (`extract_clusters`) exactly as all-pairs clusters all C;
2. **representatives**: the `representatives` medoids of each cluster found (the members
   with the smallest mean distance to the rest of their cluster) are measured against every
   silo not placed yet, each pair with its own handshake and projection: one way (`one_way`),
   W[r][c] alone — silo c's data under representative r's model, so r's ω fans out and r
   embeds nothing — or both ways, as all-pairs;
3. each such silo joins the cluster whose representatives are on average within the cut
   (`place_newcomer`, the rule late silos follow);
4. **retest**: a silo near no representative is measured against `retest` more members of
   the cluster nearest to it, drawn at random (one way: under the member's model), and joins
   it if its mean distance to all the members measured is within the cut: a decision on 2
   pairs sits on W's noise, and an unusual representative can leave an honest member just
   beyond the cut (on many small silos: docs/research/SMALL_SILOS.md);
5. the silos still near no cluster — of a cluster the sample missed — start again at 1
   among themselves, and the clusters they form are new ones.

When `sample` or fewer silos are left, all their pairs are measured and the plan ends: with
C ≤ `sample` it is all-pairs. The pairs measured are about sample²/2 + representatives·K·C
(+ retest per silo near no representative).

Silos that train for the first time after the clusters were found (late silos, or silos that
partial participation left out until then) are placed the same way, from step 2: against
representatives of the existing clusters among the silos training this round (`placed`,
`members`). A silo near none of them starts new clusters at step 1 only if every existing
cluster had a member there to compare with; otherwise it stays unplaced (`unplaced`) and is
placed in a later round it trains in.

A plan asks for *directions*: (r, c) is W[r][c], silo c's data and r's own under r's model
(r sends c its ω). The sample and the last silos are measured both ways, as all-pairs.
Decisions read the symmetrised distance in noise units (`symmetrised(W, noise)`: the larger
direction where both are measured, else the one there), the unit the robust rule cuts in, so
a plan is a function of W, the noise and the seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from ...clustering.extraction import extract_clusters, nearest_cluster, place_newcomer, symmetrised
from .pairs import Pair, both_ways


@dataclass
class Stage:
    """One stage of a plan: what it measured and why (for metrics.jsonl and the console)."""

    name: str  # "sample", "representatives", "retest" or "all" (the last few silos)
    silos: int  # silos it concerned
    directions: list[Pair] = field(default_factory=list)
    clusters: int = 0  # sample, all: the clusters found among its silos
    orphans: int = 0  # representatives, retest: the silos near no cluster after it

    @property
    def pairs(self) -> int:
        """The silo pairs it measured, one way or both."""
        return len({(min(d), max(d)) for d in self.directions})

    def pairs_measured(self, W: np.ndarray) -> int:
        """`pairs`, less those a silo that left the federation left unmeasured."""
        return len({(min(d), max(d)) for d in self.directions if not np.isnan(W[d])})


class StagedPlan:
    """The stages of one clustering round over `silos`; `next_pairs` is called with W and the
    noise measured so far and returns the next stage's pairs, or None once the plan ends (then
    `labels` holds the clusters, and `unplaced` the silos it could not place yet)."""

    def __init__(
        self,
        silos: list[int],
        size: int,
        *,
        sample: int,
        representatives: int,
        noise_multiple: float,
        rng: np.random.Generator,
        retest: int = 0,
        one_way: bool = False,
        placed: np.ndarray | None = None,
        members: Sequence[int] = (),
    ) -> None:
        """`silos`: the silos to place; `placed`: the clusters found in earlier rounds (-1: not
        placed), of which `members` train this round and may represent their cluster."""
        if sample < 2 or representatives < 1 or retest < 0:
            raise ValueError(
                f"sample must be >= 2, representatives >= 1 and retest >= 0, got {sample}, {representatives}, {retest}"
            )
        self.sample, self.representatives, self.cut, self.rng = sample, representatives, noise_multiple, rng
        self.retest, self.one_way = retest, one_way
        # -1: not placed yet (or not taking part)
        self.labels = np.full(size, -1, dtype=np.int64) if placed is None else np.array(placed, dtype=np.int64)
        self.stages: list[Stage] = []
        self._left = sorted(silos)  # silos not placed yet
        self._drawn: list[int] = []  # the current sample, all its pairs measured
        self._reps: list[int] = []  # representatives being measured against `_left`
        self._retesting = False  # `_left` being measured against more members
        self._done = not silos
        self.silos = sorted({*silos, *members})  # the silos of the round's plan
        self._active = np.zeros(size, dtype=bool)  # the silos training this round: partners to draw from
        self._active[list(silos) + list(members)] = True
        self._members = sorted(members)  # placed earlier, training now: the first representatives
        existing = np.unique(self.labels[self.labels >= 0])
        # a silo near no existing cluster starts a new one only if every cluster had a member to compare with
        self._complete = bool(np.isin(existing, self.labels[self._members]).all())

    def drop(self, silo: int) -> None:
        """`silo` left the federation in this round (`runtime.on_silo_failure: drop`): no later
        stage measures it, nor draws it, and it is placed by no stage from now on (one placed
        already keeps its cluster); the pairs it left unmeasured stay so."""
        self._active[silo] = False
        if silo in self._left:
            self._left.remove(silo)

    @property
    def taking_part(self) -> list[int]:
        """The silos the plan may still measure: those it places and the members training
        now, less those that left."""
        return np.flatnonzero(self._active).tolist()

    @property
    def unplaced(self) -> list[int]:
        """The silos left unplaced once the plan ends (near no cluster that had a member here)."""
        return self._left if self._done else []

    def next_pairs(self, W: np.ndarray, noise: np.ndarray) -> list[Pair] | None:
        """The next stage's directions (r, c) to measure, given W and the per-silo noise with
        every earlier stage's directions filled in."""
        if self._done:
            return None
        if self._members:  # earlier rounds' clusters, represented by their members training now
            D = symmetrised(W, noise)
            self._reps, self._members = self._medoids(D, self._here(self._members)), []
            # a pair measured in an earlier round (an unplaced silo's) is not measured again
            if pairs := [(r, c) for r in self._reps for c in self._left if np.isnan(D[r, c])]:
                return self._stage("representatives", self._placing(pairs))
        if self._retesting:
            self._place_left(symmetrised(W, noise))
            self._retesting = False
        elif self._reps:
            D = symmetrised(W, noise)
            self._place_left(D)
            if self._left and self.retest and (pairs := self._retest_pairs(D)):
                self._retesting = True
                return self._stage("retest", self._placing(pairs))
        elif self._drawn:
            self._cluster_sample(W, noise)
            self._reps = self._medoids(symmetrised(W, noise), self._here(self._drawn))
            if self._left and self._reps:
                return self._stage("representatives", self._placing([(r, c) for r in self._reps for c in self._left]))
            self._reps, self._drawn = [], []  # (no representative: every silo of the sample left)
        if len(self._left) == 1 and self._complete:  # one silo, near no cluster: a cluster of its own
            self.labels[self._left.pop()] = self.labels.max() + 1
        if not self._left or not self._complete:
            self._done = True
            return None
        if len(self._left) <= self.sample:
            self._drawn, self._left = self._left, []
            return self._stage("all", both_ways(list(combinations(self._drawn, 2))))
        picked = set(self.rng.choice(len(self._left), self.sample, replace=False).tolist())
        self._drawn = [s for i, s in enumerate(self._left) if i in picked]
        self._left = [s for i, s in enumerate(self._left) if i not in picked]
        return self._stage("sample", both_ways(list(combinations(self._drawn, 2))))

    def _placing(self, pairs: list[Pair]) -> list[Pair]:
        """A placing stage's pairs (member, silo placed) as directions: the member's model
        alone with `one_way`, else both."""
        return pairs if self.one_way else both_ways(pairs)

    def _stage(self, name: str, directions: list[Pair]) -> list[Pair]:
        self.stages.append(Stage(name, len({s for d in directions for s in d}), directions))
        return directions

    def _here(self, silos: Sequence[int]) -> list[int]:
        """Those of `silos` still taking part (none that left: `drop`)."""
        return [s for s in silos if self._active[s]]

    def _cluster_sample(self, W: np.ndarray, noise: np.ndarray) -> None:
        """The robust rule on the sample's own W (of its silos still here); its clusters get
        labels after the existing ones."""
        drawn = np.asarray(self._here(self._drawn), dtype=np.int64)
        if not len(drawn):
            return
        labels, _ = extract_clusters(
            W[np.ix_(drawn, drawn)], rule="robust", noise=noise[drawn], noise_multiple=self.cut
        )
        self.labels[drawn] = labels + self.labels.max() + 1
        self.stages[-1].clusters = int(labels.max()) + 1

    def _medoids(self, D: np.ndarray, candidates: Sequence[int] | np.ndarray) -> list[int]:
        """The `representatives` `candidates` of each of their clusters: the best measured first
        (most pairs measured with the rest of their cluster: in a later round, an earlier
        representative or sample member before a silo placed by one or two pairs; in a sample,
        every member alike), then the smallest mean distance to the rest of it (ties: the lower
        index)."""
        among = np.asarray(candidates)
        reps: list[int] = []
        for k in np.unique(self.labels[among]):
            here, mates = among[self.labels[among] == k], np.flatnonzero(self.labels == k)
            within = D[np.ix_(here, mates)]
            within[here[:, None] == mates[None, :]] = np.nan  # not a member's distance to itself
            counts = np.isfinite(within).sum(axis=1)
            means = np.where(counts > 0, np.nansum(within, axis=1) / np.maximum(counts, 1), np.inf)
            reps += here[np.lexsort((means, -counts))[: self.representatives]].tolist()
        return sorted(reps)

    def _place_left(self, D: np.ndarray) -> None:
        """Each silo left joins the cluster whose members measured with it (the representatives,
        and after a retest the members drawn for it) are on average within the cut; the others
        stay left for the next stage."""
        orphans = []
        for c in self._left:
            k = place_newcomer(D[c], self.labels, self.cut, "average")
            if k <= self.labels.max():  # an existing cluster (else place_newcomer's new label)
                self.labels[c] = k
            else:
                orphans.append(c)
        self._left, self._reps, self._drawn = orphans, [], []
        if self.stages:  # (not when every pair was measured in an earlier round)
            self.stages[-1].orphans = len(orphans)

    def _retest_pairs(self, D: np.ndarray) -> list[Pair]:
        """Each silo left against `retest` members, drawn at random, of the cluster nearest to
        it on average over the members measured so far (not measured with it yet)."""
        pairs = []
        for c in self._left:
            nearest, _ = nearest_cluster(D[c], self.labels, "average")
            if nearest is None:
                continue
            fresh = np.flatnonzero((self.labels == nearest) & np.isnan(D[c]) & self._active)
            pairs += [(int(m), c) for m in sorted(self.rng.choice(fresh, min(self.retest, len(fresh)), replace=False))]
        return pairs
