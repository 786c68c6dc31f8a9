"""Figures a person would rather look at than read: distances and accuracy over rounds.

matplotlib is imported inside the functions that draw (`_pyplot`): a rank that never plots
never imports it. Colours are colour-blind safe: viridis for values, the Okabe-Ito palette for
categories (true clusters, methods)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import strategies
from ..strategies import Cut


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: Okabe & Ito (2008), distinguishable with every common colour-vision deficiency
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


#: the colour-bar label of a distance plot told no other
DISTANCE_LABEL = "distance"


def rule_view(
    name: str, artifacts: Mapping[str, np.ndarray], strategy: Any = None
) -> tuple[np.ndarray | None, Cut | None, str]:
    """(noise to divide the matrix's rows by or None, the cut or None, the colour-bar label) of
    the matrix `name` in the units its strategy's rule cuts in, with the run's cut (`strategy`:
    its settings, dataclass or config.yaml's dict). Each strategy says how (its spec's
    `Pairwise.view`)."""
    return strategies.pairwise_view(name, artifacts, strategy)


def pairwise_heatmap(
    artifacts: Mapping[str, np.ndarray],
    truth: np.ndarray | None,
    title: str,
    path: Path,
    *,
    found: np.ndarray | None = None,
    strategy: Any = None,
) -> bool:
    """The heat map of whichever pairwise matrix the strategy left in `artifacts` (a spec's `pairwise`),
    in the units its rule cuts (`strategy`: its config, dataclass or dict), silos ordered and
    outlined by the `found` clusters. False when there is no such matrix (nothing written)."""
    for name, how in strategies.pairwise().items():
        if name in artifacts:
            noise, cut, label = rule_view(name, artifacts, strategy)
            kind = "similarities" if how.similarity else "distances"
            distance_heatmap(
                artifacts[name],
                truth,
                f"{title} pairwise {kind}",
                path,
                label,
                how.similarity,
                how.directed,
                found=found,
                noise=noise,
                cut=cut,
            )
            return True
    return False


def run_heatmap(run: Path, path: Path, title: str) -> bool:
    """`pairwise_heatmap` from a results folder: its W/A/S/D.npy (and noise.npy), clusters.json
    (found and true clusters) and config.yaml (the strategy's cut). False when the run left no
    pairwise matrix."""
    artifacts = {
        name: np.load(run / f"{name}.npy")
        for name in (*strategies.pairwise(), "noise")
        if (run / f"{name}.npy").exists()
    }
    clusters = json.loads((run / "clusters.json").read_text())
    truth = np.array([clusters["truth"][str(s)] for s in range(len(clusters["truth"]))])
    found = (
        np.array([clusters["clusters"][str(s)] for s in range(len(clusters["clusters"]))])
        if len(clusters.get("clusters", {})) == len(truth)
        else None
    )
    strategy = None
    if (run / "config.yaml").exists():
        import yaml

        strategy = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("strategy")
    return pairwise_heatmap(artifacts, truth, title, path, found=found, strategy=strategy)


def silo_order(truth: np.ndarray, found: np.ndarray | None = None) -> np.ndarray:
    """Silos grouped by found cluster (clusters in order of their first silo), by true cluster
    inside one, then by number; by true cluster alone without `found`."""
    truth = np.asarray(truth)
    if found is None:
        return np.lexsort((np.arange(len(truth)), truth))
    found = np.asarray(found)
    first = {k: int(np.flatnonzero(found == k)[0]) for k in np.unique(found)}
    return np.lexsort((np.arange(len(truth)), truth, np.array([first[k] for k in found])))


def _cut_norm(vmin: float, cut: float, vmax: float):
    """Colours with the cut in the middle of the bar: [vmin, cut] linear onto the lower half,
    (cut, vmax] onto the upper half, logarithmically when it spans more than a factor of 4 (a
    between-cluster distance of 7 noise units then looks apart from one of 3, and one of 100
    does not squash the rest)."""
    from matplotlib.colors import Normalize

    log = cut > 0 and vmax / cut > 4

    class CutNorm(Normalize):
        def __call__(self, value, clip=None):
            v: np.ma.MaskedArray = np.ma.asarray(value, dtype=float)
            data = np.ma.getdata(v)
            with np.errstate(divide="ignore", invalid="ignore"):
                low = 0.5 * (data - vmin) / (cut - vmin)
                high = 0.5 + 0.5 * (
                    np.log(np.maximum(data, cut) / cut) / np.log(vmax / cut) if log else (data - cut) / (vmax - cut)
                )
            out = np.clip(np.where(data <= cut, low, high), 0.0, 1.0)
            return np.ma.masked_array(out, mask=np.ma.getmaskarray(v))

        def inverse(self, value):
            u = np.asarray(value, dtype=float)
            low = vmin + 2 * u * (cut - vmin)
            high = cut * np.exp((2 * u - 1) * np.log(vmax / cut)) if log else cut + (2 * u - 1) * (vmax - cut)
            return np.where(u <= 0.5, low, high)

    return CutNorm(vmin, vmax)


def _cut_ticks(vmin: float, cut: float, vmax: float) -> list[float]:
    """A few readable colour-bar ticks on either side of the cut (the cut gets its own label)."""
    from matplotlib.ticker import MaxNLocator

    below = [t for t in MaxNLocator(3).tick_values(vmin, cut) if vmin <= t < cut * 0.8 or (t == 0 and vmin <= 0 < cut)]
    if cut > 0 and vmax / cut > 4:
        decades = 10.0 ** np.arange(np.floor(np.log10(cut)), np.ceil(np.log10(vmax)) + 1)
        above = [float(m * d) for d in decades for m in (1, 2, 5) if cut * 1.4 < m * d <= vmax]
        if len(above) > 5:
            above = [t for t in above if np.isclose(np.log10(t) % 1, 0) or np.isclose(np.log10(t) % 1, np.log10(5) % 1)]
    else:
        above = [t for t in MaxNLocator(3).tick_values(cut, vmax) if cut * 1.2 < t <= vmax]
    return [*below, *above]


def distance_heatmap(
    W: np.ndarray,
    truth: np.ndarray | None,
    title: str,
    path: Path,
    label: str = DISTANCE_LABEL,
    similarity: bool = False,
    directed: bool = True,
    *,
    found: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    cut: Cut | tuple[float, str] | None = None,
) -> None:
    """Pairwise heat map as the clustering rule sees it (cf. Figs. 14–17), written to `path`:
    see `heatmap_figure`."""
    fig = heatmap_figure(W, truth, title, label, similarity, directed, found=found, noise=noise, cut=cut)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def heatmap_figure(
    W: np.ndarray,
    truth: np.ndarray | None,
    title: str,
    label: str = DISTANCE_LABEL,
    similarity: bool = False,
    directed: bool = True,
    *,
    found: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    cut: Cut | tuple[float, str] | None = None,
):
    """The heat map's figure (the caller closes it).

    A `directed` matrix (row: whose model, column: whose data) is shown symmetrised,
    max(W[c][c'], W[c'][c]), each row first divided by `noise` when given: the matrix the rule
    cuts, in its units; any other
    matrix as it is. Silos are ordered by the `found` clusters, which are outlined (without
    them: by true cluster, with thin lines between true clusters); a colour strip along both
    axes shows the true clusters (the found ones where the data set knows none: `truth` None).
    The `cut` (value, label) is marked on the colour bar, the colours step there (blues below,
    greens and yellows above) and put it in the middle of the bar. Dark is close: low
    distances, high `similarity`. Values are printed in the cells when there are at most 12
    silos; grey: not measured (NaN)."""
    plt = _pyplot()
    W = np.asarray(W, dtype=float)
    known = truth is not None
    truth = np.asarray(truth if known else found)
    if directed:
        from ..clustering.extraction import symmetrised

        D = symmetrised(W, noise)
    else:
        D = W.copy()
    order = silo_order(truth, found)
    D = D[np.ix_(order, order)]
    size = len(order)
    cut = Cut(*cut) if cut is not None else None

    fig, ax = plt.subplots(figsize=(8.0, 6.6))
    cmap, norm = _heatmap_colours(plt, D, similarity, cut)
    off = ~np.eye(size, dtype=bool) & np.isfinite(D)
    im = ax.imshow(np.ma.masked_invalid(D), cmap=cmap, norm=norm, interpolation="nearest")
    ax.set_facecolor("0.8")
    n_found = _outline_clusters(ax, truth, order, found)
    if size <= 12:  # the values themselves, where they fit
        for i, j in zip(*np.nonzero(off)):
            v = D[i, j]
            dark = norm(v) > 0.45 if similarity else norm(v) < 0.55
            text = f"{v:.0f}" if abs(v) >= 10 else f"{v:.2g}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    cax, kinds = _cluster_strips(ax, truth, order, found, n_found, title, known)
    _colour_bar(fig, im, cax, label, norm, cut)
    _heatmap_notes(fig, D, kinds, known, found, n_found, cut)
    fig.subplots_adjust(left=0.08, right=0.8, top=0.93, bottom=0.19)
    return fig


def _heatmap_colours(plt: Any, D: np.ndarray, similarity: bool, cut: Cut | None) -> tuple[Any, Any]:
    """The colour map (dark: close; a step at the cut: blues below it, greens and yellows above;
    grey: NaN) and the normalisation that puts the cut in the middle of the bar."""
    from matplotlib.colors import ListedColormap, Normalize

    cmap = plt.get_cmap("viridis_r" if similarity else "viridis")  # dark: close
    if cut is not None:  # a step in colour at the cut: blues below it, greens and yellows above
        cmap = ListedColormap(
            np.vstack([cmap(np.linspace(0.0, 0.36, 128)), cmap(np.linspace(0.56, 1.0, 128))]), name=f"{cmap.name}_cut"
        )
    cmap = cmap.with_extremes(bad="0.8")
    off = ~np.eye(len(D), dtype=bool) & np.isfinite(D)
    values = D[off] if off.any() else np.array([0.0])
    lo, hi = float(values.min()), float(values.max())
    if cut is not None:
        vmin = min(lo, 0.0, cut.value - abs(cut.value))
        return cmap, _cut_norm(vmin if vmin < cut.value else cut.value - 1.0, cut.value, max(hi, 2.0 * cut.value))
    return cmap, Normalize(lo, hi if hi > lo else lo + 1.0)


def _outline_clusters(ax: Any, truth: np.ndarray, order: np.ndarray, found: np.ndarray | None) -> int:
    """The found clusters as outlined blocks (white with a black rim, visible on every colour),
    or, without them, thin lines between the true clusters; the number of clusters found."""
    from matplotlib import patheffects
    from matplotlib.patches import Rectangle

    if found is None:
        for b in np.flatnonzero(np.diff(truth[order])) + 0.5:
            ax.axhline(b, color="black", lw=0.8)
            ax.axvline(b, color="black", lw=0.8)
        return 0
    f = np.asarray(found)[order]
    starts = [0, *(np.flatnonzero(np.diff(f)) + 1)]
    halo = [patheffects.Stroke(linewidth=3.6, foreground="black"), patheffects.Normal()]
    for a, b in zip(starts, [*starts[1:], len(order)]):
        block = Rectangle((a - 0.5, a - 0.5), b - a, b - a, fill=False, edgecolor="white", lw=2.0)
        block.set(path_effects=halo, clip_on=False, zorder=3, label="found cluster")
        ax.add_patch(block)
    return len(np.unique(f))


def _cluster_strips(
    ax: Any, truth: np.ndarray, order: np.ndarray, found: np.ndarray | None, n_found: int, title: str, known: bool
) -> tuple[Any, list]:
    """The true clusters as a colour strip along the top and the left (the title above), the
    silos' ticks; the colour bar's axes and the clusters the strips show."""
    from matplotlib.colors import ListedColormap
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    divider = make_axes_locatable(ax)
    top = divider.append_axes("top", size=0.16, pad=0.04)
    left = divider.append_axes("left", size=0.16, pad=0.04)
    cax = divider.append_axes("right", size=0.22, pad=0.12)
    kinds = sorted(np.unique(truth).tolist())
    index = {k: i for i, k in enumerate(kinds)}
    palette = ListedColormap([OKABE_ITO[i % len(OKABE_ITO)] for i in range(len(kinds))], name="true_clusters")
    codes = np.array([index[k] for k in truth[order].tolist()])
    for strip, data in ((top, codes[None, :]), (left, codes[:, None])):
        strip.imshow(data, cmap=palette, vmin=-0.5, vmax=len(kinds) - 0.5, aspect="auto", interpolation="nearest")
        strip.set_label("true clusters" if known else "clusters found")
        for spine in strip.spines.values():
            spine.set_visible(False)
    top.set_xticks([])
    top.set_yticks([])
    top.set_title(title, fontsize=10, pad=6)
    left.set_xticks([])
    left.set_ylabel("silo")
    ax.tick_params(left=False, labelleft=False)
    by = "found" if found is not None else "true"
    size = len(order)
    if size <= 40:
        names = [str(s) for s in order]
        ax.set_xticks(np.arange(size), names, fontsize=8 if size > 16 else 9)
        left.set_yticks(np.arange(size), names, fontsize=8 if size > 16 else 9)
        ax.set_xlabel(f"silo (ordered by {by} cluster)")
    else:  # too many to number: name the found clusters' blocks instead
        left.set_yticks([])
        ax.set_xticks([])
        ax.set_xlabel(f"{size} silos, ordered by {by} cluster")
        if found is not None and n_found <= 20:
            f = np.asarray(found)[order]
            blocks = list(dict.fromkeys(f.tolist()))
            ax.set_xticks([float(np.mean(np.flatnonzero(f == k))) for k in blocks], [str(k) for k in blocks])
            ax.set_xlabel(f"{size} silos, ordered by found cluster (ticks: found cluster)")
    return cax, kinds


def _colour_bar(fig: Any, im: Any, cax: Any, label: str, norm: Any, cut: Cut | None) -> None:
    """The colour bar, with the cut marked (a white line with a black rim) and labelled."""
    bar = fig.colorbar(im, cax=cax)
    bar.set_label(label, fontsize=9)
    if cut is not None:
        ticks = _cut_ticks(norm.vmin, cut.value, norm.vmax)
        bar.set_ticks([*ticks, cut.value])
        bar.set_ticklabels([f"{t:g}" for t in ticks] + [cut.label])
        for lw, colour in ((4.0, "black"), (2.0, "white")):
            cax.axhline(cut.value, color=colour, lw=lw)


def _heatmap_notes(
    fig: Any, D: np.ndarray, kinds: list, known: bool, found: np.ndarray | None, n_found: int, cut: Cut | None
) -> None:
    """What the boxes, the strip, the cut and grey mean, under the map, with the clusters' legend."""
    import textwrap

    from matplotlib.patches import Patch

    notes = []
    if found is not None:
        notes.append(f"boxes: the {n_found} cluster{'s' if n_found != 1 else ''} found")
    if known:
        notes.append(f"strip: the {len(kinds)} true cluster{'s' if len(kinds) != 1 else ''}")
    else:
        notes.append("no known groups of silos: the strip repeats the clusters found")
    if cut is not None:
        notes.append("below the cut (line on the colour bar) silos may share a cluster")
    if (~np.isfinite(D) & ~np.eye(len(D), dtype=bool)).any():
        notes.append("grey: not measured")
    if len(kinds) <= 10:
        handles = [Patch(color=OKABE_ITO[i % len(OKABE_ITO)], label=str(k)) for i, k in enumerate(kinds)]
        word = "true cluster" if known else "cluster found"
        fig.legend(handles=handles, title=word, loc="lower center", ncol=len(kinds), fontsize=8, title_fontsize=8,
                   frameon=False, bbox_to_anchor=(0.5, 0.0))  # fmt: skip
    y = 0.065 if len(kinds) <= 10 else 0.01
    fig.text(0.5, y, textwrap.fill(" · ".join(notes), 95), ha="center", va="bottom", fontsize=8.5)


def _round_axis(ax, rounds) -> None:
    """Integer round ticks, every round when there are few; a lone round is centred."""
    from matplotlib.ticker import MaxNLocator

    rounds = sorted(set(int(r) for r in rounds))
    if not rounds:
        return
    if len(rounds) <= 12:
        ax.set_xticks(rounds)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(rounds[0] - 0.5, rounds[-1] + 0.5)
    ax.set_xlabel("round")


def accuracy_curves(
    rounds: list[int],
    per_silo: np.ndarray,
    truth: np.ndarray | None,
    title: str,
    path: Path,
    found: np.ndarray | None = None,
) -> None:
    """Average and worst silo accuracy per round, each silo faintly: see `accuracy_figure`."""
    fig = accuracy_figure(rounds, per_silo, truth, title, found)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def accuracy_figure(
    rounds: list[int], per_silo: np.ndarray, truth: np.ndarray | None, title: str, found: np.ndarray | None = None
):
    """Average and worst silo accuracy per round (`per_silo`: rounds × silos, fractions; NaN:
    the silo had not arrived yet), with each silo faintly, coloured by true cluster (by the
    cluster `found` where the data set knows none). Markers on every round and integer round
    ticks: one round still shows."""
    plt = _pyplot()
    import warnings

    from matplotlib.lines import Line2D

    per_silo = np.asarray(per_silo, dtype=float).reshape(len(rounds), -1)
    word = "true cluster" if truth is not None else "cluster found"
    truth = np.asarray(truth if truth is not None else found)
    kinds = sorted(np.unique(truth).tolist())
    index = {k: i for i, k in enumerate(kinds)}
    x = np.asarray(rounds, dtype=float)
    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    for silo in range(per_silo.shape[1]):
        colour = OKABE_ITO[index[truth[silo].item()] % len(OKABE_ITO)] if silo < len(truth) else "0.5"
        ax.plot(x, 100 * per_silo[:, silo], color=colour, alpha=0.5, lw=0.8, marker="o", ms=3.5)
    with warnings.catch_warnings():  # a round where no silo was evaluated yet: NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        average, worst = np.nanmean(per_silo, 1), np.nanmin(per_silo, 1)
    ax.plot(x, 100 * average, color="black", lw=2, marker="o", ms=7, label="average")
    ax.plot(x, 100 * worst, color="black", lw=1.5, ls="--", marker="v", ms=7, mfc="white", label="worst silo")
    _round_axis(ax, rounds)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{title}\n(small dots: each silo, coloured by its {word})", fontsize=10)
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()[0]
    if len(kinds) <= 8:
        handles += [
            Line2D([], [], color=OKABE_ITO[i % len(OKABE_ITO)], marker="o", ms=3.5, lw=0.8, label=f"{word} {k}")
            for i, k in enumerate(kinds)
        ]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def coinciding(curves: Mapping[str, tuple[list[int], np.ndarray]]) -> dict[str, str]:
    """{method: the earlier method whose curve it repeats exactly} (same rounds, same values
    to 1e-9): the legend says so, as such curves hide each other."""
    same: dict[str, str] = {}
    names = list(curves)
    for i, name in enumerate(names):
        r, v = curves[name]
        for other in names[:i]:
            ro, vo = curves[other]
            if other not in same and list(r) == list(ro) and np.allclose(v, vo, rtol=0, atol=1e-9, equal_nan=True):
                same[name] = other
                break
    return same


def method_curves(
    panels: list[tuple[str, Mapping[str, tuple[list[int], np.ndarray]]]],
    path: Path,
    ylabel: str = "average silo test accuracy (%)",
) -> None:
    """Each method's curve per round, one panel per data set: see `methods_figure`."""
    fig = methods_figure(panels, ylabel)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def methods_figure(
    panels: list[tuple[str, Mapping[str, tuple[list[int], np.ndarray]]]], ylabel: str = "average silo test accuracy (%)"
):
    """One panel per data set `(title, {method label: (rounds, values)})`, every method on the
    same axes (panels without curves are left out). Methods that coincide stay visible: each
    has its own colour, marker and line style, its points are shifted a little sideways (all
    of them together span at most 0.36 of a round), and the legend names the method a curve
    repeats. Integer round ticks; one round still shows."""
    plt = _pyplot()

    panels = [(t, c) for t, c in panels if c]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.6 * max(len(panels), 1), 4.4), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels):
        same = coinciding(curves)
        n = len(curves)
        width = min(0.36, 0.06 * (n - 1))
        all_rounds: set[int] = set()
        for i, (name, (rounds, values)) in enumerate(curves.items()):
            shift = (i / (n - 1) - 0.5) * width if n > 1 else 0.0
            ax.plot(
                np.asarray(rounds, dtype=float) + shift,
                values,
                color=OKABE_ITO[i % len(OKABE_ITO)],
                marker=MARKERS[i % len(MARKERS)],
                ls=LINESTYLES[i % len(LINESTYLES)],
                lw=1.6,
                ms=7,
                mec="black",
                mew=0.6,
                label=f"{name} (same as {same[name]})" if name in same else name,
                zorder=3 + i % 2,
                markevery=max(1, len(rounds) // 25),
            )
            all_rounds.update(int(r) for r in rounds)
        _round_axis(ax, all_rounds)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best", framealpha=0.9)
    fig.tight_layout()
    return fig
