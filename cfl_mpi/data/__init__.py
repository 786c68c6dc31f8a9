"""Data sets by name: checking and preparing them once per job, and building one silo's shard.

| data.name | groups (true clusters by default) | silos | files in data.root |
|---|---|---|---|
| rotated_digits | one per rotation | multiple of #rotations | none (scikit-learn's digits) |
| rotated_mnist, rotated_cifar10 | one per rotation | multiple of #rotations | MNIST IDX / CIFAR-10 batches |
| backdoor_mnist, backdoor_cifar10 | 3 (backdoor.py; group 0 is the target) | multiple of 3 | MNIST / CIFAR-10 |
| pacs | one per domain | sum of data.domain_silos | `<root>/<domain>/<class>/*.jpg` |

Only rank 0 downloads (`prepare_data`, before any silo reads); each silo then reads the
files itself and keeps only its own shard (`build_silo_data`).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import BACKDOOR_DATA, ROTATED_DATA, TORCHVISION_MODELS, Config, ConfigError
from . import backdoor, cifar, digits, mnist, pacs
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

__all__ = [
    "SiloData",
    "build_silo_data",
    "check_data",
    "prepare_data",
    "true_clusters",
    "num_classes",
    "silo_groups",
    "backdoor_targets",
    "input_channels",
    "pool_sizes",
    "silo_images_shared_by",
]

PREPARE_HINT = "`python -m cfl_mpi.prepare` with the same config and --set options"


def _give_root(layout: str) -> str:
    """The fix every missing-data error names first: the option that points at the files, and
    the layouts the readers accept there (the same for a job, `prepare`, `compare`, `reproduce`)."""
    return f"give the folder that holds the files with --set data.root=DIR, where {layout}"


@dataclass(frozen=True)
class SiloData:
    """One silo's private data as model-ready arrays (x: float32 NCHW, y: int64).

    `x_backdoor`/`y_backdoor`: on the target silos of a backdoor set, their test images with
    the backdoor feature set to another label's value, and the true labels; None elsewhere.
    """

    group: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_backdoor: np.ndarray | None = None
    y_backdoor: np.ndarray | None = None


def num_classes(cfg: Config) -> int:
    return 7 if cfg.data.name == "pacs" else 10


def group_sizes(cfg: Config) -> list[int]:
    """Silos per group, in group order (silos are group-major)."""
    if cfg.data.name == "pacs":
        return list(cfg.data.domain_silos)
    groups = len(cfg.data.rotations) if cfg.data.name in ROTATED_DATA else len(backdoor.GROUPS[cfg.data.name])
    return [cfg.silos // groups] * groups


def silo_groups(cfg: Config) -> np.ndarray:
    """The group (rotation, backdoor group, PACS domain) of every silo."""
    sizes = group_sizes(cfg)
    return np.repeat(np.arange(len(sizes)), sizes)


def true_clusters(cfg: Config) -> np.ndarray:
    """Ground-truth cluster of every silo: its group, mapped through data.group_clusters if set."""
    groups = silo_groups(cfg)
    if cfg.data.group_clusters is None:
        return groups
    return np.asarray(cfg.data.group_clusters, dtype=np.int64)[groups]


def backdoor_targets(cfg: Config) -> np.ndarray:
    """Which silos evaluate backdoor accuracy: the target group of a backdoor set."""
    if cfg.data.name not in BACKDOOR_DATA:
        return np.zeros(cfg.silos, dtype=bool)
    return silo_groups(cfg) == backdoor.TARGET_GROUP


def input_channels(cfg: Config) -> int:
    """Channels of the model input: 3 for colour sets and for the ImageNet models, else 1."""
    colour = cfg.data.name not in ("rotated_digits", "rotated_mnist")
    return 3 if colour or cfg.model.name in TORCHVISION_MODELS else 1


def _normalisation(cfg: Config) -> tuple:
    """The usual input statistics: ImageNet's for the torchvision models (what their weights
    expect), the data set's own for the simple CNN; ImageNet's for backdoor MNIST, as the
    authors' code normalises its coloured digits (`src/data.py`, "CMNIST")."""
    if cfg.model.name in TORCHVISION_MODELS or cfg.data.name in ("pacs", "backdoor_mnist"):
        return IMAGENET_MEAN, IMAGENET_STD
    if cfg.data.name.endswith("cifar10"):
        return CIFAR10_MEAN, CIFAR10_STD
    return MNIST_MEAN, MNIST_STD


# --------------------------------------------------------------------------- files


def _splits(cfg: Config) -> tuple[str, ...]:
    return ("test",) if cfg.data.pool == "test" else ("train", "test")


def _missing(cfg: Config) -> tuple[str, list[str], Path, str]:
    """(data set label, missing files, folder a download puts them in, the layouts of data.root
    its reader accepts) for the file-based sets."""
    root = cfg.data.root_folder()
    if cfg.data.name.endswith("mnist"):
        return "MNIST", mnist.missing_files(root, _splits(cfg)), root / "MNIST" / "raw", mnist.LAYOUT
    if cfg.data.name.endswith("cifar10"):
        return "CIFAR-10", cifar.missing_files(root, _splits(cfg)), root / cifar.FOLDER, cifar.LAYOUT
    return "PACS", pacs.missing_domains(root, cfg.data.domains), root, pacs.LAYOUT


def pool_sizes(cfg: Config) -> tuple[int, int]:
    """(training pool, test pool) images of a rotated set, known without reading its files."""
    if cfg.data.name == "rotated_digits":
        total = digits.POOL_SIZE
    else:
        sizes = (mnist if cfg.data.name.endswith("mnist") else cifar).SPLIT_SIZES
        if cfg.data.pool == "train":
            return sizes["train"], sizes["test"]
        total = sizes["test"]
    n_test = len(holdout_split(total, cfg.data.test_fraction, cfg.seed)[1])
    return total - n_test, n_test


def silo_images_shared_by(cfg: Config) -> int:
    """With data.silo_images: the most silos of one group holding the same training image
    (1: the silos are disjoint). Without it: 1."""
    if cfg.data.silo_images is None:
        return 1
    return images_shared_by(max(group_sizes(cfg)), cfg.data.silo_images, pool_sizes(cfg)[0])


def check_data(cfg: Config) -> None:
    """Raise ConfigError when the configured data cannot be found (nor downloaded), or cannot
    give every silo data.silo_images images."""
    if cfg.data.silo_images is not None and cfg.data.silo_images > pool_sizes(cfg)[0]:
        raise ConfigError(
            f"data.silo_images: {cfg.data.silo_images} images per silo, but {cfg.data.name}'s training pool "
            f"holds {pool_sizes(cfg)[0]} (give at most that)"
        )
    if cfg.data.name == "rotated_digits":
        return
    label, missing, _, layout = _missing(cfg)
    if label == "PACS":
        if missing:
            raise ConfigError(
                f"data.root: PACS domain folders {', '.join(missing)} not found in {cfg.data.root} "
                f"({_give_root(layout)}; PACS has no download: unpack it there, then check it with {PREPARE_HINT})"
            )
        _check_pacs_sizes(cfg)
    elif missing and not cfg.data.download:
        raise ConfigError(
            f"data.root: {label} files {', '.join(missing)} not found in {cfg.data.root} ({_give_root(layout)}; "
            f"or fetch them with {PREPARE_HINT} and data.download: true where a network is reachable)"
        )


def _check_pacs_sizes(cfg: Config) -> None:
    """The paper's rule: every silo holds at least data.min_silo_images images of its domain."""
    root = cfg.data.root_folder()
    classes = pacs.class_names(root, cfg.data.domains)
    for domain, k in zip(cfg.data.domains, cfg.data.domain_silos):
        n = len(pacs.list_domain(root, domain, classes)[1])
        if n // k < cfg.data.min_silo_images:
            fit = n // cfg.data.min_silo_images
            raise ConfigError(
                f"data.domain_silos: domain {domain} has {n} images in {root / domain}, too few for {k} silos "
                f"of at least {cfg.data.min_silo_images} (give it at most {fit} silos, or lower "
                f"data.min_silo_images)"
            )


def prepare_data(cfg: Config) -> None:
    """Download what is missing (rank 0 only, before any silo reads); ConfigError if impossible."""
    if cfg.data.name == "rotated_digits":
        return
    check_data(cfg)
    label, missing, folder, layout = _missing(cfg)
    if not missing:
        return
    root = cfg.data.root_folder()
    try:
        _download(label, root, folder, missing)
    except Exception as err:  # torchvision raises RuntimeError/URLError without a network
        raise ConfigError(
            f"data.root: {label} is not in {root} and downloading it failed ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'}) ({_give_root(layout)}; or run "
            f"{PREPARE_HINT} where a network is reachable and copy that data.root to this machine)"
        ) from None


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


# --------------------------------------------------------------------------- shards


_SPLITS_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _decoded_split(family: str, root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = (mnist.load_split_uint8 if family == "mnist" else cifar.load_split)(root, split)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def _pools(cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels) before any group's transform, read
    and decoded once per process: the silos of a rank share them (decoding MNIST's gzip again
    would add to each silo's start). The lock makes the silo threads that start together wait
    for one decoding."""
    with _SPLITS_LOCK:
        return _held_out_pools(
            cfg.data.name,
            Path(cfg.data.root) if cfg.data.root else None,
            cfg.data.pool,
            cfg.data.test_fraction,
            cfg.seed,
        )


@functools.lru_cache(maxsize=4)
def _held_out_pools(
    name: str, root: Path | None, pool: str, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`_pools`, made once per process and read-only: the silos of a rank share it (copying the
    held-out pool out of the split again would add to each of hundreds of silos' start;
    benchmarks/results/20261127-first-stage-and-pools.md)."""
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


def _position(cfg: Config, silo: int) -> tuple[int, int, int]:
    """(group, index of the silo within its group, silos in the group)."""
    sizes = group_sizes(cfg)
    group = int(silo_groups(cfg)[silo])
    return group, silo - sum(sizes[:group]), sizes[group]


def _look(cfg: Config, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The group's distribution: rotation or backdoor feature, at data.image_size, in [0, 1]."""
    size = cfg.data.image_size
    if cfg.data.name == "rotated_digits":  # 8x8 digits: upsampled first, then turned as MNIST is
        return rotate(resize(unit(images), size), cfg.data.rotations[group])
    if cfg.data.name in ROTATED_DATA:  # rotated at the native size, then resized, as the authors do
        expand = cfg.data.name == "rotated_cifar10"  # the authors' rotcifar10.ipynb: expand=True; rotmnist.ipynb: not
        return resize(rotate(unit(images), cfg.data.rotations[group], expand, cfg.data.rotation_border), size)
    return resize(backdoor.appearance(cfg.data.name, group, unit(images), labels), size)


def build_silo_data(cfg: Config, silo: int) -> SiloData:
    """Silo `silo` (0-based) keeps only its own shard, transformed as its group prescribes."""
    if cfg.data.name == "pacs":
        return _pacs_silo(cfg, silo)
    x_tr, y_tr, x_te, y_te = _pools(cfg)
    group, local, per_group = _position(cfg, silo)
    if cfg.data.name == "backdoor_mnist":  # balanced classes, as the authors' notebook
        pool_tr, pool_te = backdoor.balanced(y_tr), backdoor.balanced(y_te)
    elif cfg.data.name in BACKDOOR_DATA:  # a group's copy holds only the group's classes
        classes = backdoor.group_classes(cfg.data.name, group)
        pool_tr, pool_te = np.flatnonzero(np.isin(y_tr, classes)), np.flatnonzero(np.isin(y_te, classes))
    else:
        pool_tr, pool_te = np.arange(len(y_tr)), np.arange(len(y_te))
    if cfg.data.silo_images is not None:
        part = sized_shard(
            group, local, cfg.data.silo_images, len(pool_tr), len(pool_te), cfg.data.val_fraction, cfg.seed
        )
    else:
        part = group_shard(group, local, per_group, len(pool_tr), len(pool_te), cfg.data.val_fraction, cfg.seed)
    train, val, test = pool_tr[part.train], pool_tr[part.val], pool_te[part.test]
    if cfg.data.name in BACKDOOR_DATA:
        train = backdoor.subsampled(cfg.data.name, group, train, cfg.seed)
    mean, std = _normalisation(cfg)
    channels = input_channels(cfg)

    def model_input(images01: np.ndarray) -> np.ndarray:
        return to_model_input(images01, mean, std, channels)

    def prepare(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return model_input(_look(cfg, group, x[idx], y[idx]))

    extra = {}
    if backdoor_targets(cfg)[silo]:  # the same test images, the feature set to another label's value
        poisoned = backdoor.backdoor_test(cfg.data.name, unit(x_te[test]), y_te[test])
        extra = {"x_backdoor": model_input(resize(poisoned, cfg.data.image_size)), "y_backdoor": y_te[test]}
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


def _pacs_silo(cfg: Config, silo: int) -> SiloData:
    """A PACS silo decodes only its own images: a slice of its domain (data.pacs_split)."""
    root = cfg.data.root_folder()
    group, local, per_group = _position(cfg, silo)
    classes = pacs.class_names(root, cfg.data.domains)
    paths, labels = pacs.list_domain(root, cfg.data.domains[group], classes)
    if cfg.data.pacs_split == "authors":
        part = dealt_shard(
            group, local, per_group, len(labels), pacs.AUTHORS_TEST_FRACTION, pacs.AUTHORS_VAL_FRACTION, cfg.seed
        )
    else:
        part = split_shard(group, local, per_group, len(labels), pacs.TEST_FRACTION, pacs.VAL_FRACTION, cfg.seed)
    mean, std = _normalisation(cfg)

    def load(idx: np.ndarray) -> np.ndarray:
        images = unit(pacs.read_images([paths[i] for i in idx], cfg.data.image_size))
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
