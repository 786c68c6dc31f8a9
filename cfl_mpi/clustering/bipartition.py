"""CFL maths (Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2021).

- pairwise cosine similarity of the silos' weight updates (Eq. 40);
- the bipartition minimising the largest cross-cluster similarity (Eq. 33, Algorithm 1);
- the split criterion of Algorithm 5 (mean update small, some update large);
- a seeded orthonormal transform P shared by the silos, under which similarities, norms
  and averages survive (Eq. 41-42), so the server never sees a raw update;
- the parameter tree that records the splits and routes a newcomer to a leaf (Sec. IV-C,
  Algorithm 4).

Pure numpy; the strategy wrapper decides when to call what.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "pairwise_cosine",
    "optimal_bipartition",
    "max_cross_similarity",
    "update_norms",
    "should_split",
    "OrthonormalTransform",
    "orthonormal_transform",
    "ClusterTree",
]


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm; an all-zero row stays zero (similar to nothing)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def pairwise_cosine(updates: np.ndarray) -> np.ndarray:
    """alpha_ij = <dθ_i, dθ_j> / (|dθ_i| |dθ_j|) for (m, P) stacked updates (Eq. 40).

    Computed in float64 and clipped to [-1, 1]; a zero update has similarity 0 to all.
    """
    u = _unit_rows(np.asarray(updates, dtype=np.float64))
    return np.clip(u @ u.T, -1.0, 1.0)


def optimal_bipartition(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1: split {0..m-1} in two so that max_{i in c1, j in c2} S_ij is minimal (Eq. 33).

    Pairs are visited in decreasing similarity and their groups merged until two groups
    remain (single linkage on S, i.e. Kruskal on the maximum spanning tree minus its
    weakest edge), which is exactly optimal: every bipartition is crossed by some tree edge,
    and here every cross pair is weaker than the last edge merged. Complete linkage on -S,
    as in the authors' notebook, is not equivalent and can miss the optimum.
    Returns (c1, c2) as sorted index arrays, c1 holding index 0. O(m^2 log m).
    """
    S = np.asarray(S, dtype=np.float64)
    m = S.shape[0]
    if S.shape != (m, m) or m < 2:
        raise ValueError(f"S must be square with at least 2 rows, got shape {S.shape}")
    sym = (S + S.T) / 2.0
    rows, cols = np.triu_indices(m, k=1)
    order = np.argsort(-sym[rows, cols], kind="stable")
    parent = np.arange(m)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    groups = m
    for e in order:
        if groups == 2:
            break
        a, b = root(rows[e]), root(cols[e])
        if a != b:
            parent[max(a, b)] = min(a, b)
            groups -= 1
    roots = np.array([root(i) for i in range(m)])
    in_first = roots == roots[0]
    return np.flatnonzero(in_first), np.flatnonzero(~in_first)


def max_cross_similarity(S: np.ndarray, c1: np.ndarray, c2: np.ndarray) -> float:
    """alpha_cross^max = max_{i in c1, j in c2} S_ij, for the gamma_max test of Algorithm 5."""
    return float(np.asarray(S)[np.ix_(c1, c2)].max())


def update_norms(updates: np.ndarray, weights: np.ndarray | None = None) -> tuple[float, float]:
    """(norm of the mean update, largest single update norm) for should_split.

    Algorithm 5 uses the plain mean (weights=None); Algorithm 2 weighs by |D_i|.
    """
    u = np.asarray(updates, dtype=np.float64)
    mean = np.average(u, axis=0, weights=weights)
    return float(np.linalg.norm(mean)), float(np.linalg.norm(u, axis=1).max())


def should_split(mean_update_norm: float, max_update_norm: float, n_members: int, eps1: float, eps2: float) -> bool:
    """Split criterion of Algorithm 5 line 14 (Eq. 30-31), plus more than 2 members.

    A small mean update says the cluster is near a stationary point of its joint objective;
    a large single update says some member is not: the members are incongruent.
    """
    return mean_update_norm < eps1 and max_update_norm > eps2 and n_members > 2


@dataclass(frozen=True)
class OrthonormalTransform:
    """x -> B D Π x: a seeded permutation Π, seeded signs D, then a block-diagonal rotation B.

    Each factor is orthogonal, so the product P is: inner products and norms are kept
    (Eq. 41) and P is linear, so P^-1 of the average of P dθ_i is the average of the dθ_i
    (Eq. 42). B repeats one Haar-random b x b rotation over the first dim - dim % b
    coordinates and uses a second one for the remainder. Cost O(dim * b) time and
    O(dim + b^2) memory, where a dense P would need dim^2 entries.
    """

    dim: int
    perm: np.ndarray
    signs: np.ndarray
    block: np.ndarray
    tail: np.ndarray

    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.shape[-1] != self.dim:
            raise ValueError(f"last axis must have length {self.dim}, got shape {x.shape}")
        return x.astype(np.result_type(x.dtype, np.float32), copy=False)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """P x for one vector (dim,) or a stack (m, dim); what a silo sends."""
        x = self._check(x)
        y = x[..., self.perm] * self.signs.astype(x.dtype)
        b, split = self.block.shape[0], self.dim - self.tail.shape[0]
        head = y[..., :split].reshape(*y.shape[:-1], -1, b) @ self.block.T.astype(x.dtype)
        y[..., :split] = head.reshape(*y.shape[:-1], split)
        y[..., split:] = y[..., split:] @ self.tail.T.astype(x.dtype)
        return y

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """P^-1 y = Pᵀ y; what a silo applies to the averaged update it receives."""
        y = self._check(y).copy()
        b, split = self.block.shape[0], self.dim - self.tail.shape[0]
        head = y[..., :split].reshape(*y.shape[:-1], -1, b) @ self.block.astype(y.dtype)
        y[..., :split] = head.reshape(*y.shape[:-1], split)
        y[..., split:] = y[..., split:] @ self.tail.astype(y.dtype)
        x = np.empty_like(y)
        x[..., self.perm] = y * self.signs.astype(y.dtype)
        return x


def _haar_orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    """A Haar-distributed n x n orthogonal matrix (QR of a Gaussian, signs fixed by R)."""
    if n == 0:
        return np.zeros((0, 0))
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def orthonormal_transform(dim: int, seed: int, block: int = 64) -> OrthonormalTransform:
    """The shared P of Algorithm 5 line 3, built from a seed only the silos know.

    The paper proposes a seeded permutation of the indices. A permutation alone leaves
    every value visible (only its position is hidden), so signs are flipped and blocks of
    `block` coordinates are rotated as well: the server sees mixtures, not weights. It is
    obfuscation, not encryption: P is fixed for the run and linear, so a server that learns
    enough (x, P x) pairs could recover it. Every silo must build P with the same numpy
    version (numpy does not promise identical random streams across versions).
    """
    if dim < 1 or block < 1:
        raise ValueError(f"dim and block must be >= 1, got dim={dim}, block={block}")
    rng = np.random.default_rng(seed)
    b = min(block, dim)
    return OrthonormalTransform(
        dim=dim,
        perm=rng.permutation(dim),
        signs=rng.choice(np.array([-1.0, 1.0]), size=dim),
        block=_haar_orthogonal(rng, b),
        tail=_haar_orthogonal(rng, dim % b),
    )


@dataclass
class _Node:
    """One (intermediate) cluster c_v of the parameter tree."""

    id: int
    parent: int | None
    members: list[int]
    children: list[int] = field(default_factory=list)
    split_round: int | None = None
    references: np.ndarray | None = None


class ClusterTree:
    """CFL parameter tree (Sec. IV-C): one node per cluster CFL ever formed.

    Node 0 is the root holding every silo. A split records the round and, on each child,
    the pre-split updates of the child's members (Δ_e, Eq. 43), stored as unit float32 rows
    since only their directions matter for routing. Models live with the caller, keyed by
    node id. The leaves are the current clusters.
    """

    def __init__(self, silos: list[int]) -> None:
        self._nodes: list[_Node] = [_Node(id=0, parent=None, members=sorted(int(s) for s in silos))]

    def members(self, node: int) -> list[int]:
        """The silos of cluster c_node."""
        return list(self._nodes[node].members)

    def children(self, node: int) -> list[int]:
        """The two children of a split node, or [] for a leaf."""
        return list(self._nodes[node].children)

    def leaves(self) -> list[int]:
        """Ids of the current clusters, ascending."""
        return [n.id for n in self._nodes if not n.children]

    def split(
        self,
        node: int,
        left: list[int],
        right: list[int],
        round: int,
        left_updates: np.ndarray,
        right_updates: np.ndarray,
    ) -> tuple[int, int]:
        """Bipartition leaf `node` into two new leaves; returns their ids (left, right).

        left_updates/right_updates are the members' updates computed from the node's model
        in the splitting round, one row per member, kept for routing newcomers.
        """
        parent = self._nodes[node]
        if parent.children:
            raise ValueError(f"node {node} is already split")
        lo, hi = sorted(int(s) for s in left), sorted(int(s) for s in right)
        if not lo or not hi or set(lo) & set(hi) or sorted(lo + hi) != parent.members:
            raise ValueError(f"{lo} and {hi} are not a bipartition of node {node}: {parent.members}")
        ids = []
        for side, updates in ((lo, left_updates), (hi, right_updates)):
            refs = np.atleast_2d(np.asarray(updates, dtype=np.float64))
            if refs.shape[0] != len(side):
                raise ValueError(f"expected {len(side)} reference updates, got {refs.shape[0]}")
            child = _Node(
                id=len(self._nodes), parent=node, members=side, references=_unit_rows(refs).astype(np.float32)
            )
            self._nodes.append(child)
            ids.append(child.id)
        parent.children = ids
        parent.split_round = int(round)
        return ids[0], ids[1]

    def route(self, update: np.ndarray | Callable[[int], np.ndarray]) -> int:
        """Algorithm 4: descend from the root to a leaf for a newcomer; returns the leaf id.

        At each split node v the newcomer goes to the child holding the single most similar
        cached update (max cosine); a tie goes to the second child, as written. `update` is either
        a callable giving the newcomer's update trained from node v's model (the algorithm
        as written), or one array used at every level (cheaper: trained once, from the root).
        """
        node = 0
        while self._nodes[node].children:
            u = np.asarray(update(node) if callable(update) else update, dtype=np.float64)
            u = _unit_rows(u.reshape(1, -1))[0].astype(np.float32)
            first, second = self._nodes[node].children
            score = {c: float((self._nodes[c].references @ u).max()) for c in (first, second)}
            node = first if score[first] > score[second] else second
        return node

    def add_silo(self, silo: int, leaf: int) -> None:
        """Record a newcomer as a member of `leaf` and of every node above it."""
        if self._nodes[leaf].children:
            raise ValueError(f"node {leaf} is not a leaf")
        if silo in self._nodes[0].members:
            raise ValueError(f"silo {silo} is already in the tree")
        node: int | None = leaf
        while node is not None:
            self._nodes[node].members.append(int(silo))
            self._nodes[node].members.sort()
            node = self._nodes[node].parent

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """Structure (JSON) and cached updates (arrays), for a checkpoint."""
        refs = {f"references{n.id}": n.references for n in self._nodes if n.references is not None}
        return self.to_dict(), refs

    @classmethod
    def from_state(cls, structure: dict, references: dict[str, np.ndarray]) -> ClusterTree:
        tree = cls([])
        tree._nodes = [
            _Node(
                id=n["id"],
                parent=n["parent"],
                members=list(n["members"]),
                children=list(n["children"]),
                split_round=n["split_round"],
                references=references.get(f"references{n['id']}"),
            )
            for n in structure["nodes"]
        ]
        return tree

    def to_dict(self) -> dict:
        """The tree's structure as plain JSON types; the cached updates are left out (large)."""
        return {
            "nodes": [
                {
                    "id": n.id,
                    "parent": n.parent,
                    "children": list(n.children),
                    "members": list(n.members),
                    "split_round": n.split_round,
                    "n_references": 0 if n.references is None else int(n.references.shape[0]),
                }
                for n in self._nodes
            ]
        }
