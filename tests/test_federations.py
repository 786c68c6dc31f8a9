"""The federations of `benchmarks.federations` are what they say: site sizes in bounds, the
examples' shapes and labels, the groups and their shifts, and files the product's reader takes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.federation_data import (
    FEDERATIONS,
    MAX_SITE,
    MIN_SITE,
    build,
    flwr_available,
    load_source,
    partition,
)
from benchmarks.federations import aggregate, at_a_glance
from cfl_mpi.config import load_config
from cfl_mpi.data import DataFacts, SiloFiles


def read_back(folder: Path, sites: int) -> list:
    """Every site as the product reads it, through the federation's own run config."""
    cfg = load_config(str(folder / "config.yaml"), [])
    assert isinstance(cfg.data, SiloFiles) and cfg.silos == sites
    return [cfg.data.build(silo, DataFacts(sites, 0)) for silo in range(sites)]


def check(name: str, folder: Path, mnist: Path | None) -> tuple[list, list]:
    fed = FEDERATIONS[name]
    sites = build(fed, folder, mnist, "own")
    x, y = load_source(fed.source, mnist)
    classes = int(y.max()) + 1
    assert len(sites) == fed.sites
    assert all(MIN_SITE <= s.examples <= MAX_SITE for s in sites), [s.examples for s in sites]
    assert sum(s.examples for s in sites) == (fed.pool or len(y))  # every drawn example held once
    assert [s.group for s in sites] == [g for g in range(len(fed.shifts)) for _ in range(fed.sites_per_group)]
    meta = json.loads((folder / "federation.json").read_text())
    assert meta["partitioner"].startswith("own numpy")
    data = read_back(folder, fed.sites)
    for site, d in zip(sites, data):
        held = np.concatenate([d.y_train, d.y_val, d.y_test])
        assert len(held) == site.examples
        assert np.bincount(held, minlength=classes).tolist() == site.label_counts
        assert d.group == (site.group if fed.grouped else -1)
        shape = d.x_train.shape[1:]
        if fed.tabular:
            assert shape == x.shape[1:]
        else:  # PNG folders are read as RGB, arrays as one channel
            assert shape[1:] == x.shape[1:] and shape[0] in ((1, 3) if fed.files == "png" else (1,))
    return sites, data


def test_cancer_labs_two_labs_with_shifted_features(tmp_path):
    _, data = check("cancer_labs", tmp_path / "fed", None)
    lab_a = np.concatenate([d.x_train for d in data[:3]])
    lab_b = np.concatenate([d.x_train for d in data[3:]])
    # lab A keeps the standardised features (mean ~0, sd ~1); lab B's instrument scales each
    # feature by 0.5-2x and offsets it: its per-feature sd ratios spread far beyond sampling's
    ratio = lab_b.std(0) / lab_a.std(0)
    assert np.abs(lab_a.mean(0)).max() < 0.5
    assert ratio.min() < 0.75 and ratio.max() > 1.4


def test_label_skew_and_quantity_skew_have_no_groups(tmp_path):
    sites, _ = check("cancer_dir1", tmp_path / "dir", None)
    shares = np.array([s.label_counts for s in sites]) / np.array([[s.examples] for s in sites])
    assert shares[:, 0].max() - shares[:, 0].min() > 0.5  # sites far apart in their label mix
    assert "group" not in (tmp_path / "dir" / "manifest.csv").read_text().splitlines()[0]
    sizes = [s.examples for s in check("digits_quantity", tmp_path / "qty", None)[0]]
    assert sizes == sorted(sizes) and sizes[-1] > 7 * sizes[0]  # 1:8, no label skew asked


def test_inverted_digits_as_png_folders(tmp_path):
    _, data = check("digits_inverted_dir1", tmp_path / "fed", None)
    plain = np.mean([d.x_train.mean() for d in data[:4]])
    inverted = np.mean([d.x_train.mean() for d in data[4:]])
    assert plain < 0.35 < 0.65 < inverted  # dark background, then light


def test_mnist_pathological_two_classes_a_site(tmp_path, shared_data):
    sites, _ = check("mnist_patho2", tmp_path / "fed", shared_data / "mnist")
    assert all(np.count_nonzero(s.label_counts) == 2 for s in sites)
    assert all(any(s.label_counts[c] for s in sites) for c in range(10))


@pytest.mark.skipif(not flwr_available(), reason="flwr-datasets not installed (pip install -e '.[benchmarks]')")
def test_flower_partitions_in_bounds_and_disjoint():
    _, y = load_source("digits", None)
    for name in ("digits_inverted_dir1", "digits_quantity"):
        parts = partition(y, FEDERATIONS[name], 8, 0, "flwr")
        held = np.concatenate(parts)
        assert len(held) == len(np.unique(held)) == len(y)
        assert all(MIN_SITE <= len(p) <= MAX_SITE for p in parts)


def test_at_a_glance_sets_each_method_beside_fedavg_in_the_same_seeds():
    def run(method: str, seed: int, worst: float, ari: float | None = None, clusters: int = 1) -> dict:
        return {"federation": "cancer_labs", "backend": "simulate", "method": method, "seed": seed,
                "n_clusters": clusters, "ari": ari, "avg_acc": worst, "worst_acc": worst, "margin": None,
                "gap": None, "command_wall_s": 1.0}  # fmt: skip

    rows = [run("fedavg", 0, 0.90, 0.0), run("fedavg", 1, 0.80, 0.0)]
    rows += [run("emdcfl", 0, 0.95, 1.0, 2), run("emdcfl", 1, 0.70, 0.0)]  # +5 and -10 points: -2.5
    rows += [run("ifca", 0, 0.85, 0.5, 2), run("ifca", 2, 0.99, 1.0, 2)]  # seed 2 has no FedAvg beside it
    [head, row] = [line for line in at_a_glance(aggregate(rows)) if line.startswith("| ")]
    assert head == "| federation | emdcfl | fedavg | ifca |"
    assert row == "| cancer_labs | -2.5 · ARI 0.50 (2) | 85.0 % · ARI 0.00 (2) | -5.0 · ARI 0.75 (2) |"
