"""The figures a person reads at a glance (cfl_mpi/reporting/plots.py): asserted on matplotlib's objects,
not on pixels."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from jobs import PROJECT_ROOT

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from cfl_mpi import strategies  # noqa: E402
from cfl_mpi.clustering.extraction import symmetrised  # noqa: E402
from cfl_mpi.reporting import plots

plt = plots._pyplot()

# 6 silos: true clusters 0,1,0,1,2,2; the rule found {0, 2}, {1, 3, 4, 5} (4 and 5 wrongly joined)
TRUTH = np.array([0, 1, 0, 1, 2, 2])
FOUND = np.array([0, 1, 0, 1, 1, 1])
NOISE = np.array([0.01, 0.02, 0.01, 0.02, 0.04, 0.04])


def _w() -> np.ndarray:
    rng = np.random.default_rng(0)
    W = np.where(TRUTH[:, None] == TRUTH[None, :], 0.0, 1.0) + 0.005 * rng.standard_normal((6, 6))
    W[np.ix_([1, 3], [4, 5])] = W[np.ix_([4, 5], [1, 3])] = 0.03  # within the cut in noise units
    np.fill_diagonal(W, 0.0)
    return W


def _main_image(fig) -> AxesImage:
    """The heat map's image: the largest axes holding one."""
    axes = [ax for ax in fig.axes if ax.images and ax.get_label() not in ("true clusters", "<colorbar>")]
    return max(axes, key=lambda ax: ax.get_position().width).images[0]


def _main_axes(fig):
    return _main_image(fig).axes


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_silo_order_groups_found_clusters_then_true_then_number():
    assert plots.silo_order(TRUTH, FOUND).tolist() == [0, 2, 1, 3, 4, 5]
    assert plots.silo_order(TRUTH).tolist() == [0, 2, 1, 3, 4, 5]
    # found clusters in order of their first silo, whatever their labels
    assert plots.silo_order(np.array([0, 0, 1, 1]), np.array([5, 2, 5, 2])).tolist() == [0, 2, 1, 3]


def test_robust_rule_heatmap_is_in_noise_units_ordered_and_outlined_by_found_clusters():
    W = _w()
    noise, cut, label = plots.rule_view(
        "W", {"W": W, "noise": NOISE}, {"name": "emdcfl", "rule": "robust", "noise_multiple": 3.5}
    )
    assert cut.value == 3.5 and label.startswith("distance in noise units (cut at 3.5)")
    fig = plots.heatmap_figure(W, TRUTH, "t", label, found=FOUND, noise=noise, cut=cut)
    assert _main_image(fig).colorbar.ax.get_ylabel() == label
    order = [0, 2, 1, 3, 4, 5]
    shown = np.ma.getdata(_main_image(fig).get_array())
    np.testing.assert_allclose(shown, symmetrised(W, NOISE)[np.ix_(order, order)])
    ax = _main_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(s) for s in order]
    # one box per found cluster, around its block on the diagonal
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert sorted((b.get_x(), b.get_width()) for b in boxes) == [(-0.5, 2), (1.5, 4)]
    # the true clusters: strips along both axes, in the same order
    strips = [a for a in fig.axes if a.get_label() == "true clusters"]
    assert len(strips) == 2
    codes = {0: 0, 1: 1, 2: 2}
    for strip in strips:
        assert np.ravel(strip.images[0].get_array()).tolist() == [codes[t] for t in TRUTH[order]]


def test_without_known_groups_the_figures_show_the_clusters_found():
    """Silos that bring their own data without a group: no true clusters to show, so the strips
    and the accuracy curves' colours are the clusters found, and the figures say so."""
    fig = plots.heatmap_figure(_w(), None, "t", found=FOUND)
    strips = [a for a in fig.axes if a.get_label() == "clusters found"]
    assert len(strips) == 2 and not [a for a in fig.axes if a.get_label() == "true clusters"]
    assert any("no known groups" in t.get_text() for t in fig.texts)
    curves = plots.accuracy_figure([1, 2], np.full((2, 6), 0.5), None, "t", FOUND)
    assert "cluster found" in curves.axes[0].get_title()


def test_the_cut_is_on_the_colour_bar_and_the_colours_step_there():
    W = _w()
    fig = plots.heatmap_figure(W, TRUTH, "t", found=FOUND, noise=NOISE, cut=plots.Cut(3.5, "cut 3.5"))
    image = _main_image(fig)
    bar = image.colorbar
    assert 3.5 in list(bar.get_ticks())
    assert "cut 3.5" in [t.get_text() for t in bar.ax.get_yticklabels()]
    assert any(np.allclose(line.get_ydata(), 3.5) for line in bar.ax.lines)  # a line at the cut
    norm, cmap = image.norm, image.cmap
    assert norm(3.5) == pytest.approx(0.5)
    below, above = np.array(cmap(norm(3.49))), np.array(cmap(norm(3.51)))
    assert np.abs(below - above).max() > 0.15  # a visible step, not a smooth blend
    # viridis, not red-green: the ends are viridis' ends
    viridis = plt.get_cmap("viridis")
    np.testing.assert_allclose(cmap(0.0), viridis(0.0))
    np.testing.assert_allclose(cmap(1.0), viridis(1.0))


@pytest.mark.parametrize(
    "name,strategy,words",
    [
        ("W", {"name": "emdcfl", "rule": "robust", "noise_multiple": 5.0}, "distance in noise units (cut at 5)"),
        (
            "W",
            {"name": "emdcfl", "rule": "robust", "distance": "energy"},
            "energy distance in noise units (cut at 3.5)",
        ),
        ("W", {"name": "emdcfl", "rule": "neighbourhoods", "epsilon": 0.1}, "distance W1 − τ (cut at ε = 0.1)"),
        ("A", {"name": "pacfl", "beta": 600.0}, "sum of principal angles (degrees), cut at β = 600°"),
        ("A", {"name": "pacfl", "measure": "smallest", "beta": 40.0}, "smallest principal angle (degrees)"),
        ("S", {"name": "cfl"}, "cosine similarity of the silos' weight updates"),
        ("D", {"name": "fedwad", "p": 2, "space": "input"}, "W2 distance between the silos' inputs"),
        ("D", {"name": "fedwad", "p": 1, "space": "embedding"}, "W1 distance between the silos' embeddings"),
    ],
)
def test_colour_bar_labels_say_in_words_what_the_colours_are(name, strategy, words):
    """What each strategy's heat map shows, with the run's own cut: no formula to decode."""
    _, _, label = plots.rule_view(name, {name: np.zeros((4, 4)), "noise": np.ones(4)}, strategy)
    assert label.startswith(words)
    assert "[" not in label and "=" not in label.replace("β = ", "").replace("ε = ", "")
    for spec_label in (how.label for how in strategies.pairwise().values()):
        assert "[" not in spec_label and "=" not in spec_label


def test_matrices_without_noise_are_shown_raw_with_their_own_cut():
    A = np.array([[0.0, 400, 900, 950], [400, 0, 910, 940], [900, 910, 0, 300], [950, 940, 300, 0]])
    truth = np.array([0, 0, 1, 1])
    noise, cut, label = plots.rule_view("A", {"A": A}, {"name": "pacfl", "beta": 600.0})
    assert noise is None and cut.value == 600.0 and "600" in cut.label
    fig = plots.heatmap_figure(A, truth, "t", label, directed=False, found=truth, cut=cut)
    np.testing.assert_allclose(np.ma.getdata(_main_image(fig).get_array()), A)
    S = 1 - A / 1000
    fig = plots.heatmap_figure(
        S, truth, "t", strategies.cfl.SPEC.pairwise["S"].label, similarity=True, directed=False, found=truth
    )
    image = _main_image(fig)
    np.testing.assert_allclose(np.ma.getdata(image.get_array()), S)
    # dark is close for a similarity too: the highest similarity gets viridis' darkest colour
    np.testing.assert_allclose(image.cmap(image.norm(S[2, 3])), plt.get_cmap("viridis")(0.0), atol=0.05)


def test_neighbourhoods_rule_cuts_raw_symmetrised_w_at_epsilon():
    noise, cut, _ = plots.rule_view(
        "W", {"W": _w(), "noise": NOISE}, {"name": "emdcfl", "rule": "neighbourhoods", "epsilon": 0.025}
    )
    assert noise is None and cut.value == 0.025


def test_unmeasured_pairs_are_grey_and_many_silos_are_not_numbered():
    rng = np.random.default_rng(1)
    truth = np.repeat(np.arange(4), 15)
    W = np.abs(rng.standard_normal((60, 60))) + (truth[:, None] != truth[None, :])
    W[rng.random((60, 60)) < 0.5] = np.nan
    fig = plots.heatmap_figure(W, truth, "t", found=truth, noise=np.full(60, 0.1), cut=(3.5, "cut 3.5"))
    ax = _main_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]  # the found clusters
    assert any("not measured" in t.get_text() for t in fig.texts)


def test_run_heatmap_reads_a_results_folder(tmp_path):
    W = _w()
    np.save(tmp_path / "W.npy", W)
    np.save(tmp_path / "noise.npy", NOISE)
    (tmp_path / "clusters.json").write_text(
        json.dumps(
            {
                "clusters": {str(s): int(k) for s, k in enumerate(FOUND)},
                "truth": {str(s): int(k) for s, k in enumerate(TRUTH)},
            }
        )
    )
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"strategy": {"name": "emdcfl", "rule": "robust", "noise_multiple": 5.0}})
    )
    assert plots.run_heatmap(tmp_path, tmp_path / "distances.png", "run")
    assert (tmp_path / "distances.png").stat().st_size > 0
    bare = tmp_path / "fedavg"  # a run without a pairwise matrix: no heat map
    bare.mkdir()
    (bare / "clusters.json").write_text((tmp_path / "clusters.json").read_text())
    assert not plots.run_heatmap(bare, bare / "distances.png", "run")
    assert not (bare / "distances.png").exists()


def test_one_round_accuracy_plot_has_markers_and_an_integer_tick():
    per_silo = np.array([[0.8, 0.9, 0.7, 0.85, 0.75, 0.95]])
    fig = plots.accuracy_figure([1], per_silo, TRUTH, "t")
    ax = fig.axes[0]
    assert all(line.get_marker() not in (None, "None", "", " ") for line in ax.lines)
    assert list(ax.get_xticks()) == [1]
    lo, hi = ax.get_xlim()
    assert lo < 1 < hi and hi - lo >= 1
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["average", "worst silo"]


def test_accuracy_rounds_are_integers_with_many_rounds_and_late_silos():
    rounds = list(range(1, 31))
    per_silo = np.full((30, 6), 0.8)
    per_silo[:10, 5] = np.nan  # silo 5 arrives at round 11
    per_silo[0, :] = np.nan  # nobody evaluated in round 1: no warning, no crash
    fig = plots.accuracy_figure(rounds, per_silo, TRUTH, "t")
    ticks = fig.axes[0].get_xticks()
    assert np.all(ticks == np.round(ticks))


def test_coinciding_methods_stay_distinguishable():
    good, bad = np.array([90.0, 94.5, 95.75]), np.array([33.5, 60.0, 66.5])
    r = [1, 2, 3]
    curves = {
        "EMD-CFL": (r, good),
        "PACFL": (r, good.copy()),
        "CFL": (r, bad),
        "IFCA": (r, good.copy()),
        "FedAvg": (r, bad.copy()),
        "Oracle": (r, good.copy()),
    }
    assert plots.coinciding(curves) == {"PACFL": "EMD-CFL", "IFCA": "EMD-CFL", "FedAvg": "CFL", "Oracle": "EMD-CFL"}
    fig = plots.methods_figure([("Rotated MNIST", curves), ("not run", {})])
    assert len(fig.axes) == 1  # no blank panel
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 6
    assert len({line.get_marker() for line in lines}) == 6
    assert len({to_rgba(line.get_color()) for line in lines}) == 6
    # identical curves are drawn side by side, never on top of each other, within a round's width
    xs = [tuple(line.get_xdata()) for line in lines]
    assert len(set(xs)) == 6
    assert max(abs(x[0] - 1) for x in xs) < 0.25
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "EMD-CFL",
        "PACFL (same as EMD-CFL)",
        "CFL",
        "IFCA (same as EMD-CFL)",
        "FedAvg (same as CFL)",
        "Oracle (same as EMD-CFL)",
    ]
    assert list(ax.get_xticks()) == [1, 2, 3]


def test_one_round_method_plot_is_not_blank():
    fig = plots.methods_figure([("t", {"A": ([1], np.array([90.0])), "B": ([1], np.array([90.0]))})])
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1]
    assert all(line.get_marker() not in (None, "None", "") for line in ax.get_lines())


def test_importing_plots_does_not_import_matplotlib():
    code = "import sys, cfl_mpi.reporting.plots; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plots_names_no_strategy():
    """Each strategy says how its matrix is drawn (its spec's `Pairwise.view`): the plots know
    none by name or label."""
    source = (PROJECT_ROOT / "cfl_mpi" / "reporting" / "plots.py").read_text().lower()
    named = [word for spec in strategies.REGISTRY.values() for word in (spec.name, spec.label.lower())]
    assert [word for word in named if re.search(rf"\b{re.escape(word)}\b", source)] == []
