"""Cluster extraction: from a matrix of pairwise distribution distances to hard clusters.

EMD-CFL (the EMD-CFL paper, Algorithm 1) measures, for every pair of silos, the two directed
distances ``W[c][c'] = W1(Z_{c|c} R, Z_{c'|c} R) - tau_c`` (line 16) and then decides which
silos share a distribution. Two rules are offered:

``neighbourhoods``
    The paper's rule, reproduced exactly (lines 3, 17 and 20): ``M = I``,
    ``M[c][c'] = M[c'][c] = 1{W[c][c'] < eps and W[c'][c] < eps}``, and silos with identical
    neighbourhoods ``{c' : M[c][c'] = 1}`` form one cluster. With a fixed ``eps`` it is not
    robust: a distance that fits one data size and training length splits or merges the
    clusters of another (docs/methods/emdcfl.md, "The robust rule").

``robust`` (default)
    Hierarchical clustering (average linkage) of the symmetrised matrix
    ``D = max(W, W^T)``, cut where the noise ends: a multiple of a noise scale, measured
    per silo or estimated from ``W`` itself, instead of a fixed distance. ``max`` keeps
    each silo's say (line 17 asks ``W < eps`` in *both* directions); the linkage makes the
    grouping transitive. See :func:`robust_clusters`.

Late silos are placed, not re-clustered (:func:`place_newcomer`): a newcomer joins the
existing cluster it is closest to if that is within the rule's cut, so nobody already
clustered moves.

Conventions: ``W`` is ``C x C``; the diagonal is ignored; ``NaN`` marks an unmeasured pair,
which is never adjacent under the paper's rule and is left out of the robust rule's group
distances (a silo with no measured pair stays alone under both). Labels are ``int64``,
numbered ``0, 1, 2, ...`` in order of first appearance.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .defaults import EPSILON, NOISE_MULTIPLE
from .labels import relabel_by_first_appearance

__all__ = [
    "LINKAGES",
    "noise_or_one",
    "RULES",
    "ExtractionReport",
    "extract_clusters",
    "nearest_cluster",
    "neighbourhood_clusters",
    "partition_report",
    "place_newcomer",
    "symmetrised",
    "robust_clusters",
]

RULES = ("robust", "neighbourhoods")
LINKAGES = ("average", "complete")


@dataclass(frozen=True)
class ExtractionReport:
    """How a clustering was obtained and how clear-cut it was (JSON-ready via ``asdict``)."""

    rule: str
    n_clusters: int
    margin: float | None
    """Smallest between-cluster over largest within-cluster symmetrised distance, both in
    noise units, the within one floored at 1 (below the noise is just noise). ``> 1``:
    every cluster is tighter than its distance to any other; ``3``: the closest pair
    across clusters is three times as far apart as the loosest pair inside one. ``None``
    for one cluster, without a noise scale, or with no measured pair across clusters."""
    noise_scale: float | None
    """In units of ``W``: the RMS of the within-cluster entries (``estimated``) or the
    median of the given per-silo noise (``measured``); ``None`` otherwise."""
    noise_source: str
    """``estimated``, ``measured`` or ``none``."""
    threshold: float
    """The cut: ``eps`` in units of ``W`` (``neighbourhoods``), noise units (``robust``)."""
    max_within: float | None
    """Largest ``max(W[c][c'], W[c'][c])`` inside a cluster (noise units for ``robust``,
    units of ``W`` for ``neighbourhoods``)."""
    min_between: float | None
    """Smallest measured ``max(W[c][c'], W[c'][c])`` across clusters (same units)."""
    unmeasured_pairs: int
    noise_clusters: int | None = None
    """The clusters the noise cut gave where ``clear_gap`` joined some of them for want of a
    clear gap (``robust`` with measured noise only); ``None`` where it kept them."""
    gap: float | None = None
    """How much farther apart the clusters join than their members did (noise units, the
    members' join floored at 1); ``None`` for one cluster or without a noise scale."""
    refused_clusters: int | None = None
    """Where ``clear_gap`` joined some of the noise cut's clusters: the clusters of the clearest
    split it refused (the largest gap among the finer cuts); ``None`` where it kept them."""
    refused_gap: float | None = None
    """That split's gap: ``clear_gap`` at or under it would have kept it."""


def neighbourhood_clusters(W: np.ndarray, epsilon: float) -> np.ndarray:
    """The paper's rule (Algorithm 1, lines 3, 17, 20): identical neighbourhoods, one cluster.

    Adjacency needs ``W < epsilon`` in both directions, so either silo can refuse; an
    unmeasured (``NaN``) pair compares false and is never adjacent.
    """
    W = _validated(W)
    with np.errstate(invalid="ignore"):
        below = W < epsilon
    adjacency = below & below.T
    np.fill_diagonal(adjacency, True)
    _, labels = np.unique(adjacency, axis=0, return_inverse=True)
    return relabel_by_first_appearance(labels.ravel())


def robust_clusters(
    W: np.ndarray,
    noise: np.ndarray | None = None,
    *,
    noise_multiple: float = NOISE_MULTIPLE,
    linkage_method: str = "average",
    clear_gap: float | None = None,
) -> tuple[np.ndarray, ExtractionReport]:
    """Hierarchical clustering of ``max(W, W^T)`` in noise units, cut where the noise ends.

    For two silos with the same distribution ``W[c][c']`` is centred on 0 (``tau_c`` is
    subtracted, Algorithm 1 line 16) and what remains is sampling noise; the paper's
    ``eps`` is meant to "account for the variance in the EMD between two samples" (§3,
    "Clustering (Lines 16-17)").
    The cut is therefore ``noise_multiple`` noise units instead of a fixed distance.

    ``max(W[c][c'], W[c'][c])``: a pair is as far as its more reluctant silo says, so a
    silo whose row says "far" from everyone stays alone. Average linkage (default) merges
    two groups when their *mean* pair distance is within the cut: transitive, and a single
    noisy pair cannot split a large cluster as it does the paper's clique rule.
    ``linkage_method="complete"`` keeps the clique property instead (every pair of a
    cluster within the cut: each silo can veto any single neighbour).

    Measured noise (``noise`` given): ``noise[c]`` is the spread of ``W[c][.]`` under
    "same distribution" for silo c, e.g. the RMS over a few random halvings ``V1, V2`` of
    its validation embeddings of ``W1(Z_{c|c}R, V1 R) - W1(Z_{c|c}R, V2 R)`` (a draw of W
    between two samples of one distribution, at half the size: conservative). Not the W1
    between the halves itself: that is the size of ``tau_c``, far larger than the spread of
    W, and would merge rotations. Row c is divided by ``noise[c]`` (each silo judges with its
    own yardstick) and the cut is ``noise_multiple``.

    Estimated noise (``noise=None``): the scale is ``s(P)``, the RMS about 0 of the directed
    within-cluster entries ``W[c][c']`` of a partition ``P``. Each cut of the dendrogram is
    a candidate ``P``; it is *self-consistent* when cutting at ``noise_multiple * s(P)``
    gives ``P`` back (its merges lie below, the next merge above). The finest
    self-consistent cut wins: a real split stays, while splitting one noisy cluster puts
    the between-part distances at the within-noise level, under the cut. This needs
    within-cluster pairs to calibrate on (two silos alone are always "one cluster"); if no
    cut is self-consistent every silo stays alone (``noise_source = "none"``).

    A clear gap (``clear_gap`` given, measured noise): the noise cut keeps every split of
    distributions that differ beyond the noise, which on sites skewed by label or size is a
    continuum, not groups: the dendrogram's merges climb by small steps. A partition is then
    kept only where its clusters join at least ``clear_gap`` times higher than the last merge
    that formed them (floored at 1 noise unit: members within the noise are one distribution);
    otherwise the next coarser cut is tried, down to one cluster.
    Beyond the paper (docs/methods/emdcfl.md, "A clear gap").

    The default, NOISE_MULTIPLE: well inside the range of multiples that recover the clusters of real
    matrices, and a balance between the two ways a multiple fails: a lower one splits a
    single cluster on a noisy row, a higher one merges clusters only a few noise units apart.
    """
    W = _validated(W)
    size = W.shape[0]
    if noise is None:
        scale = np.ones(size)
    else:
        scale = np.asarray(noise, dtype=float)
        if scale.shape != (size,) or not np.all(np.isfinite(scale)) or np.any(scale < 0):
            raise ValueError(f"noise must hold {size} finite values >= 0, got {noise!r}")
        scale = np.maximum(scale, _NOISE_FLOOR)
    directed = W / scale[:, None]
    D = _symmetrised(directed)
    cuts = _dendrogram_cuts(D, linkage_method)

    if noise is not None:
        at = max(k for k, (height, _, _) in enumerate(cuts) if height < noise_multiple)
        chosen = at
        while clear_gap is not None and not _clear(cuts[chosen], clear_gap):
            chosen += 1
        labels = cuts[chosen][2]
        report = _report("robust", labels, D, float(np.median(noise)), "measured", noise_multiple, W)
        gap = _gap(cuts[chosen]) if np.isfinite(cuts[chosen][1]) else None
        if chosen == at:
            return labels, replace(report, gap=gap)
        refused = max(cuts[at:chosen], key=_gap)
        return labels, replace(
            report,
            noise_clusters=int(cuts[at][2].max()) + 1,
            gap=gap,
            refused_clusters=int(refused[2].max()) + 1,
            refused_gap=_gap(refused),
        )
    for height, next_height, labels in cuts:
        s = _within_rms(directed, labels)
        if s is not None and height <= noise_multiple * s < next_height:
            return labels, _report("robust", labels, D / s, s, "estimated", noise_multiple, W)
    labels = np.arange(size)
    return labels, _report("robust", labels, D, None, "none", noise_multiple, W)


def _gap(cut: tuple[float, float, np.ndarray]) -> float:
    """How much higher a cut's clusters join than the last merge that formed them (floored at 1)."""
    height, next_height, _ = cut
    return next_height / max(height, 1.0)


def _clear(cut: tuple[float, float, np.ndarray], clear_gap: float) -> bool:
    """Whether a cut is kept by the clear-gap test (one cluster, or clusters never joined: yes)."""
    return not np.isfinite(cut[1]) or _gap(cut) >= clear_gap


def extract_clusters(
    W: np.ndarray,
    *,
    rule: str = "robust",
    epsilon: float = EPSILON,
    noise: np.ndarray | None = None,
    **params: Any,
) -> tuple[np.ndarray, ExtractionReport]:
    """Cluster silos from their distance matrix with the chosen rule (see module docstring).

    ``epsilon`` is used by ``neighbourhoods`` only; ``noise`` and ``params``
    (``noise_multiple``, ``linkage_method``, ``clear_gap``) by ``robust`` only.
    """
    if rule == "robust":
        return robust_clusters(W, noise, **params)
    if rule == "neighbourhoods":
        if params or noise is not None:
            raise TypeError("rule 'neighbourhoods' takes only epsilon")
        W = _validated(W)
        labels = neighbourhood_clusters(W, epsilon)
        return labels, _report("neighbourhoods", labels, _symmetrised(W), None, "none", epsilon, W)
    raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")


_NOISE_FLOOR = 1e-12
"""Zero noise (measured, or identical silos) refuses any positive distance, finitely."""


def noise_or_one(noise: np.ndarray) -> np.ndarray:
    """Each silo's noise, 1 for a silo never measured (NaN): its row of W is all NaN, so the
    unit only has to be finite for the rules to leave it alone."""
    noise = np.asarray(noise, dtype=float)
    return np.where(np.isnan(noise), 1.0, noise)


def symmetrised(W: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
    """``max(W[c][c'], W[c'][c])`` with row c first divided by ``noise[c]`` (if given): the
    distances both rules cut, in the units they cut them (one direction where only one is
    measured)."""
    W = _validated(W)
    if noise is not None:
        W = W / np.maximum(np.asarray(noise, dtype=float), _NOISE_FLOOR)[:, None]
    return _symmetrised(W)


def partition_report(W: np.ndarray, labels: np.ndarray, noise: np.ndarray, noise_multiple: float) -> ExtractionReport:
    """The robust rule's report (margin, spread) for a partition found another way, e.g. by a
    staged pair plan: over the pairs measured, in noise units. A silo whose noise is NaN
    served no pair (its row of W is all NaN); the noise scale is the median of the others'."""
    W, noise = _validated(W), np.asarray(noise, dtype=float)
    scale = float(np.nanmedian(noise)) if np.isfinite(noise).any() else 1.0
    return _report(
        "robust", np.asarray(labels), symmetrised(W, noise_or_one(noise)), scale, "measured", noise_multiple, W
    )


def place_newcomer(distances: np.ndarray, labels: np.ndarray, cut: float, linkage_method: str = "average") -> int:
    """The cluster a newcomer joins, without moving anyone: the existing cluster whose members
    are closest on average (``average``, as the robust rule's linkage) or at worst
    (``complete``: every member within the cut, as the paper's adjacency asks) — if that
    is below ``cut``; otherwise a new label. ``distances`` is the newcomer's row of
    :func:`symmetrised` (NaN: not measured, ignored); ``labels`` the existing clusters,
    -1 for silos not clustered yet."""
    best, best_score = nearest_cluster(distances, labels, linkage_method)
    return best if best is not None and best_score < cut else int(labels.max()) + 1


def nearest_cluster(
    distances: np.ndarray, labels: np.ndarray, linkage_method: str = "average"
) -> tuple[int | None, float]:
    """(the existing cluster closest to a silo by its measured distances to the members, that
    linkage score), whatever the cut; (None, inf) when no member was measured."""
    if linkage_method not in LINKAGES:
        raise ValueError(f"unknown linkage_method {linkage_method!r}; expected one of {LINKAGES}")
    best, best_score = None, np.inf
    for k in np.unique(labels[labels >= 0]):
        d = distances[(labels == k) & np.isfinite(distances)]
        if d.size:
            score = float(d.mean() if linkage_method == "average" else d.max())
            if score < best_score:
                best, best_score = int(k), score
    return best, best_score


def _validated(W: np.ndarray) -> np.ndarray:
    W = np.asarray(W, dtype=float)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"W must be a square matrix, got shape {W.shape}")
    if np.any(np.isinf(W)):
        raise ValueError("W must not contain infinities (use NaN for an unmeasured pair)")
    return W


def _symmetrised(W: np.ndarray) -> np.ndarray:
    """``max(W[c][c'], W[c'][c])``, the one measured where a pair was measured one way (a
    staged plan's placing stages), NaN where neither was; diagonal 0."""
    D = np.fmax(W, W.T)
    np.fill_diagonal(D, 0.0)
    return D


def _dendrogram_cuts(D: np.ndarray, method: str) -> list[tuple[float, float, np.ndarray]]:
    """Every cut of the agglomerative dendrogram of ``D``, over measured pairs only.

    Returns ``(height, next_height, labels)`` from the finest cut (no merge, height -inf)
    to the coarsest: ``labels`` is the partition for any threshold in
    ``[height, next_height)``. Two groups are as far apart as the mean (``average``) or the
    largest (``complete``) of their *measured* pair distances, and groups with no measured
    pair between them never merge: under partial participation a silo joins its cluster
    once it has been measured against some of it, not all (the EMD-CFL paper, Appendix E.4), and a
    silo measured against nobody stays alone. With every pair measured this is UPGMA /
    complete linkage exactly (tested against scipy). Written by hand because scipy's
    linkage takes no missing distances; O(C^3), nothing for C in the hundreds.
    """
    if method not in LINKAGES:
        raise ValueError(f"unknown linkage_method {method!r}; expected one of {LINKAGES}")
    size = D.shape[0]
    measured = np.isfinite(D) & ~np.eye(size, dtype=bool)
    count = measured.astype(np.float64)  # measured pairs between two groups
    if method == "average":
        total = np.where(measured, D, 0.0)  # their sum
    else:
        total = np.where(measured, D, -np.inf)  # their maximum
    active = np.ones(size, dtype=bool)
    labels = np.arange(size)
    partitions, heights = [labels.copy()], list[float]()
    while True:
        with np.errstate(divide="ignore", invalid="ignore"):
            score = total / count if method == "average" else total.copy()
        score[~(count > 0) | ~active[:, None] | ~active[None, :]] = np.inf
        np.fill_diagonal(score, np.inf)
        i, j = np.unravel_index(np.argmin(score), score.shape)
        if not np.isfinite(score[i, j]):
            break
        i, j = min(i, j), max(i, j)  # j joins i
        heights.append(max(float(score[i, j]), heights[-1] if heights else -np.inf))  # no inversions
        total[i] = total[i] + total[j] if method == "average" else np.maximum(total[i], total[j])
        total[:, i] = total[i]
        count[i] += count[j]
        count[:, i] = count[i]
        active[j] = False
        labels[labels == j] = i
        partitions.append(relabel_by_first_appearance(labels))
    bounds = [-np.inf, *heights, np.inf]
    return [(bounds[k], bounds[k + 1], p) for k, p in enumerate(partitions)]


def _within_rms(W: np.ndarray, labels: np.ndarray) -> float | None:
    """RMS about 0 of the directed within-cluster entries; ``None`` when there are none."""
    same = labels[:, None] == labels[None, :]
    np.fill_diagonal(same, False)
    values = W[same & np.isfinite(W)]
    return max(float(np.sqrt(np.mean(values**2))), _NOISE_FLOOR) if values.size else None


def _report(
    rule: str,
    labels: np.ndarray,
    D: np.ndarray,
    noise_scale: float | None,
    noise_source: str,
    threshold: float,
    W: np.ndarray,
) -> ExtractionReport:
    """Summarise a clustering; ``D`` is symmetrised, in the units the report states."""
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    within = D[same & off_diagonal & np.isfinite(D)]
    between = D[~same & np.isfinite(D)]
    max_within = float(within.max()) if within.size else None
    min_between = float(between.min()) if between.size else None
    margin = None
    if noise_scale is not None and min_between is not None:
        margin = min_between / max(max_within if max_within is not None else 1.0, 1.0)
    unmeasured = np.isnan(W) & np.isnan(W.T)  # neither direction (a placing stage may measure one)
    return ExtractionReport(
        rule=rule,
        n_clusters=int(labels.max()) + 1 if labels.size else 0,
        margin=margin,
        noise_scale=noise_scale,
        noise_source=noise_source,
        threshold=float(threshold),
        max_within=max_within,
        min_between=min_between,
        unmeasured_pairs=int(np.count_nonzero(np.triu(unmeasured, k=1))),
    )
