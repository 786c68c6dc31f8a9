"""How a cluster's updates become its model: weighted FedAvg (the paper's rule) and the
robust rules a researcher would compare it with, plus the screening of a cluster's updates
against hostile or broken silos.

| rule | what | reference |
|---|---|---|
| `fedavg` | θ = Σ_c (N_c / N) θ_c | McMahan et al. 2017; EMD-CFL Alg. 1, line 21 |
| `median` | coordinate-wise median of the θ_c | Yin et al. 2018, Def. 1 |
| `trimmed_mean` | coordinate-wise mean after cutting ⌊β·m⌋ values at each end | Yin et al. 2018, Def. 2 |
| `norm_clip` | FedAvg of s_c + Δ_c · min(1, M / ‖Δ_c‖) | Sun et al. 2019, §4 "norm thresholding" |
| `privacy.dp: central` | s̄ + (Σ_c clip(Δ_c, C) + N(0, (zC)²I)) / W, W: the cluster's size | McMahan et al. 2018 |
| `privacy.dp: distributed` | the same, each silo adding N(0, (zC)²/W · I) (secure sums) | Kairouz et al. 2021 |

Yin, Chen, Ramchandran, Bartlett: Byzantine-robust distributed learning: towards optimal
statistical rates, ICML 2018. Sun, Kairouz, Suresh, McMahan: Can you really backdoor
federated learning?, arXiv:1911.07963 (2019). McMahan, Ramage, Talwar, Zhang: Learning
differentially private recurrent language models, ICLR 2018. Kairouz, Liu, Steinke: The
distributed discrete Gaussian mechanism for federated learning with secure aggregation, ICML
2021.

Δ_c = θ_c − s_c is silo c's update against the model s_c it started from (the server knows
s_c: it sent it). `screen_updates` checks each member of a cluster against its own start and
against the other members before any rule runs, at the local work its sample count claims
(`LocalWork`); see its docstring for what it can and cannot tell. Strategies aggregate
through these functions (`Strategy.aggregate`, via `aggregate`); the runtime never averages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from ..privacy.dp import PrivacyConfig
from .weighted_sum import WeightedSum

__all__ = [
    "fedavg",
    "LocalWork",
    "coordinate_median",
    "trimmed_mean",
    "norm_clipped_mean",
    "clip_update",
    "dp_fedavg",
    "update_norm",
    "Decision",
    "Screened",
    "screen_updates",
    "aggregate",
    "cluster_averages",
    "ClusterSums",
]

Model = dict[str, np.ndarray]
# Norm and count bounds need a majority to compare with: with fewer members the one who lies
# cannot be told from the one who does not.
MIN_MEMBERS_TO_COMPARE = 3


@dataclass(frozen=True)
class AggregationConfig:
    """How each cluster's updates become its model (aggregation/rules.py, every strategy)."""

    # fedavg: weighted by sample counts (the paper's, EMD-CFL Alg. 1 line 21); median and
    # trimmed_mean: coordinate-wise and unweighted (Yin et al. 2018); norm_clip: every update
    # clipped to norm clip_norm, then FedAvg (Sun et al. 2019).
    rule: Literal["fedavg", "median", "trimmed_mean", "norm_clip"] = "fedavg"
    # trimmed_mean: the fraction β of values cut at each end of every coordinate (⌊β·members⌋).
    trim: float = 0.1
    # norm_clip: the bound M on an update's norm; null: the cluster's median update norm.
    clip_norm: float | None = None
    # Check every update against the silo's start model and the other members of its cluster
    # before the rule (aggregation.screen_updates; decisions go to metrics.jsonl). The server
    # then holds a cluster's updates until its last has come; unscreened FedAvg (or norm_clip
    # at a fixed clip_norm) sums each as it arrives and holds none.
    screen: bool = True
    # An update whose norm exceeds norm_ratio times the cluster's median at its own local work
    # (the median norm per unit of the distance its local steps move a model, times its own) is
    # rejected, or scaled down to that bound ("clip").
    outliers: Literal["reject", "clip"] = "reject"
    norm_ratio: float = 4.0
    # A sample count whose local steps would move the model more than claim_ratio times further
    # than the update did, at the cluster's median pace (the kinder of a constant gradient's and
    # a converging run's), is a false claim: rejected (clip: the count is lowered to what the
    # update supports). Every count is also bounded by the silo's first report.
    claim_ratio: float = 16.0
    # null: sample counts are weighed as claimed (FedAvg), within the bounds above; a number:
    # a count is also lowered to count_ratio times the cluster's median count (a bound on any
    # one member's weight, which clips honest members that hold more data than their peers).
    count_ratio: float | None = None
    # Secure aggregation inside each cluster: every silo masks its update with masks agreed
    # with other members, which cancel in the cluster's sum, so that the server reads that sum
    # and no single update (docs/how-to/secure-aggregation.md). The server then weighs as
    # FedAvg only, unscreened: rule fedavg, or norm_clip at a fixed clip_norm, which each silo
    # applies to its own update before masking.
    secure: bool = False
    # The members each silo masks with (even; SecAgg+'s neighbours); null: every other member
    # of its cluster up to 9 members, 2⌈log₂ n⌉ beyond.
    secure_neighbours: int | None = None

    @property
    def streams(self) -> bool:
        """Whether each update can be decided and summed as it arrives (`ClusterSums`): a
        weighted mean, with no bound taken from the other members (unscreened FedAvg, or norm
        clipping at a fixed `clip_norm`). The screening's medians and the coordinate-wise
        rules need every update of the cluster at once."""
        return not self.screen and (self.rule == "fedavg" or (self.rule == "norm_clip" and self.clip_norm is not None))

    def problems(self) -> Iterator[str]:
        """One config-error line per value the types cannot rule out (`aggregation.<key>: …`)."""
        if not 0 <= self.trim < 0.5:
            yield f"aggregation.trim: must lie in [0, 0.5), got {self.trim}"
        if self.clip_norm is not None and self.clip_norm <= 0:
            yield f"aggregation.clip_norm: must be positive or null, got {self.clip_norm}"
        if self.norm_ratio <= 1:
            yield f"aggregation.norm_ratio: must be above 1 (the cluster median itself), got {self.norm_ratio}"
        if self.claim_ratio <= 1:
            yield f"aggregation.claim_ratio: must be above 1 (the cluster median itself), got {self.claim_ratio}"
        if self.count_ratio is not None and self.count_ratio < 1:
            yield f"aggregation.count_ratio: must be at least 1 or null, got {self.count_ratio}"
        if self.secure and not self.streams:
            yield (
                "aggregation.secure: the server reads the cluster's masked sum, never one update, so it can "
                "neither screen nor take medians (set aggregation.screen: false, and rule fedavg, or norm_clip with "
                "a clip_norm each silo applies itself)"
            )
        if self.secure_neighbours is not None and (self.secure_neighbours < 2 or self.secure_neighbours % 2):
            yield f"aggregation.secure_neighbours: must be even and at least 2, or null, got {self.secure_neighbours}"


@dataclass(frozen=True)
class LocalWork:
    """The local training every silo of the run does (`train:`): what a sample count claims.

    A silo with n examples takes k = E·⌈n / B⌉ steps of SGD with heavy-ball momentum β (full
    batch, B = n: k = E). Under a constant gradient g those steps move its model by
    η‖g‖/(1−β) · [k − β(1 − β^k)/(1 − β)], the sum over steps t = 1..k of the velocity
    (1 − β^t)/(1 − β)·g (Polyak, Some methods of speeding up the convergence of iteration
    methods, USSR Comp. Math. 1964; PyTorch's SGD, dampening 0). The screening divides each
    update's norm by the bracket: a silo with ten times its peers' data moves ten times as far
    and is judged by the same rate, not clipped for it."""

    epochs: int
    batch_size: int | None  # None: full-batch steps (train.batch_size: all)
    momentum: float
    # the most a silo's training set grows after its first report: validation rows lent to the
    # clustering rejoin it once the silo is clustered (data/spec.py, `LentRows`)
    growth: int = 0

    def steps(self, n: int) -> int:
        """k = E·⌈n / B⌉, the local steps of a silo with n training examples."""
        return self.epochs * (1 if self.batch_size is None else math.ceil(max(n, 1) / self.batch_size))

    def displacement(self, n: int) -> float:
        """k − β(1 − β^k)/(1 − β): how far k steps move a model, in units of η‖g‖/(1 − β)."""
        k, beta = self.steps(n), self.momentum
        return k - beta * (1 - beta**k) / (1 - beta) if beta > 0 else float(k)


def fedavg(updates: list[Model], weights: Sequence[float]) -> Model:
    """θ_k = Σ_c N_c θ_c / Σ_c N_c over a cluster's members (EMD-CFL Alg. 1, line 21).

    Summed order-free (`WeightedSum`): the server that folds updates in as they arrive gets
    these bits. Integer buffers (e.g. a batch counter) are not averageable and are taken from
    the member with the most samples, the first of equals. Any positive weights will do (a
    soft clustering's mixture weights): Σ n_c is summed exactly rounded, each n_c θ_c rounded
    once where n_c is not a small integer.
    """
    if not updates or len(updates) != len(weights):
        raise ValueError("fedavg needs one weight per update, and at least one update")
    total = WeightedSum(updates[0])  # ValueError for a weight that is not positive
    for key, (update, n) in enumerate(zip(updates, weights)):
        total.add(update, n, key)
    return total.mean()


def _coordinatewise(models: list[Model], rule: Callable[[np.ndarray], np.ndarray]) -> Model:
    """Apply `rule` along the member axis of every floating tensor (in float64, cast back).
    Integer buffers take the lower median: a value one member actually holds."""
    if not models:
        raise ValueError("a coordinate-wise rule needs at least one model")
    out = {}
    for name, ref in models[0].items():
        stack = np.stack([m[name] for m in models])
        if np.issubdtype(ref.dtype, np.floating):
            out[name] = rule(stack.astype(np.float64)).astype(ref.dtype)
        else:
            out[name] = np.quantile(stack, 0.5, axis=0, method="lower").astype(ref.dtype)
    return out


def coordinate_median(models: list[Model]) -> Model:
    """Coordinate-wise median of the members' models (Yin et al. 2018, Def. 1).

    Unweighted, as in the paper: the sample counts are exactly what a hostile silo would lie
    about. Any minority of members, whatever they send, moves no coordinate outside the
    range of the honest members' values."""
    return _coordinatewise(models, lambda stack: np.median(stack, axis=0))


def trimmed_mean(models: list[Model], trim: float) -> Model:
    """Coordinate-wise β-trimmed mean (Yin et al. 2018, Def. 2), β = `trim`: per coordinate,
    the ⌊β·m⌋ largest and ⌊β·m⌋ smallest of the m values are cut and the rest averaged
    (scipy.stats.trim_mean). Unweighted; β = 0 is the plain mean. With fewer than 1/β
    members nothing is cut."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trimmed_mean: trim must lie in [0, 0.5), got {trim}")
    from scipy import stats  # scipy.stats is slow to import: only where a trimmed mean is taken

    return _coordinatewise(models, lambda stack: stats.trim_mean(stack, trim, axis=0))


def update_norm(model: Model, start: Model) -> float:
    """‖θ − s‖₂ over the floating tensors, in float64 (finite for any finite float32 input)."""
    return float(
        np.sqrt(
            sum(
                np.sum((model[k].astype(np.float64) - start[k].astype(np.float64)) ** 2)
                for k in model
                if np.issubdtype(model[k].dtype, np.floating)
            )
        )
    )


class DpNoise(NamedTuple):
    """What `dp_fedavg` needs of one cluster's round: the section, W (the cluster's members
    drawn to train in the round) and the generator of its noise."""

    privacy: PrivacyConfig
    size: int
    rng: np.random.Generator


def dp_fedavg(models: list[Model], starts: list[Model], all_starts: list[Model], noise: DpNoise) -> Model:
    """DP-FedAvg's cluster model with the fixed denominator (McMahan et al. 2018, Alg. 1):
    s̄ + (Σ_c clip(θ_c − s_c, C) + N(0, (z·C)² I)) / W over the `models` kept and their
    `starts`, W the cluster's members drawn to train in the round, whether or not each update
    came (public, since the draw is a function of the run seed: one silo more or less moves the
    sum by at most C), s̄ the mean of every member's start (public: the server sent it).
    Integer arrays are taken from the first member's start."""
    clip, z = noise.privacy.clip, noise.privacy.noise_multiplier
    clipped = [clip_update(model, start, clip) for model, start in zip(models, starts)]
    out: Model = {}
    for key, first in all_starts[0].items():
        if not np.issubdtype(first.dtype, np.floating):
            out[key] = first
            continue
        mean_start = np.mean([s[key].astype(np.float64) for s in all_starts], axis=0)
        total = np.zeros(first.shape, dtype=np.float64)
        for m, s in zip(clipped, starts):
            total += m[key].astype(np.float64) - s[key]
        size = noise.size
        noise_values = noise.rng.normal(0.0, z * clip, size=first.shape)
        out[key] = (mean_start + (total + noise_values) / size).astype(first.dtype)
    return out


def clip_update(model: Model, start: Model, max_norm: float) -> Model:
    """s + Δ · min(1, max_norm / ‖Δ‖), Δ = θ − s: the update scaled down to norm `max_norm`
    (Sun et al. 2019); returns `model` itself when it is within the bound."""
    norm = update_norm(model, start)
    if norm <= max_norm:
        return model
    scale = max_norm / norm
    return {
        k: (start[k] + scale * (v.astype(np.float64) - start[k])).astype(v.dtype)
        if np.issubdtype(v.dtype, np.floating)
        else v
        for k, v in model.items()
    }


def norm_clipped_mean(
    models: list[Model], starts: list[Model], weights: list[int], max_norm: float | None = None
) -> Model:
    """Norm thresholding (Sun et al. 2019, §4): every update clipped to norm M, then FedAvg.

    M = `max_norm`, or the median of the members' update norms when None (the paper fixes M
    by hand per task; the median adapts it to the model and the round, and with an honest
    majority it is an honest member's norm). No member moves the model by more than its
    weight times M."""
    if max_norm is None:
        max_norm = float(np.median([update_norm(m, s) for m, s in zip(models, starts)]))
    return fedavg([clip_update(m, s, max_norm) for m, s in zip(models, starts)], weights)


# --------------------------------------------------------------------------- screening


@dataclass(frozen=True)
class Decision:
    """What the screening did with one member's update; `record()` is its metrics.jsonl entry."""

    silo: int
    round: int
    action: Literal["accepted", "clipped", "rejected"]
    reason: str = ""  # why it was clipped or rejected; empty when accepted

    def record(self) -> dict:
        return {"silo": self.silo, "round": self.round, "action": self.action, "reason": self.reason}


@dataclass
class Screened:
    """The members that go on to the rule (input order kept), their models (clipped where
    decided) and bounded sample counts, one Decision per member, and the first sample count
    of every silo seen for the first time (the caller keeps it: the next rounds' bound)."""

    silos: list[int]
    models: list[Model]
    starts: list[Model]
    weights: list[int]
    decisions: list[Decision]
    first_counts: dict[int, int] = field(default_factory=dict)


def screen_updates(
    round: int,
    silos: list[int],
    models: list[Model],
    starts: list[Model],
    counts: list[int],
    first_counts: dict[int, int],
    work: LocalWork,
    *,
    norm_ratio: float,
    claim_ratio: float,
    count_ratio: float | None,
    outliers: Literal["reject", "clip"],
) -> Screened:
    """Check every member's update against its own start and against the cluster.

    - Sample count: at most what the silo reported in its first round, plus `work.growth` (a
      silo's training set grows only by the validation rows it lent its clustering); with
      `count_ratio` set and at least 3 members, at most `count_ratio` times the cluster's
      median count. A count above a bound is lowered to it.
    - Update norm, at the local work its count claims: with at least 3 members, each norm
      ‖Δ_c‖ = ‖θ_c − s_c‖ is divided by the displacement d(n_c) of its local steps
      (`LocalWork`); r̃ is the cluster's median of these rates and ‖Δ‖~ its median norm. An
      update above `norm_ratio` · max(r̃·d(n_c), ‖Δ‖~) is too large for the work claimed:
      rejected (`outliers: reject`) or scaled down to the bound (`clip`). (A few noisy steps
      from a model its peers have moved on converge less than many: the median norm is the
      floor a small silo is held to.) A claim is judged at the kinder of two paces: the
      constant gradient's, r̃·d(n_c), and a run's that slows as it converges, s̃·√d(n_c) (s̃
      the median of ‖Δ_c‖/√d(n_c)): an update below min(r̃·d(n_c), s̃·√d(n_c)) / `claim_ratio`
      did far less than its count claims, the count is false, and the update is rejected
      (`clip`: the count is lowered to the largest its update supports). With members of
      equal counts the norm bound reduces to the median norm, the screening before counts
      were weighed.

    Honest members of unequal size keep their counts (FedAvg's weights) and their updates: a
    silo with more data takes more steps and moves further, at about its peers' rate.
    What this can tell: with an honest majority of at least 3 members, an update far larger
    than its claimed work gives (a scaled or sign-flipped model, huge weights), a claim far
    above the work its update shows, and a count above its own first report. What it cannot:
    who lies in a cluster of 1 or 2 (only the first-report bound applies), a hostile majority,
    a silo that claims from its first report to be k times larger and sends an update k times
    longer (that is what an honest large silo looks like; `count_ratio` bounds its weight, at
    the price of clipping honest large silos), nor an update within the bounds (a sign flip of
    the median's size); the robust rules bound those.
    """
    m = len(silos)
    compare = m >= MIN_MEMBERS_TO_COMPARE
    count_cap = count_ratio * float(np.median(counts)) if compare and count_ratio is not None else np.inf
    bounded, count_reasons = [], []
    for silo, n in zip(silos, counts):
        reasons, b = [], n
        if silo in first_counts and b > (most := first_counts[silo] + work.growth):
            grown = f" and the {work.growth} validation rows it lent" if work.growth else ""
            reasons.append(f"sample count {n} above its first report {first_counts[silo]}{grown}")
            b = most
        if b > count_cap:
            assert count_ratio is not None
            reasons.append(f"sample count {n} above {count_ratio:g} x the cluster median {count_cap / count_ratio:g}")
            b = max(1, int(count_cap))
        bounded.append(b)
        count_reasons.append(reasons)
    norms = [update_norm(model, start) for model, start in zip(models, starts)]
    reach = [work.displacement(n) for n in bounded]
    rate = float(np.median([norm / d for norm, d in zip(norms, reach)])) if compare else np.inf
    # a run that slows as it converges moves less than its steps would at a constant gradient,
    # as little as the square root of their reach: a claim is judged at the kinder of the two
    slowing = float(np.median([norm / math.sqrt(d) for norm, d in zip(norms, reach)])) if compare else np.inf

    def claimed_reach(d: float) -> float:
        return min(rate * d, slowing * math.sqrt(d))

    median_norm = float(np.median(norms)) if compare else np.inf
    unequal = len(set(reach)) > 1
    out = Screened([], [], [], [], [])
    for silo, model, start, n, b, norm, d, reasons in zip(
        silos, models, starts, counts, bounded, norms, reach, count_reasons
    ):
        # few steps are noisy and converge less than many: a small silo is held to the cluster's
        # median norm, a large one to the median rate at its own steps
        expected = max(rate * d, median_norm)
        if compare and norm > norm_ratio * expected:
            reasons.append(
                f"update norm {norm:.4g} above {norm_ratio:g} x the cluster median {expected:.4g}"
                + (f" at its {work.steps(b)} local steps" if unequal and rate * d > median_norm else "")
            )
            if outliers == "reject":
                out.decisions.append(Decision(silo, round, "rejected", reasons[-1]))
                continue
            model = clip_update(model, start, norm_ratio * expected)
        elif compare and norm * claim_ratio < claimed_reach(d):
            reasons.append(
                f"sample count {b} claims {work.steps(b)} local steps, which would move the model "
                f"{claimed_reach(d) / norm if norm > 0 else np.inf:.3g} x further than its update did at the "
                f"cluster median (above {claim_ratio:g} x)"
            )
            if outliers == "reject":
                out.decisions.append(Decision(silo, round, "rejected", reasons[-1]))
                continue
            b = _supported_count(work, b, claimed_reach, claim_ratio * norm)
        if silo not in first_counts:
            out.first_counts[silo] = n  # what it said, not what it was allowed: its own bound
        out.silos.append(silo)
        out.models.append(model)
        out.starts.append(start)
        out.weights.append(b)
        out.decisions.append(Decision(silo, round, "clipped" if reasons else "accepted", "; ".join(reasons)))
    return out


def _supported_count(work: LocalWork, claimed: int, reach: Callable[[float], float], bound: float) -> int:
    """The largest count up to `claimed` whose displacement d gives reach(d) ≤ `bound` (1 at
    least): bisection, both growing with the count."""
    low, high = 1, claimed
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if reach(work.displacement(mid)) <= bound else (low, mid - 1)
    return low


def aggregate(
    cfg: AggregationConfig,
    round: int,
    silos: list[int],
    models: list[Model],
    starts: list[Model],
    counts: list[int],
    first_counts: dict[int, int],
    work: LocalWork,
    noise: DpNoise | None = None,
) -> tuple[Model, Screened]:
    """One cluster's new model under `cfg` (config `aggregation:`): screening (if on, at the
    local `work` the counts claim), then the rule. With `rule: fedavg` and nothing clipped or
    rejected the result is exactly `fedavg(models, counts)`, bit for bit: the same arrays, in
    the same order, same weights."""
    if cfg.screen:
        screened = screen_updates(
            round,
            silos,
            models,
            starts,
            counts,
            first_counts,
            work,
            norm_ratio=cfg.norm_ratio,
            claim_ratio=cfg.claim_ratio,
            count_ratio=cfg.count_ratio,
            outliers=cfg.outliers,
        )
    else:
        screened = Screened(
            list(silos),
            list(models),
            list(starts),
            list(counts),
            [Decision(s, round, "accepted") for s in silos],
            {s: n for s, n in zip(silos, counts) if s not in first_counts},
        )
    if noise is not None:  # privacy.dp: the config allows fedavg only, counts unweighed
        model = dp_fedavg(screened.models, screened.starts, list(starts), noise)
    elif cfg.rule == "fedavg":
        model = fedavg(screened.models, screened.weights)
    elif cfg.rule == "median":
        model = coordinate_median(screened.models)
    elif cfg.rule == "trimmed_mean":
        model = trimmed_mean(screened.models, cfg.trim)
    else:
        model = norm_clipped_mean(screened.models, screened.starts, screened.weights, cfg.clip_norm)
    return model, screened


def cluster_averages(
    cfg: AggregationConfig,
    round: int,
    clusters: np.ndarray,
    updates: dict[int, Model],
    counts: dict[int, int],
    starts: dict[int, Model],
    first_counts: dict[int, int],
    work: LocalWork,
    dp_noise: Callable[[int], DpNoise] | None = None,
) -> tuple[dict[int, Model], list[Decision]]:
    """What every silo continues from: each cluster's updates aggregated by `aggregate`
    (by default, screened weighted FedAvg: EMD-CFL Alg. 1, line 21), and the decisions taken.

    Every member of a cluster with updates, trained this round or not, gets the cluster's
    model; a cluster without updates keeps its members' `starts`. Members go in silo order,
    so the result does not depend on the order updates arrived in. `first_counts` (the
    count each silo reported first: the screening's bound) gains the newcomers' counts. With
    `dp_noise` (`privacy.dp` on), cluster k's model is `dp_fedavg`'s with `dp_noise(k)`.
    """
    models, decisions = {}, []
    for k in np.unique([clusters[c] for c in updates]):
        members = sorted(c for c in updates if clusters[c] == k)
        noise = None if dp_noise is None else dp_noise(int(k))
        models[int(k)], screened = aggregate(
            cfg,
            round,
            members,
            [updates[c] for c in members],
            [starts[c] for c in members],
            [counts[c] for c in members],
            first_counts,
            work,
            noise,
        )
        first_counts.update(screened.first_counts)
        decisions += screened.decisions
    return {c: models.get(int(clusters[c]), starts[c]) for c in range(len(clusters))}, decisions


class ClusterSums:
    """`cluster_averages` for a server that sums each update into its cluster's mean as it
    arrives, in any order, and keeps none (a round's updates need not fit in its memory):
    only where `cfg.streams`. A silo's cluster is read from `clusters` (the strategy's array)
    as its update comes, so it must be known by then. Same bits as `cluster_averages` over the
    same updates (`WeightedSum` is order-free)."""

    def __init__(self, cfg: AggregationConfig, round: int, clusters: np.ndarray, starts: dict[int, Model]) -> None:
        if not cfg.streams:
            raise ValueError(f"aggregation {cfg} needs every update of a cluster at once")
        self.cfg, self.round, self.clusters, self.starts = cfg, round, clusters, starts
        self.sums: dict[int, WeightedSum] = {}
        self.counts: dict[int, int] = {}
        self.summed_into: dict[int, int] = {}  # silo → the cluster its update went to

    def add(self, silo: int, model: Model, n: int) -> None:
        """Silo `silo`'s update, trained on `n` examples (ValueError, nothing added, if it
        cannot be summed: see `WeightedSum.add`)."""
        if self.cfg.rule == "norm_clip":
            assert self.cfg.clip_norm is not None
            model = clip_update(model, self.starts[silo], self.cfg.clip_norm)
        k = int(self.clusters[silo])
        self.sums.setdefault(k, WeightedSum(model)).add(model, n, silo)
        self.counts[silo], self.summed_into[silo] = n, k

    def averages(self, clusters: np.ndarray, first_counts: dict[int, int]) -> tuple[dict[int, Model], list[Decision]]:
        """What every silo continues from under the round's final `clusters`, and the decisions
        (all accepted), as `cluster_averages` gives them; `first_counts` gains the newcomers'
        counts. ValueError if a silo's cluster moved after its update was summed."""
        if moved := [c for c, k in self.summed_into.items() if clusters[c] != k]:
            raise ValueError(f"silos {moved[:5]} moved to another cluster after their updates were summed")
        models = {k: total.mean() for k, total in self.sums.items()}
        order = sorted(self.counts, key=lambda c: (self.summed_into[c], c))
        first_counts.update({c: self.counts[c] for c in order if c not in first_counts})
        decisions = [Decision(c, self.round, "accepted") for c in order]
        return {c: models.get(int(clusters[c]), self.starts[c]) for c in range(len(clusters))}, decisions
