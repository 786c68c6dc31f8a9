"""Figures a person would rather look at than read: distances and accuracy over rounds."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Pairwise(NamedTuple):
    """How to show one strategy's pairwise matrix."""

    label: str                # colour-bar label
    similarity: bool = False  # higher is closer
    directed: bool = False    # row = whose model, column = whose data (EMD-CFL's W)


#: the pairwise matrices strategies leave in their artifacts, by artifact name
PAIRWISE = {
    "W": Pairwise("W[c][c'] = W1 − τ_c", directed=True),        # EMD-CFL
    "A": Pairwise("A[i][j]: principal angles (degrees)"),       # PACFL
    "S": Pairwise("cosine similarity of the updates", similarity=True),  # CFL
    "D": Pairwise("D[a][b] = Wp by FedWaD"),                   # FedWaD clustering
}


def distance_heatmap(W: np.ndarray, truth: np.ndarray, title: str, path: Path,
                     label: str = "W[c][c'] = W1 − τ_c", similarity: bool = False, directed: bool = True) -> None:
    """Pairwise-distance heat map with the true clusters marked on both axes (cf. Figs. 14–17).

    Green is close: low values of a distance, high values of a `similarity`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    shown = np.ma.masked_invalid(W)
    im = ax.imshow(shown, cmap="RdYlGn" if similarity else "RdYlGn_r", interpolation="nearest")
    fig.colorbar(im, ax=ax, label=label)
    bounds = np.flatnonzero(np.diff(truth)) + 0.5
    for b in bounds:
        ax.axhline(b, color="black", lw=0.8)
        ax.axvline(b, color="black", lw=0.8)
    ax.set_xlabel("silo c' (data)" if directed else "silo j")
    ax.set_ylabel("silo c (model)" if directed else "silo i")
    ax.set_title(f"{title}\n(black lines: true clusters; grey: not measured)", fontsize=10)
    ax.set_facecolor("0.85")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def accuracy_curves(rounds: list[int], per_silo: np.ndarray, truth: np.ndarray, title: str, path: Path) -> None:
    """Average and worst silo accuracy per round, with each silo faintly, coloured by true cluster
    (NaN: the silo had not arrived yet)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colours = plt.get_cmap("tab10")
    for silo in range(per_silo.shape[1]):
        ax.plot(rounds, 100 * per_silo[:, silo], color=colours(int(truth[silo]) % 10), alpha=0.25, lw=0.8)
    ax.plot(rounds, 100 * np.nanmean(per_silo, 1), color="black", lw=2, label="average")
    ax.plot(rounds, 100 * np.nanmin(per_silo, 1), color="black", lw=1.5, ls="--", label="worst silo")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{title}\n(thin lines: silos, coloured by true cluster)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
