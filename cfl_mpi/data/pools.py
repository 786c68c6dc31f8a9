"""The public image sources the benchmarks are built from (scikit-learn's digits, MNIST,
CIFAR-10), and what the recipes that split one into silos share (`PooledData`): the folder of
its files, their download by rank 0, the pools read once per process, and each silo's shard.

Every silo reads the source's (shared) files and keeps only its own shard; rank 0 alone
downloads what is missing, before any silo reads.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

import cfl_mpi.data.cifar as cifar  # by full name: `from . import` would name the package, whose
import cfl_mpi.data.digits as digits  # registry imports this module
import cfl_mpi.data.mnist as mnist

from ..settings import ConfigError, derived
from .images import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MNIST_MEAN,
    MNIST_STD,
    Images,
    Stats,
    kept_images,
)
from .partition import group_shard, holdout_split
from .spec import DataConfig, DataFacts, SiloData

PREPARE_HINT = "`python -m cfl_mpi.commands.prepare` with the same config and --set options"


@dataclass(frozen=True, eq=False)  # each source one object: hashed by identity (the pools' cache)
class Source:
    """One public source of images: how to read it, where a download puts it, and what it is."""

    label: str  # in messages: "MNIST"
    native_size: int  # the edge of the images a silo keeps by default (digits are upsampled to MNIST's 28)
    colour: bool
    stats: tuple[Stats, Stats]  # (mean, std) of its pixels, for the models trained from scratch
    split_sizes: dict[str, int]  # images per split
    # (root, split) → (images uint8 or float, labels); None: the embedded digits, no files
    load_split: Callable[[Path, str], tuple[np.ndarray, np.ndarray]] | None = None
    missing_files: Callable[[Path, tuple[str, ...]], list[str]] | None = None
    download: Callable[[Path], None] | None = None
    folder: str = "."  # where in data.root a download puts the files
    layout: str = ""  # the layouts of data.root its reader accepts, as the fix names them
    rotate_expand: bool = False  # rotated: the frame grows to hold the turned image (the authors' CIFAR-10)
    resize_first: bool = False  # rotated: upsampled before it is turned (the 8x8 digits)


DIGITS = Source(
    "scikit-learn's digits", 28, False, (MNIST_MEAN, MNIST_STD), {"all": digits.POOL_SIZE}, resize_first=True
)
MNIST = Source(
    "MNIST",
    28,
    False,
    (MNIST_MEAN, MNIST_STD),
    mnist.SPLIT_SIZES,
    mnist.load_split_uint8,
    mnist.missing_files,
    mnist.download,
    "MNIST/raw",
    mnist.LAYOUT,
)
CIFAR10 = Source(
    "CIFAR-10",
    32,
    True,
    (CIFAR10_MEAN, CIFAR10_STD),
    cifar.SPLIT_SIZES,
    cifar.load_split,
    cifar.missing_files,
    cifar.download,
    cifar.FOLDER,
    cifar.LAYOUT,
    rotate_expand=True,  # the authors' rotcifar10.ipynb: expand=True; rotmnist.ipynb: not
)


@dataclass(frozen=True)
class PooledData(DataConfig):
    """A recipe that copies a source's pool once per group of silos and cuts each copy into
    the group's silos' shards (the rotated and backdoor sets)."""

    SOURCES: ClassVar[dict[str, Source]]  # the source each of the recipe's names reads

    name: str
    # True cluster of each group (rotation or backdoor group); null: every group is its own
    # cluster. The "min" rotations [-3, -1, 1, 3] are one cluster: [0, 0, 0, 0].
    group_clusters: list[int] | None = None
    # Folder of the source's files: MNIST's IDX files (`<root>/MNIST/raw` or `<root>`),
    # CIFAR-10's pickled batches (`<root>/cifar-10-batches-py`); the digits need none.
    root: str | None = None
    # MNIST and CIFAR-10: "train" trains on the training split and tests on the test split;
    # "test" uses the test split alone as the whole data set (split by test_fraction).
    pool: Literal["train", "test"] = "train"
    # Rank 0 (or `python -m cfl_mpi.commands.prepare`) downloads missing MNIST/CIFAR-10 files.
    download: bool = True
    # Fraction of the pool held out for testing (digits, or MNIST/CIFAR-10 with pool: test).
    test_fraction: float = 0.2
    # Fraction of each silo's training share used as its validation set (the paper's 10 %).
    val_fraction: float = 0.1
    # What a model trained from scratch is fed: "standardised" pixels (minus the source's mean,
    # over its deviation), or "raw" ones in [0, 1], as IFCA's code feeds its MLP.
    pixels: Literal["standardised", "raw"] = "standardised"
    # Edge of the square images each silo keeps in memory; null: the source's own (28 for the
    # digits and MNIST, 32 for CIFAR-10). The model resizes batches to model.input_size on the device.
    image_size: int = derived()

    def __post_init__(self) -> None:
        if self.image_size is None:
            object.__setattr__(self, "image_size", self.source.native_size)

    @property
    def source(self) -> Source:
        return self.SOURCES[self.name]

    def group_count(self) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------ the config check
    def pooled_problems(self, facts: DataFacts, groups: int, fix: str) -> list[str]:
        """The checks every pooled recipe shares; `fix` says what a silo count must be."""
        problems = []
        if facts.silos % groups:
            problems.append(f"silos: {fix}")
        if self.group_clusters is not None and not (
            len(self.group_clusters) == groups and all(k >= 0 for k in self.group_clusters)
        ):
            problems.append(
                f"data.group_clusters: give one non-negative cluster label per group ({groups} for {self.name}), "
                f"got {self.group_clusters}"
            )
        for name in ("test_fraction", "val_fraction"):
            frac = getattr(self, name)
            if not 0.0 < frac < 1.0:
                problems.append(f"data.{name}: must lie strictly between 0 and 1, got {frac}")
        if self.image_size < 8:
            problems.append(f"data.image_size: must be at least 8, got {self.image_size}")
        if self.source.load_split is not None and self.root is None:
            problems.append(f"data.root: {self.name} needs the folder of its files (set data.root)")
        return problems

    # ------------------------------------------------------------------ what the run knows
    def group_sizes(self, silos: int) -> list[int]:
        """Silos per group, in group order (silos are group-major)."""
        return [silos // self.group_count()] * self.group_count()

    def groups(self, silos: int) -> np.ndarray:
        return np.repeat(np.arange(self.group_count()), self.group_sizes(silos))

    def num_classes(self) -> int:
        return 10

    def position(self, silos: int, silo: int) -> tuple[int, int, int]:
        """(group, index of the silo within its group, silos in the group)."""
        sizes = self.group_sizes(silos)
        group = int(self.groups(silos)[silo])
        return group, silo - sum(sizes[:group]), sizes[group]

    def pool_sizes(self, seed: int) -> tuple[int, int]:
        """(training pool, test pool) images, known without reading the files."""
        sizes = self.source.split_sizes
        if self.source.load_split is not None and self.pool == "train":
            return sizes["train"], sizes["test"]
        total = sizes["all"] if self.source.load_split is None else sizes["test"]
        n_test = len(holdout_split(total, self.test_fraction, seed)[1])
        return total - n_test, n_test

    def normalisation(self, imagenet: bool) -> tuple[Stats, Stats]:
        """The usual input statistics: ImageNet's for the torchvision models (what their weights
        expect), the source's own for a model trained from scratch."""
        if imagenet:
            return IMAGENET_MEAN, IMAGENET_STD
        return (0.0, 1.0) if self.pixels == "raw" else self.source.stats

    # ------------------------------------------------------------------ files
    def root_folder(self) -> Path:
        if self.root is None:
            raise ConfigError(f"data.root: {self.name} needs the folder of its files (set data.root)")
        return Path(self.root)

    def _splits(self) -> tuple[str, ...]:
        return ("test",) if self.pool == "test" else ("train", "test")

    def _missing(self) -> list[str]:
        assert self.source.missing_files is not None
        return self.source.missing_files(self.root_folder(), self._splits())

    def check(self, facts: DataFacts) -> None:
        """ConfigError when the files cannot be found (nor downloaded)."""
        if self.source.load_split is None:
            return
        missing = self._missing()
        if missing and not self.download:
            raise ConfigError(
                f"data.root: {self.source.label} files {', '.join(missing)} not found in {self.root} "
                f"({give_root(self.source.layout)}; or fetch them with {PREPARE_HINT} and data.download: true "
                "where a network is reachable)"
            )

    def prepare(self, facts: DataFacts) -> None:
        """Download what is missing (rank 0 only, before any silo reads); ConfigError if impossible."""
        if self.source.load_split is None:
            return
        self.check(facts)
        missing = self._missing()
        if not missing:
            return
        root = self.root_folder()
        try:
            _download(self.source, root, missing)
        except Exception as err:  # torchvision raises RuntimeError/URLError without a network
            raise ConfigError(
                f"data.root: {self.source.label} is not in {root} and downloading it failed ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else 'no detail'}) ({give_root(self.source.layout)}; or run "
                f"{PREPARE_HINT} where a network is reachable and copy that data.root to this machine)"
            ) from None

    # ------------------------------------------------------------------ one silo's shard
    def pools(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(train images, train labels, test images, test labels) before any group's transform."""
        with _SPLITS_LOCK:
            return _held_out_pools(
                self.source, Path(self.root) if self.root else None, self.pool, self.test_fraction, seed
            )

    def shard(self, group: int, local: int, per_group: int, n_train: int, n_test: int, seed: int):
        """The silo's part of its group's copy of the pools (partition.py)."""
        return group_shard(group, local, per_group, n_train, n_test, self.val_fraction, seed)

    def build(self, silo: int, facts: DataFacts) -> SiloData:
        """Silo `silo` (0-based) keeps only its own shard, transformed as its group prescribes."""
        x_tr, y_tr, x_te, y_te = self.pools(facts.seed)
        group, local, per_group = self.position(facts.silos, silo)
        pool_tr, pool_te = self.group_pools(group, y_tr, y_te)
        part = self.shard(group, local, per_group, len(pool_tr), len(pool_te), facts.seed)
        train, val, test = pool_tr[part.train], pool_tr[part.val], pool_te[part.test]
        train = self.kept_for_training(group, train, facts.seed)
        mean, std = self.normalisation(facts.imagenet)
        channels = self.sample_shape(facts.imagenet)[0]

        def prepare(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> Images:
            return kept_images(self.look(group, x[idx], y[idx]), mean, std, channels)

        backdoor = None
        if self.backdoor_targets(facts.silos)[silo]:
            backdoor = self.backdoor_test(x_te[test], y_te[test], mean, std, channels)
        return SiloData(
            group,
            prepare(x_tr, y_tr, train),
            y_tr[train],
            prepare(x_tr, y_tr, val),
            y_tr[val],
            prepare(x_te, y_te, test),
            y_te[test],
            *(backdoor or (None, None)),
        )

    def group_pools(self, group: int, y_train: np.ndarray, y_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The indices of the pools a group's copy holds (all, by default)."""
        return np.arange(len(y_train)), np.arange(len(y_test))

    def kept_for_training(self, group: int, train: np.ndarray, seed: int) -> np.ndarray:
        """The part of a silo's training shard its group keeps (all, by default)."""
        return train

    def look(self, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The group's distribution of the images, at data.image_size, in [0, 1]."""
        raise NotImplementedError

    def backdoor_test(
        self, images: np.ndarray, labels: np.ndarray, mean: Stats, std: Stats, channels: int
    ) -> tuple[Images, np.ndarray] | None:
        """A target silo's backdoored test set: (images, labels)."""
        return None


def give_root(layout: str) -> str:
    """The fix every missing-data error names first: the option that points at the files, and
    the layouts the readers accept there (the same for a job, `prepare`, `compare`, `reproduce`)."""
    return f"give the folder that holds the files with --set data.root=DIR, where {layout}"


def _download(source: Source, root: Path, missing: list[str]) -> None:
    """Download into a fresh temporary folder and move the missing files into place only
    once all of them arrived. torchvision creates its folders before it fetches anything, so
    downloading in place would leave an empty `data.root` tree (or a truncated archive that a
    later run would take for data) behind a failed download; the temporary folder goes away
    either way. It is made in the nearest existing ancestor of `root`, so the final move is
    a rename on the same file system."""
    assert source.download is not None
    anchor = next(p for p in (root, *root.parents) if p.is_dir())
    with tempfile.TemporaryDirectory(prefix=".cfl_mpi-download-", dir=anchor) as tmp:
        source.download(Path(tmp))
        fetched = Path(tmp) / source.folder
        absent = [name for name in missing if not (fetched / name).is_file()]
        if absent:
            raise FileNotFoundError(f"the download did not bring {', '.join(absent)}")
        folder = root / source.folder
        folder.mkdir(parents=True, exist_ok=True)
        for name in missing:
            shutil.move(fetched / name, folder / name)


_SPLITS_LOCK = threading.Lock()  # the silo threads that start together wait for one decoding


@functools.lru_cache(maxsize=4)
def _decoded_split(source: Source, root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    assert source.load_split is not None
    images, labels = source.load_split(root, split)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


@functools.lru_cache(maxsize=4)
def _held_out_pools(
    source: Source, root: Path | None, pool: str, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pools, made once per process and read-only: the silos of a rank share them (decoding
    MNIST's gzip or copying the held-out pool out of the split again would add to each of
    hundreds of silos' start; docs/research/PERFORMANCE.md, "Data pools")."""
    if source.load_split is None:
        images, labels = digits.load_digit_pool()
    else:
        assert root is not None
        if pool == "train":
            return (*_decoded_split(source, root, "train"), *_decoded_split(source, root, "test"))
        images, labels = _decoded_split(source, root, "test")
    train_idx, test_idx = holdout_split(len(labels), test_fraction, seed)
    pools = images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]
    for array in pools:
        array.flags.writeable = False
    return pools
