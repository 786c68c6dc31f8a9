"""Class matching (beyond the paper): an entry of W compares two silos' embeddings class by class.

The paper's W[c][c'] is W1 between the whole samples, so two silos that differ only in how
many examples of each class they hold (label skew) differ in W as much as silos whose images
differ (a scanner, a rotation): on label-skewed sites W is a continuum and the groups a
feature shift makes drown in it (docs/methods/emdcfl.md, "Class by class"). Matched, the
server compares, for every class both clouds and c's validation sample hold, the same number
of rows of each (the smallest of the three counts, drawn at random): the clouds then hold
one class mix, and what W1 still sees is how the classes' embeddings differ, P(z | y), which
label skew leaves alone.

τ is taken on the same rows: W1(Z_{c|c}R, V_{c|c}R) on c's matched training and validation
rows (Algorithm 1, line 14 at the matched sizes), so line 16 cancels W1's sampling bias at the
size the pair was measured at. The entry is then rescaled to the silo's full sample, whose
noise is the unit the robust rule cuts row c in: an empirical W1 between samples of sizes a
and b strays like (1/a + 1/b)^(1/2), so an entry measured on m rows a side is divided by
((2/m) / (1/n + 1/|V|))^(1/2).
"""

from __future__ import annotations

import numpy as np

MIN_ROWS = 2
"""A pair whose clouds share fewer matched rows is not compared (W stays NaN): an assignment
needs two rows a side to be a distance at all."""


def matched_rows(
    own: np.ndarray, cross: np.ndarray, val: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the labels of Z_{c|c} (`own`), Z_{c'|c} (`cross`) and c's validation sample (`val`):
    the rows of each to compare, the same count of every class, min of the three counts,
    drawn at random; classes ordered, each class's rows in draw order."""
    picks: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
    for label in np.intersect1d(np.intersect1d(own, cross), val):
        rows = [np.flatnonzero(labels == label) for labels in (own, cross, val)]
        m = min(len(r) for r in rows)
        for taken, r in zip(picks, rows):
            taken.append(rng.choice(r, m, replace=False))
    empty = np.zeros(0, dtype=np.int64)
    own_rows, cross_rows, val_rows = (np.concatenate(p) if p else empty for p in picks)
    return own_rows, cross_rows, val_rows


def to_full_sample(m: int, n: int, v: int) -> float:
    """The factor an entry measured on m rows a side is divided by to be in the units of a
    silo's noise, measured for its n training and v validation embeddings (module docstring)."""
    return float(np.sqrt((2.0 / m) / (1.0 / n + 1.0 / v)))
