"""The public benchmarks as data sets: a source (scikit-learn's digits, MNIST, CIFAR-10, PACS)
under a federation recipe (rotated, backdoor, per domain).

| data.name | groups (true clusters by default) | silos | files in data.root |
|---|---|---|---|
| rotated_digits | one per rotation | multiple of #rotations | none (scikit-learn's digits) |
| rotated_mnist, rotated_cifar10 | one per rotation | multiple of #rotations | MNIST IDX / CIFAR-10 batches |
| backdoor_mnist, backdoor_cifar10 | 3 (backdoor.py; group 0 is the target) | multiple of 3 | MNIST / CIFAR-10 |
| pacs | one per domain | sum of data.domain_silos | `<root>/<domain>/<class>/*.jpg` |

Every silo reads the data set's (shared) files and keeps only its own shard (`build`); rank 0
alone downloads what is missing (`prepare`), before any silo reads.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

# the package's modules by their full names: `from . import` would name the package, whose
# registry imports this module
import cfl_mpi.data.backdoor as backdoor
import cfl_mpi.data.cifar as cifar
import cfl_mpi.data.digits as digits
import cfl_mpi.data.mnist as mnist
import cfl_mpi.data.pacs as pacs

from ..settings import ConfigError, derived
from .images import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MNIST_MEAN,
    MNIST_STD,
    resize,
    rotate,
    to_model_input,
    unit,
)
from .partition import dealt_shard, group_shard, holdout_split, images_shared_by, sized_shard, split_shard
from .spec import DataFacts, DataParams, SiloData

# Data sets (the EMD-CFL paper, §4.1 and Appendix C): the rotated sets replicate their pool once
# per angle; the backdoor sets split their silos evenly across 3 groups (group 0 is the target
# of the backdoor); PACS gives each domain its own silos.
ROTATED_DATA = ("rotated_digits", "rotated_mnist", "rotated_cifar10")
BACKDOOR_DATA = ("backdoor_mnist", "backdoor_cifar10")
BENCHMARKS = (*ROTATED_DATA, *BACKDOOR_DATA, "pacs")
PACS_DOMAINS = ("photo", "art_painting", "cartoon", "sketch")
# Edge of the images a silo keeps when data.image_size is null: the data set's own size
# (scikit-learn's 8x8 digits are upsampled to MNIST's 28; PACS's 227 is cut to the paper's 224).
NATIVE_IMAGE_SIZE = {
    "rotated_digits": 28,
    "rotated_mnist": 28,
    "backdoor_mnist": 28,
    "rotated_cifar10": 32,
    "backdoor_cifar10": 32,
    "pacs": 224,
}


# The public benchmarks of the EMD-CFL paper (§4.1): a source (scikit-learn's digits, MNIST, CIFAR-10,
# PACS) under a federation recipe (rotated, backdoor, per domain) that splits its images into silos
# and says which groups of silos form the true clusters.
@dataclass(frozen=True)
class BenchmarkData(DataParams):
    # The data set: rotated_* copy their pool once per rotation, backdoor_* split the silos
    # evenly across 3 groups (group 0 the backdoor's target), pacs gives each domain its own silos.
    name: Literal[
        "rotated_digits", "rotated_mnist", "rotated_cifar10", "backdoor_mnist", "backdoor_cifar10", "pacs"
    ] = "rotated_digits"
    # Rotation angles in degrees, one group per angle (the paper's 0/90/180/270, and its
    # Appendix E.9 variants). rotated_* only.
    rotations: list[float] = field(default_factory=lambda: [0.0, 90.0, 180.0, 270.0])
    # True cluster of each group (rotation, backdoor group or PACS domain); null: every group is
    # its own cluster. The "min" rotations [-3, -1, 1, 3] are one cluster: [0, 0, 0, 0].
    group_clusters: list[int] | None = None
    # Black pixels added around each image before it is rotated (rotated_* only). The authors'
    # rotated CIFAR-10 "Min" set adds 2 (the authors' `rotcifar10.ipynb`, docs/FIDELITY.md); everything else 0.
    rotation_border: int = 0
    # Folder of the data set's files: MNIST's IDX files (`<root>/MNIST/raw` or `<root>`),
    # CIFAR-10's pickled batches (`<root>/cifar-10-batches-py`), PACS (`<root>/<domain>/<class>/*.jpg`).
    root: str | None = None
    # MNIST and CIFAR-10: "train" trains on the training split and tests on the test split;
    # "test" uses the test split alone as the whole data set (split by test_fraction).
    pool: Literal["train", "test"] = "train"
    # Rank 0 (or `python -m cfl_mpi.prepare`) downloads missing MNIST/CIFAR-10 files.
    download: bool = True
    # Fraction of the pool held out for testing (digits, or MNIST/CIFAR-10 with pool: test).
    test_fraction: float = 0.2
    # Fraction of each silo's training share used as its validation set (the paper's 10 %).
    # PACS: see pacs_split.
    val_fraction: float = 0.1
    # PACS: "paper": each silo's images split 80/10/10 (EMD-CFL paper, §4.1); "authors": the last
    # 20 % of each shuffled domain is its test pool, the rest dealt round-robin to the domain's
    # silos, each silo's share split 80/20 into training and validation (the authors' `pacs.ipynb`).
    pacs_split: Literal["paper", "authors"] = "paper"
    # rotated_*: images in every silo's share of the training pool (training + validation),
    # IFCA's shape (its rotated MNIST gives each of 2,400 clients 100). null: each group's copy
    # of the pool split evenly across its silos. Silos of a group stay disjoint while they fit
    # in the pool; beyond it they share images (partition.sized_shard says how).
    silo_images: int | None = None
    # Edge of the square images each silo keeps in memory; null: the data set's own
    # (NATIVE_IMAGE_SIZE). The model resizes batches to model.input_size on the device.
    image_size: int = derived()
    # PACS: the domains used, how many silos each gets (domain_silos; paper: 3 photo, 4 art,
    # 4 cartoon, 7 sketch = 18 silos), and the fewest images a silo may hold (min_silo_images;
    # paper: at least 500).
    domains: list[str] = field(default_factory=lambda: list(PACS_DOMAINS))
    domain_silos: list[int] = field(default_factory=lambda: [3, 4, 4, 7])
    min_silo_images: int = 500

    def __post_init__(self) -> None:
        if self.image_size is None:
            object.__setattr__(self, "image_size", NATIVE_IMAGE_SIZE[self.name])

    def root_folder(self) -> Path:
        """data.root, which every data set but rotated_digits needs."""
        if self.root is None:
            raise ConfigError(f"data.root: {self.name} needs the folder of its files (set data.root)")
        return Path(self.root)

    # ------------------------------------------------------------------ the config check
    def problems(self, facts: DataFacts) -> Iterator[str]:
        """Silo counts per data set (the EMD-CFL paper's, §4.1), fractions, sizes and folders."""
        silos = facts.silos
        if self.name in ROTATED_DATA:
            groups = len(self.rotations)
            if groups < 1:
                yield "data.rotations: give at least one angle, e.g. [0, 90, 180, 270]"
                return
            if silos % groups:
                yield (
                    f"silos: {silos} silos cannot be split evenly across {groups} rotations "
                    f"(set silos to a multiple of {groups})"
                )
            if self.rotation_border < 0:
                yield f"data.rotation_border: must be 0 or more pixels, got {self.rotation_border}"
        elif self.name in BACKDOOR_DATA:
            groups = 3
            if silos % groups:
                yield (
                    f"silos: {self.name} splits its silos evenly across 3 groups, {silos} is not a multiple "
                    f"of 3 (set silos to a multiple of 3; the paper uses {30 if self.name == 'backdoor_mnist' else 15})"
                )
        else:  # pacs
            groups = len(self.domains)
            if not (groups >= 1 and len(set(self.domains)) == groups and set(self.domains) <= set(PACS_DOMAINS)):
                yield f"data.domains: give distinct PACS domains out of {', '.join(PACS_DOMAINS)}, got {self.domains}"
            if not (len(self.domain_silos) == groups and all(n >= 1 for n in self.domain_silos)):
                yield f"data.domain_silos: give one positive silo count per domain ({groups}), got {self.domain_silos}"
            if silos != sum(self.domain_silos):
                yield (
                    f"silos: data.domain_silos {self.domain_silos} adds up to {sum(self.domain_silos)} silos but "
                    f"silos is {silos} (set silos to {sum(self.domain_silos)} or change data.domain_silos)"
                )
            if self.min_silo_images < 1:
                yield f"data.min_silo_images: must be at least 1, got {self.min_silo_images}"
        if self.silo_images is not None:
            if self.name not in ROTATED_DATA:
                yield (
                    f"data.silo_images: only the rotated data sets take a fixed number of "
                    f"images per silo, not {self.name} (remove the key)"
                )
            if self.silo_images < 2:
                yield (
                    f"data.silo_images: a silo needs at least 2 images (training and validation), "
                    f"got {self.silo_images}"
                )
        if self.group_clusters is not None and not (
            len(self.group_clusters) == groups and all(k >= 0 for k in self.group_clusters)
        ):
            yield (
                f"data.group_clusters: give one non-negative cluster label per group ({groups} for {self.name}), "
                f"got {self.group_clusters}"
            )
        for name in ("test_fraction", "val_fraction"):
            frac = getattr(self, name)
            if not 0.0 < frac < 1.0:
                yield f"data.{name}: must lie strictly between 0 and 1, got {frac}"
        if self.image_size < 8:
            yield f"data.image_size: must be at least 8, got {self.image_size}"
        if self.name != "rotated_digits" and self.root is None:
            yield f"data.root: {self.name} needs the folder of its files (set data.root)"

    # ------------------------------------------------------------------ what the run knows
    def group_sizes(self, silos: int) -> list[int]:
        """Silos per group, in group order (silos are group-major)."""
        if self.name == "pacs":
            return list(self.domain_silos)
        groups = len(self.rotations) if self.name in ROTATED_DATA else len(backdoor.GROUPS[self.name])
        return [silos // groups] * groups

    def groups(self, silos: int) -> np.ndarray:
        """The group (rotation, backdoor group, PACS domain) of every silo."""
        sizes = self.group_sizes(silos)
        return np.repeat(np.arange(len(sizes)), sizes)

    def num_classes(self) -> int:
        return 7 if self.name == "pacs" else 10

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        """(channels, size, size): 3 channels for colour sets and for the ImageNet models, else 1."""
        colour = self.name not in ("rotated_digits", "rotated_mnist")
        return (3 if colour or imagenet else 1, self.image_size, self.image_size)

    def backdoor_targets(self, silos: int) -> np.ndarray:
        """The target group of a backdoor set evaluates backdoor accuracy."""
        if self.name not in BACKDOOR_DATA:
            return np.zeros(silos, dtype=bool)
        return self.groups(silos) == backdoor.TARGET_GROUP

    def pool_sizes(self, seed: int) -> tuple[int, int]:
        """(training pool, test pool) images of a rotated set, known without reading its files."""
        if self.name == "rotated_digits":
            total = digits.POOL_SIZE
        else:
            sizes = (mnist if self.name.endswith("mnist") else cifar).SPLIT_SIZES
            if self.pool == "train":
                return sizes["train"], sizes["test"]
            total = sizes["test"]
        n_test = len(holdout_split(total, self.test_fraction, seed)[1])
        return total - n_test, n_test

    def silo_images_shared_by(self, facts: DataFacts) -> int:
        """With data.silo_images: the most silos of one group holding the same training image
        (1: the silos are disjoint). Without it: 1."""
        if self.silo_images is None:
            return 1
        return images_shared_by(max(self.group_sizes(facts.silos)), self.silo_images, self.pool_sizes(facts.seed)[0])

    def start_note(self, facts: DataFacts) -> str | None:
        shared = self.silo_images_shared_by(facts)
        if shared <= 1:
            return None
        return (
            f"data: {self.silo_images} images per silo from a training pool of {self.pool_sizes(facts.seed)[0]}: "
            f"silos of one group share images, each held by up to {shared} of them (data.silo_images)"
        )

    def _normalisation(self, imagenet: bool) -> tuple:
        """The usual input statistics: ImageNet's for the torchvision models (what their weights
        expect), the data set's own for the simple CNN; ImageNet's for backdoor MNIST, as the
        authors' code normalises its coloured digits (`src/data.py`, "CMNIST")."""
        if imagenet or self.name in ("pacs", "backdoor_mnist"):
            return IMAGENET_MEAN, IMAGENET_STD
        if self.name.endswith("cifar10"):
            return CIFAR10_MEAN, CIFAR10_STD
        return MNIST_MEAN, MNIST_STD

    # ------------------------------------------------------------------ files
    def _splits(self) -> tuple[str, ...]:
        return ("test",) if self.pool == "test" else ("train", "test")

    def _missing(self) -> tuple[str, list[str], Path, str]:
        """(data set label, missing files, folder a download puts them in, the layouts of data.root
        its reader accepts) for the file-based sets."""
        root = self.root_folder()
        if self.name.endswith("mnist"):
            return "MNIST", mnist.missing_files(root, self._splits()), root / "MNIST" / "raw", mnist.LAYOUT
        if self.name.endswith("cifar10"):
            return "CIFAR-10", cifar.missing_files(root, self._splits()), root / cifar.FOLDER, cifar.LAYOUT
        return "PACS", pacs.missing_domains(root, self.domains), root, pacs.LAYOUT

    def check(self, facts: DataFacts) -> None:
        """ConfigError when the files cannot be found (nor downloaded), or cannot give every silo
        data.silo_images images."""
        if self.silo_images is not None and self.silo_images > self.pool_sizes(facts.seed)[0]:
            raise ConfigError(
                f"data.silo_images: {self.silo_images} images per silo, but {self.name}'s training pool "
                f"holds {self.pool_sizes(facts.seed)[0]} (give at most that)"
            )
        if self.name == "rotated_digits":
            return
        label, missing, _, layout = self._missing()
        if label == "PACS":
            if missing:
                raise ConfigError(
                    f"data.root: PACS domain folders {', '.join(missing)} not found in {self.root} "
                    f"({_give_root(layout)}; PACS has no download: unpack it there, then check it with "
                    f"{PREPARE_HINT})"
                )
            self._check_pacs_sizes()
        elif missing and not self.download:
            raise ConfigError(
                f"data.root: {label} files {', '.join(missing)} not found in {self.root} ({_give_root(layout)}; "
                f"or fetch them with {PREPARE_HINT} and data.download: true where a network is reachable)"
            )

    def _check_pacs_sizes(self) -> None:
        """The paper's rule: every silo holds at least data.min_silo_images images of its domain."""
        root = self.root_folder()
        classes = pacs.class_names(root, self.domains)
        for domain, k in zip(self.domains, self.domain_silos):
            n = len(pacs.list_domain(root, domain, classes)[1])
            if n // k < self.min_silo_images:
                fit = n // self.min_silo_images
                raise ConfigError(
                    f"data.domain_silos: domain {domain} has {n} images in {root / domain}, too few for {k} silos "
                    f"of at least {self.min_silo_images} (give it at most {fit} silos, or lower "
                    f"data.min_silo_images)"
                )

    def prepare(self, facts: DataFacts) -> None:
        """Download what is missing (rank 0 only, before any silo reads); ConfigError if impossible."""
        if self.name == "rotated_digits":
            return
        self.check(facts)
        label, missing, folder, layout = self._missing()
        if not missing:
            return
        root = self.root_folder()
        try:
            _download(label, root, folder, missing)
        except Exception as err:  # torchvision raises RuntimeError/URLError without a network
            raise ConfigError(
                f"data.root: {label} is not in {root} and downloading it failed ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else 'no detail'}) ({_give_root(layout)}; or run "
                f"{PREPARE_HINT} where a network is reachable and copy that data.root to this machine)"
            ) from None

    # ------------------------------------------------------------------ one silo's shard
    def _position(self, silos: int, silo: int) -> tuple[int, int, int]:
        """(group, index of the silo within its group, silos in the group)."""
        sizes = self.group_sizes(silos)
        group = int(self.groups(silos)[silo])
        return group, silo - sum(sizes[:group]), sizes[group]

    def _look(self, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The group's distribution: rotation or backdoor feature, at data.image_size, in [0, 1]."""
        size = self.image_size
        if self.name == "rotated_digits":  # 8x8 digits: upsampled first, then turned as MNIST is
            return rotate(resize(unit(images), size), self.rotations[group])
        if self.name in ROTATED_DATA:  # rotated at the native size, then resized, as the authors do
            expand = self.name == "rotated_cifar10"  # the authors' rotcifar10.ipynb: expand=True; rotmnist.ipynb: not
            return resize(rotate(unit(images), self.rotations[group], expand, self.rotation_border), size)
        return resize(backdoor.appearance(self.name, group, unit(images), labels), size)

    def build(self, silo: int, facts: DataFacts) -> SiloData:
        """Silo `silo` (0-based) keeps only its own shard, transformed as its group prescribes."""
        if self.name == "pacs":
            return self._pacs_silo(silo, facts)
        with _SPLITS_LOCK:
            x_tr, y_tr, x_te, y_te = _held_out_pools(
                self.name, Path(self.root) if self.root else None, self.pool, self.test_fraction, facts.seed
            )
        group, local, per_group = self._position(facts.silos, silo)
        if self.name == "backdoor_mnist":  # balanced classes, as the authors' notebook
            pool_tr, pool_te = backdoor.balanced(y_tr), backdoor.balanced(y_te)
        elif self.name in BACKDOOR_DATA:  # a group's copy holds only the group's classes
            classes = backdoor.group_classes(self.name, group)
            pool_tr, pool_te = np.flatnonzero(np.isin(y_tr, classes)), np.flatnonzero(np.isin(y_te, classes))
        else:
            pool_tr, pool_te = np.arange(len(y_tr)), np.arange(len(y_te))
        if self.silo_images is not None:
            part = sized_shard(
                group, local, self.silo_images, len(pool_tr), len(pool_te), self.val_fraction, facts.seed
            )
        else:
            part = group_shard(group, local, per_group, len(pool_tr), len(pool_te), self.val_fraction, facts.seed)
        train, val, test = pool_tr[part.train], pool_tr[part.val], pool_te[part.test]
        if self.name in BACKDOOR_DATA:
            train = backdoor.subsampled(self.name, group, train, facts.seed)
        mean, std = self._normalisation(facts.imagenet)
        channels = self.sample_shape(facts.imagenet)[0]

        def model_input(images01: np.ndarray) -> np.ndarray:
            return to_model_input(images01, mean, std, channels)

        def prepare(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
            return model_input(self._look(group, x[idx], y[idx]))

        extra = {}
        if self.backdoor_targets(facts.silos)[silo]:  # the same test images, the feature set to another label's
            poisoned = backdoor.backdoor_test(self.name, unit(x_te[test]), y_te[test])
            extra = {"x_backdoor": model_input(resize(poisoned, self.image_size)), "y_backdoor": y_te[test]}
        return SiloData(
            group,
            prepare(x_tr, y_tr, train),
            y_tr[train],
            prepare(x_tr, y_tr, val),
            y_tr[val],
            prepare(x_te, y_te, test),
            y_te[test],
            **extra,
        )

    def _pacs_silo(self, silo: int, facts: DataFacts) -> SiloData:
        """A PACS silo decodes only its own images: a slice of its domain (data.pacs_split)."""
        root = self.root_folder()
        group, local, per_group = self._position(facts.silos, silo)
        classes = pacs.class_names(root, self.domains)
        paths, labels = pacs.list_domain(root, self.domains[group], classes)
        if self.pacs_split == "authors":
            part = dealt_shard(
                group, local, per_group, len(labels), pacs.AUTHORS_TEST_FRACTION, pacs.AUTHORS_VAL_FRACTION, facts.seed
            )
        else:
            part = split_shard(group, local, per_group, len(labels), pacs.TEST_FRACTION, pacs.VAL_FRACTION, facts.seed)
        mean, std = self._normalisation(facts.imagenet)

        def load(idx: np.ndarray) -> np.ndarray:
            images = unit(pacs.read_images([paths[i] for i in idx], self.image_size))
            return to_model_input(images, mean, std, 3)

        return SiloData(
            group,
            load(part.train),
            labels[part.train],
            load(part.val),
            labels[part.val],
            load(part.test),
            labels[part.test],
        )


PREPARE_HINT = "`python -m cfl_mpi.prepare` with the same config and --set options"


def _give_root(layout: str) -> str:
    """The fix every missing-data error names first: the option that points at the files, and
    the layouts the readers accept there (the same for a job, `prepare`, `compare`, `reproduce`)."""
    return f"give the folder that holds the files with --set data.root=DIR, where {layout}"


def _download(label: str, root: Path, folder: Path, missing: list[str]) -> None:
    """Download into a fresh temporary folder and move the missing files into `folder` only
    once all of them arrived. torchvision creates its folders before it fetches anything, so
    downloading in place would leave an empty `data.root` tree (or a truncated archive that a
    later run would take for data) behind a failed download; the temporary folder goes away
    either way. It is made in the nearest existing ancestor of `root`, so the final move is
    a rename on the same file system."""
    anchor = next(p for p in (root, *root.parents) if p.is_dir())
    with tempfile.TemporaryDirectory(prefix=".cfl_mpi-download-", dir=anchor) as tmp:
        (mnist.download if label == "MNIST" else cifar.download)(Path(tmp))
        fetched = Path(tmp) / folder.relative_to(root)
        absent = [name for name in missing if not (fetched / name).is_file()]
        if absent:
            raise FileNotFoundError(f"the download did not bring {', '.join(absent)}")
        folder.mkdir(parents=True, exist_ok=True)
        for name in missing:
            shutil.move(fetched / name, folder / name)


_SPLITS_LOCK = threading.Lock()  # the silo threads that start together wait for one decoding


@functools.lru_cache(maxsize=4)
def _decoded_split(family: str, root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = (mnist.load_split_uint8 if family == "mnist" else cifar.load_split)(root, split)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


@functools.lru_cache(maxsize=4)
def _held_out_pools(
    name: str, root: Path | None, pool: str, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels) before any group's transform, made
    once per process and read-only: the silos of a rank share them (decoding MNIST's gzip or
    copying the held-out pool out of the split again would add to each of hundreds of silos'
    start; benchmarks/results/20261127-first-stage-and-pools.md)."""
    if name == "rotated_digits":
        images, labels = digits.load_digit_pool()
    else:
        load = functools.partial(_decoded_split, "mnist" if name.endswith("mnist") else "cifar")
        if pool == "train":
            return (*load(root, "train"), *load(root, "test"))
        images, labels = load(root, "test")
    train_idx, test_idx = holdout_split(len(labels), test_fraction, seed)
    pools = images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]
    for array in pools:
        array.flags.writeable = False
    return pools
