"""The partition rules of the EMD-CFL paper's data sets (§4.1): which samples a silo owns.

Rotated and backdoor sets: the training pool is replicated once per group (rotation or
backdoor group); each copy is split evenly across the silos of that group (silos are
group-major: silos 0..k-1 hold group 0, ...). The held-out test pool is split the same way,
so each silo is tested on its own group's distribution; with `data.silo_images` every silo
takes that many images instead (`sized_shard`). PACS: each domain's images are
split across that domain's silos, and each silo's share 80/10/10 (`split_shard`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def true_clusters(silos: int, groups: int) -> np.ndarray:
    """Ground-truth cluster of every silo: its rotation group."""
    return np.arange(silos) // (silos // groups)


@dataclass(frozen=True)
class SiloShard:
    """Indices into the training and test pools, and the silo's rotation group."""

    group: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def shard(
    silo: int, silos: int, groups: int, n_train_pool: int, n_test_pool: int, val_fraction: float, seed: int
) -> SiloShard:
    """Silo `silo`'s share: a disjoint slice of its group's shuffled copy of each pool."""
    per_group = silos // groups
    group, local = divmod(silo, per_group)
    return group_shard(group, local, per_group, n_train_pool, n_test_pool, val_fraction, seed)


def group_shard(
    group: int, local: int, per_group: int, n_train_pool: int, n_test_pool: int, val_fraction: float, seed: int
) -> SiloShard:
    """The `local`-th of `per_group` disjoint slices of group `group`'s shuffled copy of each pool.

    Indices point into the group's pools (the backdoor sets give some groups only some classes).
    """
    rng = np.random.default_rng([seed, 7, group])  # one shuffle per group's copy
    train_part = np.array_split(rng.permutation(n_train_pool), per_group)[local]
    test_part = np.array_split(rng.permutation(n_test_pool), per_group)[local]
    n_val = max(1, int(round(val_fraction * len(train_part))))
    return SiloShard(group, np.sort(train_part[n_val:]), np.sort(train_part[:n_val]), np.sort(test_part))


def sized_shard(
    group: int, local: int, silo_images: int, n_train_pool: int, n_test_pool: int, val_fraction: float, seed: int
) -> SiloShard:
    """The `local`-th silo of group `group` when every silo holds `silo_images` training-pool
    images (IFCA's shape) and a test share of the same proportion as the pools'.

    The group's silos take consecutive slices of a shuffled copy of each pool; when a copy is
    used up, the next silos slice a fresh shuffle of it. So the silos stay disjoint while the
    group fits in the pool, no silo holds an image twice, and beyond that each image is held
    by at most ⌈silos per group / silos per shuffle⌉ silos of its group (`images_shared_by`).
    """
    n_test = max(1, round(silo_images * n_test_pool / n_train_pool))
    train_part = _slice_of_shuffles([seed, 17, group, 0], local, silo_images, n_train_pool)
    test_part = _slice_of_shuffles([seed, 17, group, 1], local, n_test, n_test_pool)
    n_val = max(1, int(round(val_fraction * silo_images)))
    return SiloShard(group, np.sort(train_part[n_val:]), np.sort(train_part[:n_val]), np.sort(test_part))


def _slice_of_shuffles(key: list[int], local: int, size: int, n_pool: int) -> np.ndarray:
    """Slice `local` of size `size` when slices are cut from successive shuffles of the pool,
    as many whole slices from each as fit."""
    per_shuffle = n_pool // size
    shuffle, slot = divmod(local, per_shuffle)
    order = np.random.default_rng([*key, shuffle]).permutation(n_pool)
    return order[slot * size : (slot + 1) * size]


def images_shared_by(per_group: int, silo_images: int, n_pool: int) -> int:
    """The most silos of one group that hold the same image under `sized_shard` (1: disjoint)."""
    return -(-per_group // (n_pool // silo_images))


def holdout_split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split one labelled set into a training pool and a test pool (seeded, same on every rank)."""
    perm = np.random.default_rng([seed, 3]).permutation(n)
    n_test = int(round(test_fraction * n))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def split_shard(
    group: int, local: int, per_group: int, n_pool: int, test_fraction: float, val_fraction: float, seed: int
) -> SiloShard:
    """PACS's rule: a group's (domain's) own images, split disjointly across its silos, each
    silo's slice split into test, validation and training parts by the given fractions."""
    rng = np.random.default_rng([seed, 11, group])
    part = np.array_split(rng.permutation(n_pool), per_group)[local]
    n_test = max(1, int(round(test_fraction * len(part))))
    n_val = max(1, int(round(val_fraction * len(part))))
    return SiloShard(
        group, np.sort(part[n_test + n_val :]), np.sort(part[n_test : n_test + n_val]), np.sort(part[:n_test])
    )


def dealt_shard(
    group: int, local: int, per_group: int, n_pool: int, test_fraction: float, val_fraction: float, seed: int
) -> SiloShard:
    """The authors' PACS rule (`pacs.ipynb`): the last `test_fraction` of the group's shuffled
    images is its test pool, the rest dealt round-robin to its silos (the test pool likewise),
    and each silo's share split into training and (`val_fraction`) validation parts."""
    rng = np.random.default_rng([seed, 13, group])
    order = rng.permutation(n_pool)
    n_test = int(test_fraction * n_pool)
    rest, test = order[: n_pool - n_test], order[n_pool - n_test :]
    mine = rest[local::per_group]
    n_val = max(1, int(np.ceil(val_fraction * len(mine))))  # train_test_split rounds the test part up
    mine = rng.permutation(mine)
    return SiloShard(group, np.sort(mine[n_val:]), np.sort(mine[:n_val]), np.sort(test[local::per_group]))
