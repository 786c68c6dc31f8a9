"""EMD-CFL's server half (Zhang, Williams, Toni: Clustered Federated Learning via Embedding
Distributions; Algorithm 1): plans the round's pairs, forms W[c][c'] = W1(Z_{c|c}R, Z_{c'|c}R)
− τ_c by the run's measurement (direct.py: from the silos' projected embeddings; fedwad.py:
by FedWaD) and extracts the clusters (parts.py names the parts).

The round is planned before training, so that a silo starts its handshakes and ω swaps as
soon as it has trained rather than when the slowest silo has.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Mapping

import numpy as np

from ...channel import wait_all
from ...clustering.extraction import extract_clusters
from ...console import say, warn
from ..base import RunFacts, ServerRound, Strategy
from . import EmdCflConfig
from .classes import MIN_ROWS
from .distances import TELL_FLOOR
from .measurement import Record
from .messages import Plan
from .pairs import Pair, partner_roles
from .parts import parts


class EmdCfl(Strategy[EmdCflConfig]):
    """Server half: schedules unmeasured pairs, computes W from projected embeddings, clusters."""

    def __init__(self, params: EmdCflConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.parts = parts(params, run)
        self.dim_r = self.parts.dim_r
        c = run.silos
        self.W = np.full((c, c), np.nan)
        np.fill_diagonal(self.W, 0.0)
        # τ_c per silo, or τ_{c,c'} per ordered pair (`tau_projection: pair`)
        self.tau = np.full((c, c) if self.parts.distance.per_pair_tau else c, np.nan)
        self.noise = np.full(c, np.nan)
        self.extraction: dict = {}
        self.partners: dict[int, list[tuple[int, int]]] = {}  # this stage's (partner, role) per silo
        self.placed = np.full(c, -1, dtype=np.int64)  # the staged plans' clusters so far (-1: not placed)
        self.record = Record(self.W, self.tau, self.noise)
        self.plan = self.parts.plan(run, self.placed, self.record.unmatched)
        self.more = False  # whether the round's plan has a stage after the one sent
        self.unmatched_before: set[Pair] = set()  # the directions found unmatched in earlier rounds
        self.artifacts = {"W": self.W, "tau": self.tau, "noise": self.noise}

    def modules(self) -> tuple[str, ...]:
        return (*super().modules(), *self.parts.distance.modules)

    def initial_clusters(self) -> np.ndarray:
        return np.arange(self.run.silos, dtype=np.int64)  # M = I: every silo alone (line 3)

    def before_training(self, ctx: ServerRound) -> None:
        """Send the first stage of the round's pair plan before training, so a silo needs
        nobody else to start."""
        self.record.stated.clear()  # (noise_c[, τ_c]) as silo c first stated them this round
        self.unmatched_before = set(self.record.unmatched)
        self.plan.start(ctx)
        directions, self.more = self.plan.stage(self.W, self.noise)
        self._send_plan(ctx, sorted(ctx.participants), directions, self.more)

    def _send_plan(self, ctx: ServerRound, silos: list[int], directions: list[Pair], more: bool) -> None:
        """Each silo's partners and roles for the `directions` (r, c) to measure (W[r][c]);
        `more`: another plan follows in this round. Silos with the same plan get it as one
        message (`isend_all`: once per rank): with many silos most plans of a stage are the
        same (no partners, or the same representatives)."""
        self.partners = partner_roles(silos, directions)
        alike: dict[tuple[tuple[int, int], ...], list[int]] = defaultdict(list)
        for silo in silos:
            alike[tuple(self.partners[silo])].append(silo)
        wait_all(
            [
                ctx.channel.isend_all(
                    group,
                    Plan(
                        np.asarray([p for p, _ in plan], dtype=np.int64),
                        np.asarray([r for _, r in plan], dtype=np.uint8),
                        int(more),
                    ),
                    ctx.round,
                )
                for plan, group in alike.items()
            ]
        )

    def settled(self, ctx: ServerRound) -> bool:
        return not self.plan.may_move()  # nothing to measure or place this round

    def after_training(self, ctx: ServerRound) -> np.ndarray:
        """Measure each stage's pairs and send the next stage the plan asks for, until none
        follows; then the plan's clusters (the last ones where the round measured nothing)."""
        more, seconds = self.more, []
        while True:
            start = time.monotonic()
            if any(self.partners.values()):
                self._measure(ctx, self.partners)
            if not more:
                break
            directions, more = self.plan.stage(self.W, self.noise)
            seconds.append(time.monotonic() - start)
            self._send_plan(ctx, sorted(ctx.participants), directions, more)
        if found := self.plan.clusters(ctx, self.W, self.noise, seconds, self.extraction):
            self.clusters, self.extraction = found
            if finding := how_clear(self.extraction, self.params.gap):
                self.extraction["finding"] = finding
                (warn if "weak" in finding else say)(f"round {ctx.round}: EMD-CFL: {finding}")
            if self.record.unmatched:
                self.extraction["unmatched"] = [list(pair) for pair in sorted(self.record.unmatched)]
            if unmatched := sorted(self.record.unmatched - self.unmatched_before):
                say(
                    f"round {ctx.round}: EMD-CFL: {len(unmatched)} of the directions W[c][c'] measured share under "
                    f"{MIN_ROWS} examples of any class and are left unmeasured (c, c'): "
                    f"{', '.join(map(str, unmatched[:8]))}{' ...' if len(unmatched) > 8 else ''}"
                )
            if small := too_small(self.params, self.record.rows, ctx.n_samples):
                self.extraction["too_small"] = small
                warn(f"round {ctx.round}: EMD-CFL: {small['finding']}")
        return self.clusters

    def _measure(self, ctx: ServerRound, partners: dict[int, list[tuple[int, int]]]) -> None:
        """This stage's pairs measured into W (line 16), by the run's measurement."""
        self.parts.measurement.measure(ctx, partners, self.record)

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict]:
        unmatched = np.zeros_like(self.W, dtype=np.uint8)  # a fixed shape, as a checkpoint's arrays
        unmatched[tuple(np.asarray(sorted(self.record.unmatched), dtype=np.int64).reshape(-1, 2).T)] = 1
        arrays = {"clusters": self.clusters, "W": self.W, "tau": self.tau, "noise": self.noise, "placed": self.placed}
        return {**arrays, "unmatched": unmatched}, {"extraction": self.extraction}

    def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        self.clusters = arrays["clusters"].astype(np.int64)
        for name in ("W", "tau", "noise", "placed"):  # in place: self.artifacts and the plan hold these arrays
            getattr(self, name)[...] = arrays[name]
        self.record.unmatched.update((int(c), int(p)) for c, p in np.argwhere(arrays["unmatched"]))
        self.extraction = meta["extraction"]

    def report(self) -> dict:
        """How the clusters were extracted, and what the paper's rule at ε would have said."""
        paper = extract_clusters(self.W, rule="neighbourhoods", epsilon=self.params.epsilon)[0]
        return {
            "extraction": self.extraction,
            "paper_rule": {
                "epsilon": self.params.epsilon,
                "clusters": paper.tolist(),
                "n_clusters": int(paper.max()) + 1,
            },
        }


def too_small(params: EmdCflConfig, samples: Mapping[int, int], examples: Mapping[int, int]) -> dict | None:
    """The silos whose sample (the rows of the clouds they sent) holds too few embeddings for W1
    to tell groups apart (under TELL_FLOOR), with the training examples each claims, and what
    would help; None if none (or where no cloud reached the server: FedWaD mode). Under
    aggregation.secure no silo's count reaches the server, so the help says what would embed
    more should the sites hold more than their samples."""
    small = [c for c, n in sorted(samples.items()) if n < TELL_FLOOR]
    if not small:
        return None
    held_back = any(samples[c] < examples.get(c, 0) for c in small)
    unknown = any(examples.get(c) is None for c in small)
    larger = (
        "strategy.sample_fraction: auto (or larger) would embed more of their examples"
        if params.sample_fraction != "auto"
        else "a larger data.val_fraction would (the sample holds as many embeddings as the validation set)"
    )
    if held_back:
        help = larger
    elif unknown:
        help = (
            f"if they hold more examples than their samples (their counts are not sent under aggregation.secure), "
            f"{larger}; else only more examples would"
        )
    else:
        help = "only more examples at these sites would: until then their clusters are guesses"
    listed = ", ".join(f"{c} ({samples[c]} of {examples.get(c, '?')})" for c in small)
    return {
        "silos": small,
        "examples": [examples.get(c) for c in small],
        "sample": [samples[c] for c in small],
        "help": help,
        "finding": (
            f"silos too small to tell groups apart, their samples under {TELL_FLOOR} embeddings (silo: sample of "
            f"training examples): {listed}; {help}"
        ),
    }


def how_clear(extraction: dict, clear_gap: float | None) -> str | None:
    """What the robust rule's clusters say in words, from its report (noise units): one cluster,
    for want of distances beyond the noise or of a clear gap; a split kept for its clear gap
    where the noise cut gave more clusters; or a split whose margin is under 1 (a pair across
    clusters no farther apart than a pair inside one). None for a clear split."""
    if extraction.get("rule") != "robust" or extraction.get("noise_scale") is None:
        return None
    within, cut, finer = extraction["max_within"], extraction["threshold"], extraction.get("noise_clusters")
    if extraction["n_clusters"] == 1:
        if within is None:
            return None
        if finer is not None:
            return (
                f"no groups found above the noise: the silos differ beyond it (the cut at {cut:g} noise units parts "
                f"them into {finer}), but by small steps, with no clear gap (no split joins {clear_gap:g} times "
                f"farther apart than its clusters' own members): one cluster; {refused(extraction)}"
            )
        if within < cut:
            return (
                f"no groups found above the noise: the farthest pair of silos is {within:.2f} noise units apart, "
                f"under the cut at {cut:g}"
            )
        return (  # average linkage: a pair beyond the cut, but no two groups beyond it on average
            f"no groups found above the noise: the farthest pair of silos is {within:.2f} noise units apart, but "
            f"no two groups of silos are farther than the cut at {cut:g} on average"
        )
    margin = extraction["margin"]
    if margin is not None and margin < 1:
        inside = "the farthest pair inside one" if within is not None and within >= 1 else "the noise itself"
        return (
            f"a weak split into {extraction['n_clusters']} clusters at a margin of {margin:.2f}: the closest pair "
            f"across clusters ({extraction['min_between']:.2f} noise units) is no farther apart than {inside}, so "
            f"some silos sit between groups or the groups are noise; more embeddings a silo (a larger "
            f"strategy.sample_fraction, or data.val_fraction on small silos) make it clearer"
        )
    if finer is not None:
        return (
            f"{extraction['n_clusters']} clusters at a clear gap of {extraction['gap']:.1f}: the cut at {cut:g} noise "
            f"units parts the silos into {finer}, but those inside each differ by small steps, not groups; "
            f"{refused(extraction)}"
        )
    return None


def refused(extraction: dict) -> str:
    """The clearest split the clear gap refused, and the setting that would keep it: where the
    groups a user expects differ little beside a spread inside each, the gap can be under 3."""
    gap = math.floor(10 * extraction["refused_gap"]) / 10  # rounded down: a clear_gap of it keeps the split
    return (
        f"the clearest split refused, into {extraction['refused_clusters']} at a gap of "
        f"{gap:.1f}, is kept with strategy.clear_gap at or under that (null: the noise cut's "
        f"{extraction['noise_clusters']})"
    )
