"""Cluster extraction: the paper's neighbourhood rule and the robust default."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.clustering.defaults import CLEAR_GAP
from cfl_mpi.clustering.extraction import (
    ExtractionReport,
    extract_clusters,
    neighbourhood_clusters,
    robust_clusters,
    symmetrised,
)

NOISE = 0.003  # spread of W between same-distribution silos, as in the real 16-silo matrix
SEEDS = range(5)


def _fixture(shared_data: Path, silos: int) -> dict:
    path = shared_data / "distances" / f"rotated_mnist_test_C{silos}.json"
    return json.loads(path.read_text())


def _matrix(sizes: list[int], separation: float = 8 * NOISE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """W for clusters of the given sizes: 0 +- NOISE inside, separation to 2x separation across."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    between = separation * (1.0 + rng.random((len(sizes), len(sizes))))
    between = np.triu(between, 1) + np.triu(between, 1).T
    W = between[truth][:, truth] + NOISE * rng.standard_normal((truth.size, truth.size))
    np.fill_diagonal(W, np.nan)
    return W, truth


# --- the real matrices (authors' code, rotated real MNIST) -----------------------------------


@pytest.mark.parametrize("silos", [8, 16])
def test_default_recovers_the_rotations(shared_data: Path, silos: int) -> None:
    data = _fixture(shared_data, silos)
    labels, report = extract_clusters(np.array(data["W"]))
    assert adjusted_rand_score(data["truth"], labels) == 1.0
    assert report.rule == "robust" and report.n_clusters == 4
    assert report.noise_source == "estimated"
    assert report.margin == pytest.approx(report.min_between / report.max_within)
    assert report.margin > 1.0


@pytest.mark.parametrize(
    ("silos", "epsilon", "ari", "n_clusters"),
    [(8, 0.025, 1.0, 4), (16, 0.025, 0.127, 14), (8, 0.1, 0.222, 4), (16, 0.1, 0.0, 16)],
)
def test_paper_rule_reproduces_the_authors(
    shared_data: Path, silos: int, epsilon: float, ari: float, n_clusters: int
) -> None:
    data = _fixture(shared_data, silos)
    assert data["authors_rule_results"][f"epsilon {epsilon}"]["ari"] == ari
    labels, report = extract_clusters(np.array(data["W"]), rule="neighbourhoods", epsilon=epsilon)
    assert round(adjusted_rand_score(data["truth"], labels), 3) == ari
    assert report.n_clusters == n_clusters
    assert report.noise_scale is None and report.margin is None


# --- synthetic matrices, default rule, noise estimated from W --------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("silos", [4, 12, 40])
def test_one_cluster_stays_one(silos: int, seed: int) -> None:
    W, _ = _matrix([silos], seed=seed)
    labels, report = robust_clusters(W)
    assert report.n_clusters == 1 and not labels.any()
    assert report.margin is None and report.min_between is None


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("sizes", [[6, 6], [4, 4, 4, 4], [1, 3, 6], [10, 10, 10, 10]])
def test_clusters_are_recovered(sizes: list[int], seed: int) -> None:
    W, truth = _matrix(sizes, seed=seed)
    labels, report = robust_clusters(W)
    assert adjusted_rand_score(truth, labels) == 1.0
    assert report.n_clusters == len(sizes)
    assert report.margin > 1.0


@pytest.mark.parametrize("seed", SEEDS)
def test_a_noisier_silo_stays_in_its_cluster(seed: int) -> None:
    W, truth = _matrix([6, 6], seed=seed)
    W[3] = np.where(truth == truth[3], 2.5 * W[3], W[3])  # silo 3 measures its peers 2.5x noisier
    labels, _ = robust_clusters(W)
    assert adjusted_rand_score(truth, labels) == 1.0


def test_a_silo_refusing_everyone_stays_alone() -> None:
    W, truth = _matrix([6, 6])
    W[3] += 0.2  # silo 3's row: everyone is far
    labels, report = robust_clusters(W)
    assert np.count_nonzero(labels == labels[3]) == 1
    rest = np.arange(12) != 3
    assert adjusted_rand_score(truth[rest], labels[rest]) == 1.0
    assert report.n_clusters == 3


@pytest.mark.parametrize("seed", SEEDS)
def test_a_single_refusal(seed: int) -> None:
    W, truth = _matrix([6, 6], seed=seed)
    W[1, 2] = 6 * NOISE  # silo 1 mildly refuses silo 2: beyond the cut, but one pair of 15
    assert adjusted_rand_score(truth, robust_clusters(W)[0]) == 1.0  # outvoted by the group
    labels, _ = robust_clusters(W, linkage_method="complete")
    assert labels[1] != labels[2]  # the clique rule honours any single veto
    W[1, 2] = 0.2  # a strong refusal is honoured by average linkage too
    labels, _ = robust_clusters(W)
    assert labels[1] != labels[2]


def test_unmeasured_pairs_are_judged_by_the_measured_ones() -> None:
    """Partial participation: a silo measured against nobody stays alone; a pair never
    measured inside a group is joined through the group's measured pairs (robust rule),
    never by the paper's rule, which needs the pair itself."""
    W, truth = _matrix([6, 6])
    W[4, :] = W[:, 4] = np.nan  # silo 4 not measured against anyone yet
    W[7, 8] = W[8, 7] = np.nan  # a pair never measured
    W[9, 10] = np.nan  # a pair measured one way (a staged plan's placing stage): it counts
    labels, report = robust_clusters(W)
    assert np.count_nonzero(labels == labels[4]) == 1
    rest = np.arange(12) != 4
    assert adjusted_rand_score(truth[rest], labels[rest]) == 1.0
    assert report.unmeasured_pairs == 11 + 1
    D = symmetrised(W)
    assert np.isnan(D[7, 8]) and D[9, 10] == D[10, 9] == W[10, 9]
    paper = neighbourhood_clusters(W, epsilon=4 * NOISE)
    assert np.count_nonzero(paper == paper[4]) == 1 and paper[7] != paper[8]


def test_groups_never_measured_against_each_other_stay_apart() -> None:
    W, _ = _matrix([3, 3])
    W[np.ix_(range(3), range(3, 6))] = W[np.ix_(range(3, 6), range(3))] = np.nan
    W[:3, :3] = W[3:, 3:] = 0.0  # both groups identical inside
    np.fill_diagonal(W, np.nan)
    labels, _ = robust_clusters(W, noise=np.full(6, NOISE))
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("method", ["average", "complete"])
@pytest.mark.parametrize("seed", range(20))
def test_linkage_equals_scipy_when_every_pair_is_measured(method: str, seed: int) -> None:
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    from cfl_mpi.clustering.extraction import _dendrogram_cuts
    from cfl_mpi.clustering.labels import relabel_by_first_appearance

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(int(rng.integers(3, 15)), 3))
    D = np.linalg.norm(x[:, None] - x[None], axis=-1)
    tree = linkage(squareform(D, checks=False), method=method)
    cuts = _dendrogram_cuts(D, method)
    np.testing.assert_allclose([h for h, _, _ in cuts[1:]], tree[:, 2], rtol=1e-12)
    for height, next_height, labels in cuts[1:-1]:
        expected = fcluster(tree, t=(height + next_height) / 2, criterion="distance")
        np.testing.assert_array_equal(labels, relabel_by_first_appearance(expected))


def test_nothing_measured_leaves_every_silo_alone() -> None:
    labels, report = robust_clusters(np.full((3, 3), np.nan))
    assert labels.tolist() == [0, 1, 2] and report.noise_source == "none"


# --- measured per-silo noise ------------------------------------------------------------------


def test_measured_noise_decides_where_estimation_cannot() -> None:
    far, near = np.array([[0.0, 0.05], [0.04, 0.0]]), np.array([[0.0, 0.002], [-0.001, 0.0]])
    noise = np.full(2, NOISE)
    assert robust_clusters(far, noise)[0].tolist() == [0, 1]
    assert robust_clusters(near, noise)[0].tolist() == [0, 0]
    assert robust_clusters(far)[0].tolist() == [0, 0]  # two silos alone carry no noise estimate


def test_measured_noise_is_each_silos_yardstick() -> None:
    W, truth = _matrix([6, 6])
    W[3] = np.where(truth == truth[3], 4 * W[3], W[3])  # silo 3 is 4x noisier ...
    noise = np.full(12, NOISE)
    noise[3] = 4 * NOISE  # ... and says so
    labels, report = robust_clusters(W, noise)
    assert adjusted_rand_score(truth, labels) == 1.0
    assert report.noise_source == "measured" and report.noise_scale == NOISE
    assert report.threshold == 3.5


# --- the clear gap: groups, not a continuum ---------------------------------------------------


def _positions(positions: np.ndarray, seed: int) -> np.ndarray:
    """W of silos at `positions` (noise units) on a line: |p - p'| apart, plus the noise."""
    rng = np.random.default_rng(seed)
    W = np.abs(positions[:, None] - positions[None, :]) * NOISE + NOISE * rng.standard_normal((positions.size,) * 2)
    np.fill_diagonal(W, np.nan)
    return W


@pytest.mark.parametrize("seed", SEEDS)
def test_a_continuum_beyond_the_noise_is_one_cluster(seed: int) -> None:
    """Silos 1.5 noise units apart in a row (as label skew puts them): the noise cut parts them,
    by merges that climb in small steps; the clear gap answers one cluster and says how many the
    cut gave. At a gap of 2.5 every seed is already one cluster (3 is the default)."""
    W, noise = _positions(np.arange(8) * 1.5, seed), np.full(8, NOISE)
    assert robust_clusters(W, noise)[1].n_clusters > 1
    for gap in (2.5, CLEAR_GAP):
        labels, report = robust_clusters(W, noise, clear_gap=gap)
        assert not labels.any() and report.n_clusters == 1
        assert report.noise_clusters is not None and report.noise_clusters > 1 and report.gap is None
        assert report.refused_gap is not None and report.refused_gap < gap
        _assert_refused_split_kept_at_its_gap(W, noise, report)


@pytest.mark.parametrize("seed", SEEDS)
def test_groups_skewed_inside_are_found_by_their_gap(seed: int) -> None:
    """Two groups 30 noise units apart, each a row of 5 silos 1.5 units apart: the noise cut
    gives 4 or 5 clusters, the clear gap the two groups, which join about 6 to 7 times higher
    than their members (twice the default gap)."""
    truth = np.repeat([0, 1], 5)
    W, noise = _positions(np.r_[np.arange(5), 20 + np.arange(5)] * 1.5, seed), np.full(10, NOISE)
    assert robust_clusters(W, noise)[1].n_clusters > 2
    labels, report = robust_clusters(W, noise, clear_gap=CLEAR_GAP)
    assert adjusted_rand_score(truth, labels) == 1.0
    assert report.noise_clusters is not None and report.noise_clusters > 2
    assert report.gap is not None and report.gap > 2 * CLEAR_GAP
    assert report.refused_gap is not None and report.refused_gap < CLEAR_GAP
    _assert_refused_split_kept_at_its_gap(W, noise, report)


def _assert_refused_split_kept_at_its_gap(W: np.ndarray, noise: np.ndarray, report: ExtractionReport) -> None:
    """What the console promises: the clearest refused split is kept at a clear gap of its own."""
    assert report.refused_clusters is not None and report.refused_gap is not None
    again = robust_clusters(W, noise, clear_gap=report.refused_gap)[1]
    assert again.n_clusters == report.refused_clusters and again.gap == report.refused_gap


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("sizes", [[6, 6], [4, 4, 4, 4], [1, 3, 6], [10, 10, 10, 10]])
def test_the_clear_gap_keeps_groups_within_the_noise(sizes: list[int], seed: int) -> None:
    """Clusters within the noise inside and 8 to 16 units apart: every split is kept."""
    W, truth = _matrix(sizes, seed=seed)
    labels, report = robust_clusters(W, np.full(truth.size, NOISE), clear_gap=CLEAR_GAP)
    assert adjusted_rand_score(truth, labels) == 1.0
    assert report.noise_clusters is None and report.gap is not None and report.gap > CLEAR_GAP


# --- the paper's rule on a hand-made matrix, and the API contract ----------------------------


def test_paper_rule_lets_a_silo_refuse_one_neighbour() -> None:
    W = np.array(
        [
            [0.0, 0.01, 0.01, 0.30],
            [0.01, 0.0, 0.01, 0.30],
            [0.01, 0.01, 0.0, 0.30],
            [0.30, 0.30, 0.30, 0.0],
        ]
    )
    assert neighbourhood_clusters(W, 0.025).tolist() == [0, 0, 0, 1]
    W[2, 1] = 0.05  # silo 2 refuses silo 1: neighbourhoods {0,1,2}, {0,1}, {0,2}, {3}
    assert neighbourhood_clusters(W, 0.025).tolist() == [0, 1, 2, 3]
    assert neighbourhood_clusters(W, 0.06).tolist() == [0, 0, 0, 1]


def test_labels_follow_first_appearance_and_report_is_json() -> None:
    W, truth = _matrix([3, 4, 5])
    order = np.random.default_rng(1).permutation(truth.size)
    labels, report = extract_clusters(W[np.ix_(order, order)])
    assert labels.dtype == np.int64 and labels.shape == (truth.size,)
    assert adjusted_rand_score(truth[order], labels) == 1.0
    clusters, first = np.unique(labels, return_index=True)
    assert clusters.tolist() == [0, 1, 2] and np.all(np.diff(first) > 0)  # silo 0 in cluster 0
    assert json.loads(json.dumps(asdict(report)))["n_clusters"] == 3


def test_unknown_rule_and_stray_parameters_are_refused() -> None:
    W, _ = _matrix([2, 2])
    with pytest.raises(ValueError, match="unknown rule"):
        extract_clusters(W, rule="kmeans")
    with pytest.raises(TypeError):
        extract_clusters(W, rule="neighbourhoods", noise_multiple=2.0)
    with pytest.raises(ValueError, match="noise"):
        robust_clusters(W, noise=np.array([1.0, -1.0, 1.0, 1.0]))
