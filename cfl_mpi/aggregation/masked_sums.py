"""A round's masked updates summed by cluster (`aggregation.secure`): what the server of a
secure round holds in place of the updates, and the cluster models it gives, as `ClusterSums`
gives them for plain ones. Each word vector is a silo's n_c·θ_c and n_c in fixed point with
masks that cancel in the cluster's sum (privacy/masking.py), so the sum is FedAvg's numerator
and denominator (EMD-CFL Alg. 1, line 21) to within the fixed point's resolution. Under
`privacy.dp: distributed` each vector is instead a silo's clipped update plus its share of the
noise, and 1: the sum is DP-FedAvg's noised sum (McMahan et al. 2018, Alg. 1)."""

from __future__ import annotations

import numpy as np

from ..privacy.masking import decode
from .rules import Decision, Model


def float_names(like: Model) -> list[str]:
    """The floating arrays of a model, in the order their values travel as words (sorted by
    name, so both parties agree whatever order their state dicts keep)."""
    return sorted(name for name, a in like.items() if np.issubdtype(a.dtype, np.floating))


def weighted_words(model: Model, n_samples: int) -> np.ndarray:
    """n·θ, every floating value of `model` in `float_names` order, then n (float64): what a
    silo masks and sends."""
    values = [np.asarray(model[name], dtype=np.float64).ravel() * n_samples for name in float_names(model)]
    return np.concatenate([*values, [float(n_samples)]])


def noised_words(model: Model, start: Model, noise: np.ndarray) -> np.ndarray:
    """Δ + noise, Δ = θ − s every floating value of `model` less its `start` in `float_names`
    order (clipped before: `clip_update`), then 1 (float64): what a silo masks and sends under
    `privacy.dp: distributed`."""
    deltas = [(model[n].astype(np.float64) - start[n]).ravel() for n in float_names(model)]
    return np.concatenate([*deltas, [0.0]]) + np.append(noise, 1.0)


def word_count(like: Model) -> int:
    """The words of one masked update of a model shaped as `like`."""
    return sum(like[name].size for name in float_names(like)) + 1


class MaskedSums:
    """Each cluster's sum of masked words modulo 2^64, one masked update at a time; no single
    update is readable, nor kept."""

    def __init__(
        self, round: int, clusters: np.ndarray, starts: dict[int, Model], noised: dict[int, list[int]] | None = None
    ) -> None:
        self.round, self.clusters, self.starts = round, clusters, starts
        # `privacy.dp: distributed`: each cluster's members that mask (its W), else None
        self.noised = noised
        self.sums: dict[int, np.ndarray] = {}
        self.summed_into: dict[int, int] = {}  # silo → the cluster its update went to

    def add(self, silo: int, words: np.ndarray) -> None:
        """Silo `silo`'s masked words (int64 bits of uint64), into its cluster's sum."""
        k = int(self.clusters[silo])
        unsigned = words.view(np.uint64)
        if k in self.sums:
            self.sums[k] += unsigned  # numpy's unsigned arrays wrap: the sum modulo 2^64
        else:
            self.sums[k] = unsigned.copy()
        self.summed_into[silo] = k

    def unmask(self, silo: int, words: np.ndarray) -> None:
        """Take `words` (uint64), what silo `silo` added for a neighbour whose masked update never
        came, out of its cluster's sum."""
        self.sums[int(self.clusters[silo])] -= words

    def averages(self, clusters: np.ndarray, first_counts: dict[int, int]) -> tuple[dict[int, Model], list[Decision]]:
        """What every silo continues from: each cluster's Σ n_c θ_c / Σ n_c, its integer
        buffers (a batch counter: no mean) from its first member's start; a cluster without
        updates keeps its members' starts. The counts stay unknown (`first_counts` gains none)."""
        if moved := [c for c, k in self.summed_into.items() if clusters[c] != k]:
            raise ValueError(f"silos {moved[:5]} moved to another cluster after their updates were summed")
        models = {}
        for k, words in self.sums.items():
            if self.noised is None:
                first = min(c for c, j in self.summed_into.items() if j == k)
                models[k] = self._mean(decode(words), self.starts[first])
            else:
                models[k] = self._noised_mean(decode(words), [self.starts[c] for c in self.noised[k]])
        decisions = [Decision(c, self.round, "accepted") for c in sorted(self.summed_into)]
        return {c: models.get(int(clusters[c]), self.starts[c]) for c in range(len(clusters))}, decisions

    @staticmethod
    def _noised_mean(values: np.ndarray, starts: list[Model]) -> Model:
        """DP-FedAvg's cluster model with the fixed denominator: s̄ + (Σ_c clip(Δ_c) + noise) / W,
        s̄ the mean start of the W members that mask (`dp_fedavg`'s, from a masked sum)."""
        out, start = dict(starts[0]), 0
        for name in float_names(starts[0]):
            shape, size = starts[0][name].shape, starts[0][name].size
            mean_start = np.mean([s[name].astype(np.float64) for s in starts], axis=0)
            total = values[start : start + size].reshape(shape)
            out[name] = (mean_start + total / len(starts)).astype(starts[0][name].dtype)
            start += size
        return out

    @staticmethod
    def _mean(values: np.ndarray, like: Model) -> Model:
        numerators, total = values[:-1], values[-1]
        if not total >= 1:
            raise ValueError(f"a cluster's masked sample counts sum to {total:g}: a member's words were not its update")
        out = dict(like)
        start = 0
        for name in float_names(like):
            size = like[name].size
            out[name] = (numerators[start : start + size] / total).reshape(like[name].shape).astype(like[name].dtype)
            start += size
        return out
