"""PACFL (Vahidian et al., AAAI 2023: Algorithm 1, Eq. 2/3, Algorithm 2).

One shot: every silo summarises its raw training inputs by the top-p left singular vectors
of each class, stacked (`class_subspace_basis`), and sends them once (`principal_vectors`).
The server builds the proximity matrix A of principal angles in degrees (Eq. 3: sum,
Eq. 2: smallest) and cuts average-linkage agglomerative clustering at distance β.

The exchange runs right after a silo's first local training (round 1, unless it is sampled
or arrives later): every silo starts that round from the same model as its singleton
cluster, so clustering before or after that training gives the same aggregate, and the
silos need no extra hook. The maths lives in `principal_angles.py`.
"""

from __future__ import annotations

import numpy as np

from ...channel import SERVER
from ...clustering.principal_angles import (
    class_subspace_basis,
    extend_proximity_matrix,
    hierarchical_clusters,
    place_new_silos,
    proximity_matrix,
)
from ...wire.payload import Payload, array
from ..base import Halves, RunFacts, ServerRound, SiloProtocol, SiloRound, Strategy
from . import PacflConfig


class PrincipalVectors(Payload, kind="principal_vectors"):
    """silo → server, once: PACFL's signature U_c, the top-p left singular vectors of each
    class of its inputs, stacked as columns: a row per input value (the server fixes their
    number to the run's input size, and bounds the columns by p and the classes)."""

    basis: np.ndarray = array("float64", "input_dim", "columns")

    def problem(self) -> str | None:
        return None if self.basis.shape[1] else "a basis of no column (at least one)"


def merge_heights(A: np.ndarray) -> list[float]:
    """Average-linkage merge distances of A, ascending: β between heights i-1 and i gives
    m - i clusters. Reported so that β can be chosen for a new data set."""
    if A.shape[0] < 2:
        return []
    D = (A + A.T) / 2.0
    np.fill_diagonal(D, 0.0)
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    return [round(float(h), 4) for h in linkage(squareform(D, checks=False), method="average")[:, 2]]


class Pacfl(Strategy[PacflConfig]):
    """Server half: a silo's signature arrives once, the first round it trains. The first
    batch is clustered with β (Algorithm 1); later arrivals — late silos, or silos first
    sampled later under partial participation — are placed by Algorithm 2 without moving
    anyone already placed."""

    def __init__(self, params: PacflConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.order: list[int] = []  # silos with a signature, in arrival order
        self.bases: list[np.ndarray] = []  # their signatures, in that order
        self.A = np.full((run.silos, run.silos), np.nan)
        self.artifacts = {"A": self.A}

    def modules(self) -> tuple[str, ...]:
        return (*super().modules(), "scipy.cluster.hierarchy", "scipy.linalg")  # the clusters; the bases' orth

    def initial_clusters(self) -> np.ndarray:
        return np.arange(self.run.silos, dtype=np.int64)  # nobody measured yet

    def settled(self, ctx: ServerRound) -> bool:
        return not ctx.first  # no signature to come this round

    def after_training(self, ctx: ServerRound) -> np.ndarray:
        new = sorted(c for c in ctx.first if c in ctx.participants)  # not those that left
        if not new:
            return self.clusters
        s = self.params
        most = s.p * (self.run.num_classes if s.per_class else 1)
        rows = self.run.input_dim  # the columns: 1 (its problem) to `most` (the size limit)
        expect = PrincipalVectors.expect(ctx.round, input_dim=rows, max_elements=rows * most)
        received: dict[int, np.ndarray] = {}
        for msg in ctx.channel.recv_each(new, lambda _: expect, ctx.leaving):  # a silo may leave instead
            received[msg.sender] = PrincipalVectors.of(msg).basis
        new = [c for c in new if c in received]
        if new:
            self.add_signatures([received[c] for c in new], new)
        return self.clusters

    def add_signatures(self, bases: list[np.ndarray], silos: list[int]) -> None:
        """Cluster the first batch (Algorithm 1), place later ones (Algorithm 2)."""
        s = self.params
        if not self.order:
            compact = proximity_matrix(bases, s.measure)
            labels = hierarchical_clusters(compact, s.beta)
        else:
            compact = extend_proximity_matrix(self.A[np.ix_(self.order, self.order)], self.bases, bases, s.measure)
            labels = place_new_silos(compact, self.clusters[self.order], s.beta)
        self.order += silos
        self.bases += bases
        self.A[np.ix_(self.order, self.order)] = compact
        self._set_clusters(labels)

    def _set_clusters(self, labels: np.ndarray) -> None:
        """Labels of the silos with a signature; every other silo alone, under a label of its own."""
        clusters = np.empty(self.run.silos, dtype=np.int64)
        clusters[self.order] = labels
        rest = [c for c in range(self.run.silos) if c not in self.order]
        clusters[rest] = labels.max() + 1 + np.arange(len(rest))
        self.clusters = clusters

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {"clusters": self.clusters, "A": self.A}
        arrays.update({f"basis{c}": b for c, b in zip(self.order, self.bases)})
        return arrays, {"order": self.order}

    def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        self.clusters = arrays["clusters"].astype(np.int64)
        self.A[:] = arrays["A"]
        self.order = list(meta["order"])
        self.bases = [arrays[f"basis{c}"] for c in self.order]

    def report(self) -> dict:
        s = self.params
        if not self.bases:
            return {}
        return {
            "pacfl": {
                "p": s.p,
                "per_class": s.per_class,
                "measure": s.measure,
                "beta": s.beta,
                "signature_columns": [int(b.shape[1]) for b in self.bases],
                "arrival_order": self.order,
                "merge_heights": merge_heights(self.A[np.ix_(self.order, self.order)]),
            }
        }


class PacflSilo(SiloProtocol[PacflConfig]):
    """Silo half: once, the top-p left singular vectors of its training inputs per class."""

    def after_training(self, ctx: SiloRound) -> None:
        if not ctx.first:
            return
        s = self.params
        x = ctx.data.x_train.reshape(len(ctx.data.y_train), -1)
        basis = class_subspace_basis(x, ctx.data.y_train if s.per_class else None, s.p)
        ctx.channel.send(SERVER, PrincipalVectors(np.ascontiguousarray(basis)), ctx.round)


HALVES = Halves(Pacfl, PacflSilo, (PrincipalVectors.KIND,))
