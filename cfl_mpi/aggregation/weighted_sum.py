"""Σ_c n_c θ_c whose bits do not depend on the order the terms come in, so that a server can
fold each silo's update into its cluster's sum as it arrives (holding none of them) and still
give the same model run after run, whatever the network did.

Floating-point addition is not associative: a running float64 sum depends on the order of its
terms. Here each term x = n_c · θ_c (in float64) is cut into parts, the multiples of 2^146,
2^115, …, 2^-9 and 2^-40, 31 bits apart (x's bits below 2^-40 are dropped: a function of x
alone), and each part goes into its own float64 accumulator. Every part is an integer
multiple of its accumulator's quantum below 2^31 quanta, so each accumulator's sum stays
exact (below 2^53 quanta) for up to 2^22 terms: addition of such numbers is associative.
This is the binned ("pre-rounded") summation of Demmel & Nguyen, Fast reproducible
floating-point summation, ARITH 2013, with fixed bins; no library offers it for numpy
arrays, hence by hand. An honest model's terms lie below 2^50, where every part above 2^22 is
zero: those bins are skipped (the same bits), and a term needs 3 bins' work, not 7.

The mean Σ n_c θ_c / Σ n_c is then within 2^-41 of the exact one in every coordinate (below
a float32 ulp of any weight above 2^-16 in magnitude), rounded once to float32.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["WeightedSum"]

Model = dict[str, np.ndarray]

# The quanta 2^e of the accumulators, coarsest first, and for each the constant
# C = 1.5 · 2^(e + 52): (r + C) − C rounds r to the nearest multiple of 2^e when |r| < 2^(e + 51).
# The coarsest holds any finite float32 times a count below 2^31 (< 2^160).
_EXPONENTS = (146, 115, 84, 53, 22, -9, -40)
_SHIFTERS = tuple(1.5 * 2.0 ** (e + 52) for e in _EXPONENTS)
# The bins a term below 2^50 needs: its parts in the coarser ones are 0 (below 2^52 they are;
# the margin covers the rounding of the peak that decides it)
_HONEST = 3
MAX_TERMS = 1 << 22


class WeightedSum:
    """One cluster's Σ_c n_c θ_c over the floating tensors of `like`, and Σ_c n_c.

    `add` in any order gives the same `mean()`, bit for bit. Integer buffers (a batch counter)
    cannot be averaged: the mean takes them from the term with the largest n_c, the lowest
    `key` among equals (the caller's silo index), which is again order-free. A lone term is
    its own mean, exactly (a cluster of one keeps its silo's model)."""

    def __init__(self, like: Model) -> None:
        self.names = list(like)  # the mean keeps the state's order: a message's layout follows it
        self.dtypes = {name: a.dtype for name, a in like.items()}
        self.shapes = {name: a.shape for name, a in like.items()}
        # per floating tensor, one accumulator a bin (coarsest first), None until a part lands there
        self.bins: dict[str, list[np.ndarray | None]] = {
            name: [None] * len(_EXPONENTS) for name, a in like.items() if np.issubdtype(a.dtype, np.floating)
        }
        self.weights: list[float] = []  # the n_c, summed by math.fsum: exactly rounded, in any order
        self.first: tuple[Model, float, dict[str, float]] | None = None  # the lone term, until a second comes
        self.largest: tuple[float, int] | None = None  # (n, -key) of the term whose integer buffers are kept
        self.integers: Model = {}

    def add(self, model: Model, n: float, key: int) -> None:
        """Fold n · θ in (n: a sample count, or any positive weight). ValueError if n is not
        positive or a value is not finite (nothing is folded then)."""
        if not 0 < n < math.inf:
            raise ValueError(f"a weight must be positive and finite, got {n}")
        if len(self.weights) >= MAX_TERMS:
            raise ValueError(f"at most {MAX_TERMS} terms sum exactly")
        peaks = {name: float(np.abs(model[name]).max(initial=0.0)) * n for name in self.bins}
        if not all(np.isfinite(peak) for peak in peaks.values()):  # NaN and inf reach the max
            raise ValueError(f"{', '.join(k for k, v in peaks.items() if not np.isfinite(v))}: values not finite")
        if self.largest is None or (n, -key) > self.largest:
            self.largest = (n, -key)
            self.integers = {name: np.array(a, copy=True) for name, a in model.items() if name not in self.bins}
        self.weights.append(n)
        if len(self.weights) == 1:
            self.first = (model, n, peaks)
            return
        if self.first is not None:
            self._fold(*self.first)
            self.first = None
        self._fold(model, n, peaks)

    def _fold(self, model: Model, n: float, peaks: dict[str, float]) -> None:
        """`peaks`: each tensor's largest |n · θ|, which decides the bins it needs."""
        for name in self.bins:
            term = np.multiply(model[name], float(n), dtype=np.float64)  # exact for integer n < 2^29
            first = len(_EXPONENTS) - _HONEST if peaks[name] < 2.0**50 else 0
            part = np.empty_like(term)
            bins = self.bins[name]
            for i in range(first, len(_EXPONENTS)):
                np.add(term, _SHIFTERS[i], out=part)
                part -= _SHIFTERS[i]  # the multiple of this bin's quantum nearest to what is left
                term -= part  # exact: what is left for the finer bins
                acc = bins[i]
                if acc is None:
                    bins[i] = part.copy()
                else:
                    acc += part

    def mean(self) -> Model:
        """Σ n_c θ_c / Σ n_c in each floating tensor's dtype; the integer buffers of the largest term."""
        if not self.weights:
            raise ValueError("the mean of no terms")
        if self.first is not None:  # a lone term
            return {name: np.array(a, copy=True) for name, a in self.first[0].items()}
        out, total_weight = {}, math.fsum(self.weights)
        for name in self.names:
            if name not in self.bins:
                out[name] = self.integers[name]
                continue
            total = np.zeros(self.shapes[name])
            for acc in self.bins[name]:  # coarsest first: a fixed order of exact sums
                if acc is not None:
                    total += acc
            out[name] = (total / total_weight).astype(self.dtypes[name])
        return out
