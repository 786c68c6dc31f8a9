"""CFL (Sattler, Müller, Samek, IEEE TNNLS 2021: Algorithm 5).

FedAvg rounds; after each round every current cluster c is checked: with more than 2
members, a mean update of norm < ε1 and some member update of norm > ε2 (and past the
warm-up), c is split into the bipartition minimising the largest cross-cluster cosine
similarity of the members' updates (Algorithm 1, `optimal_bipartition`), unless γ_max
rejects it (Eq. 36). The update of silo i is Δθ_i = θ_i(t) − θ_start(i), against the model
the runtime handed it this round. Splits recurse over rounds and are recorded in a
`ClusterTree` (Sec. IV-C) that routes a late silo to a leaf (Algorithm 4).

Optional transform P (Eq. 41-42): silos send P·θ and apply P⁻¹ to every model they receive;
the server clusters and averages in the transformed space (P is orthogonal and linear, so
norms, cosine similarities and averages are those of the original updates) and never sees
a trained model. Cluster labels are the tree's node ids.
"""

from __future__ import annotations

import numpy as np

from ...clustering.bipartition import (
    ClusterTree,
    OrthonormalTransform,
    max_cross_similarity,
    optimal_bipartition,
    orthonormal_transform,
    pairwise_cosine,
    should_split,
    update_norms,
)
from ..base import Halves, RunFacts, ServerRound, SiloProtocol, Strategy
from . import CflConfig


def flat(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The floating-point arrays of a model state, concatenated in their (fixed) order.

    Integer buffers (e.g. batch-norm counters) are neither parameters nor averaged."""
    return np.concatenate([a.reshape(-1) for a in arrays.values() if np.issubdtype(a.dtype, np.floating)])


def unflat(vector: np.ndarray, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of `flat`: the floating arrays of `like` refilled from `vector`, the others kept."""
    out, at = {}, 0
    for name, a in like.items():
        if np.issubdtype(a.dtype, np.floating):
            out[name] = vector[at : at + a.size].reshape(a.shape).astype(a.dtype)
            at += a.size
        else:
            out[name] = a
    return out


def transform_for(s: CflConfig, run_seed: int, dim: int) -> OrthonormalTransform:
    """The P every silo builds identically from the config (Algorithm 5, line 3)."""
    seed = (
        s.transform_seed
        if s.transform_seed is not None
        else int(np.random.SeedSequence([run_seed, 41]).generate_state(1)[0])
    )
    return orthonormal_transform(dim, seed)


class Cfl(Strategy[CflConfig]):
    """Server half: the parameter tree, split checks after every round."""

    def __init__(self, params: CflConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.S = np.full((run.silos, run.silos), np.nan)
        self.artifacts = {"S": self.S}
        self.checks: list[dict] = []
        self.splits: list[dict] = []

    def initial_clusters(self) -> np.ndarray:
        # The root holds the silos present from round 1; late silos are routed down the
        # tree when they first train (Algorithm 4) and follow the root's model until then.
        self.tree = ClusterTree([c for c in range(self.run.silos) if self.run.join_round(c) == 1])
        return np.zeros(self.run.silos, dtype=np.int64)  # the root, node 0

    def after_training(self, ctx: ServerRound) -> np.ndarray:
        s = self.params
        if s.transform and ctx.round == 1:
            return self.clusters  # θ(0) was sent untransformed: round-1 updates are not comparable
        silos = sorted(ctx.updates)
        deltas = np.stack([flat(ctx.updates[c]) - flat(ctx.start_models[c]) for c in silos])
        S = pairwise_cosine(deltas)
        self.S[np.ix_(silos, silos)] = S
        row = {c: i for i, c in enumerate(silos)}
        for c in silos:
            if c not in self.tree.members(0):  # a late silo's first update routes it (Algorithm 4)
                leaf = self.tree.route(deltas[row[c]])
                self.tree.add_silo(c, leaf)
                self.clusters[c] = leaf
        for leaf in self.tree.leaves():
            members = [c for c in self.tree.members(leaf) if c in row]
            if not members:
                continue
            idx = [row[c] for c in members]
            mean_norm, max_norm = update_norms(deltas[idx])
            complete = len(members) == len(self.tree.members(leaf))  # a split needs every member's update
            check = {
                "round": ctx.round,
                "node": leaf,
                "members": members,
                "mean_norm": round(mean_norm, 6),
                "max_norm": round(max_norm, 6),
                "split": False,
            }
            self.checks.append(check)
            if (
                ctx.round <= s.warmup_rounds
                or not complete
                or not should_split(mean_norm, max_norm, len(members), s.eps1, s.eps2)
            ):
                continue
            sub = S[np.ix_(idx, idx)]
            c1, c2 = optimal_bipartition(sub)
            cross = max_cross_similarity(sub, c1, c2)
            check["max_cross_similarity"] = round(cross, 6)
            if not s.gamma_max < np.sqrt((1.0 - cross) / 2.0):
                continue  # Eq. 36: the split is not trusted at this noise level
            left, right = [members[i] for i in c1], [members[i] for i in c2]
            ids = self.tree.split(
                leaf, left, right, ctx.round, deltas[[row[c] for c in left]], deltas[[row[c] for c in right]]
            )
            for child, side in zip(ids, (left, right)):
                self.clusters[side] = child
            check["split"] = True
            self.splits.append(
                {
                    "round": ctx.round,
                    "node": leaf,
                    "children": list(ids),
                    "left": left,
                    "right": right,
                    "mean_norm": check["mean_norm"],
                    "max_norm": check["max_norm"],
                    "max_cross_similarity": check["max_cross_similarity"],
                }
            )
        return self.clusters

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict]:
        structure, references = self.tree.state()
        return {"clusters": self.clusters, "S": self.S, **references}, {
            "tree": structure,
            "checks": self.checks,
            "splits": self.splits,
        }

    def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        self.clusters = arrays["clusters"].astype(np.int64)
        self.S[...] = arrays["S"]
        self.tree = ClusterTree.from_state(meta["tree"], arrays)
        self.checks, self.splits = meta["checks"], meta["splits"]

    def report(self) -> dict:
        s = self.params
        return {
            "cfl": {
                "eps1": s.eps1,
                "eps2": s.eps2,
                "warmup_rounds": s.warmup_rounds,
                "gamma_max": s.gamma_max,
                "transform": s.transform,
                "splits": self.splits,
                "tree": self.tree.to_dict(),
                "checks": self.checks,
            }
        }


class CflSilo(SiloProtocol[CflConfig]):
    """Silo half: nothing beyond training, unless the transform P is on."""

    def __init__(self, params: CflConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self._p: OrthonormalTransform | None = None

    def _transform(self, arrays: dict[str, np.ndarray]) -> OrthonormalTransform:
        if self._p is None:
            self._p = transform_for(self.params, self.run.seed, flat(arrays).size)
        return self._p

    def encode_update(self, arrays: dict[str, np.ndarray], round: int) -> dict[str, np.ndarray]:
        if not self.params.transform:
            return arrays
        return unflat(self._transform(arrays).forward(flat(arrays)), arrays)

    def decode_model(self, arrays: dict[str, np.ndarray], round: int) -> dict[str, np.ndarray]:
        if not self.params.transform or round == 0:  # θ(0) is public and untransformed
            return arrays
        return unflat(self._transform(arrays).inverse(flat(arrays)), arrays)


HALVES = Halves(Cfl, CflSilo)
