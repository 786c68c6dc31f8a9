"""How a cluster's updates become its model: weighted FedAvg (the paper's rule) and the
robust rules a researcher would compare it with, plus the screening of a cluster's updates
against hostile or broken silos.

| rule | what | reference |
|---|---|---|
| `fedavg` | θ = Σ_c (N_c / N) θ_c | McMahan et al. 2017; EMD-CFL Alg. 1, line 21 |
| `median` | coordinate-wise median of the θ_c | Yin et al. 2018, Def. 1 |
| `trimmed_mean` | coordinate-wise mean after cutting ⌊β·m⌋ values at each end | Yin et al. 2018, Def. 2 |
| `norm_clip` | FedAvg of s_c + Δ_c · min(1, M / ‖Δ_c‖) | Sun et al. 2019, §4 "norm thresholding" |

Yin, Chen, Ramchandran, Bartlett: Byzantine-robust distributed learning: towards optimal
statistical rates, ICML 2018. Sun, Kairouz, Suresh, McMahan: Can you really backdoor
federated learning?, arXiv:1911.07963 (2019).

Δ_c = θ_c − s_c is silo c's update against the model s_c it started from (the server knows
s_c: it sent it). `screen_updates` checks each member of a cluster against its own start and
against the other members before any rule runs; see its docstring for what it can and cannot
tell. Strategies aggregate through these functions (`Strategy.aggregate`, via `aggregate`);
the runtime never averages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .weighted_sum import WeightedSum

__all__ = [
    "fedavg",
    "coordinate_median",
    "trimmed_mean",
    "norm_clipped_mean",
    "clip_update",
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
    """How each cluster's updates become its model (aggregation.py, every strategy)."""

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
    # An update whose norm exceeds norm_ratio times the cluster's median is rejected, or
    # scaled down to that bound ("clip"). A sample count is lowered to the silo's first
    # report and to count_ratio times the cluster's median.
    outliers: Literal["reject", "clip"] = "reject"
    norm_ratio: float = 4.0
    count_ratio: float = 2.0

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
        if self.count_ratio < 1:
            yield f"aggregation.count_ratio: must be at least 1, got {self.count_ratio}"


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
    *,
    norm_ratio: float,
    count_ratio: float,
    outliers: Literal["reject", "clip"],
) -> Screened:
    """Check every member's update against its own start and against the cluster.

    - Sample count: at most what the silo reported in its first round (a silo's training
      set does not grow during a run), and, with at least 3 members, at most `count_ratio`
      times the cluster's median count. A count above a bound is lowered to it ("clipped"):
      a weight is then bounded, and an honest silo with more data than its peers keeps its
      update.
    - Update norm ‖θ_c − s_c‖: with at least 3 members, at most `norm_ratio` times the
      cluster's median norm; an update above it is rejected (`outliers: reject`) or scaled
      down to the bound (`clip`).

    What this can tell: with an honest majority of at least 3 members, an update far larger
    than its honest peers' (a scaled or sign-flipped model, huge weights) and a claimed
    count far above theirs. What it cannot: who lies in a cluster of 1 or 2 (nothing to
    compare with; only the first-report bound applies), a hostile majority, nor an update
    within the bounds (a sign flip of the median's size); the robust rules bound those.
    """
    m = len(silos)
    compare = m >= MIN_MEMBERS_TO_COMPARE
    count_cap = count_ratio * float(np.median(counts)) if compare else np.inf
    norms = [update_norm(model, start) for model, start in zip(models, starts)]
    norm_cap = norm_ratio * float(np.median(norms)) if compare else np.inf
    out = Screened([], [], [], [], [])
    for silo, model, start, n, norm in zip(silos, models, starts, counts, norms):
        reasons = []
        if norm > norm_cap:
            reasons.append(
                f"update norm {norm:.4g} above {norm_ratio:g} x the cluster median {norm_cap / norm_ratio:.4g}"
            )
            if outliers == "reject":
                out.decisions.append(Decision(silo, round, "rejected", reasons[0]))
                continue
            model = clip_update(model, start, norm_cap)
        bounded = n
        if silo in first_counts and bounded > first_counts[silo]:
            reasons.append(f"sample count {n} above its first report {first_counts[silo]}")
            bounded = first_counts[silo]
        if bounded > count_cap:
            reasons.append(f"sample count {n} above {count_ratio:g} x the cluster median {count_cap / count_ratio:g}")
            bounded = max(1, int(count_cap))
        if silo not in first_counts:
            out.first_counts[silo] = n  # what it said, not what it was allowed: its own bound
        out.silos.append(silo)
        out.models.append(model)
        out.starts.append(start)
        out.weights.append(bounded)
        out.decisions.append(Decision(silo, round, "clipped" if reasons else "accepted", "; ".join(reasons)))
    return out


def aggregate(
    cfg: AggregationConfig,
    round: int,
    silos: list[int],
    models: list[Model],
    starts: list[Model],
    counts: list[int],
    first_counts: dict[int, int],
) -> tuple[Model, Screened]:
    """One cluster's new model under `cfg` (config `aggregation:`): screening (if on), then
    the rule. With `rule: fedavg` and nothing clipped or rejected the result is exactly
    `fedavg(models, counts)`, bit for bit: the same arrays, in the same order, same weights."""
    if cfg.screen:
        screened = screen_updates(
            round,
            silos,
            models,
            starts,
            counts,
            first_counts,
            norm_ratio=cfg.norm_ratio,
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
    if cfg.rule == "fedavg":
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
) -> tuple[dict[int, Model], list[Decision]]:
    """What every silo continues from: each cluster's updates aggregated by `aggregate`
    (by default, screened weighted FedAvg: EMD-CFL Alg. 1, line 21), and the decisions taken.

    Every member of a cluster with updates, trained this round or not, gets the cluster's
    model; a cluster without updates keeps its members' `starts`. Members go in silo order,
    so the result does not depend on the order updates arrived in. `first_counts` (the
    count each silo reported first: the screening's bound) gains the newcomers' counts.
    """
    models, decisions = {}, []
    for k in np.unique([clusters[c] for c in updates]):
        members = sorted(c for c in updates if clusters[c] == k)
        models[int(k)], screened = aggregate(
            cfg,
            round,
            members,
            [updates[c] for c in members],
            [starts[c] for c in members],
            [counts[c] for c in members],
            first_counts,
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
