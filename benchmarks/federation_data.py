"""The federations of `benchmarks.federations`: real data sets cut into sites, written as the
silo files a user would bring (`data.name: silo_files`), nothing downloaded.

A federation is a source (MNIST's training or test split, scikit-learn's digits, breast-cancer
or wine tables), split into groups of sites that share a shift of their inputs (a lab's
instrument scale and offset on tables; inverted, blurred or rotated scans on images), each
group's examples partitioned among its sites by a recipe: IID, label skew by a Dirichlet
draw (Hsu, Qi & Brown, "Measuring the effects of non-identical data distribution for federated
visual classification", 2019), pathological k classes a site (McMahan et al., "Communication-
efficient learning of deep networks from decentralized data", AISTATS 2017) or quantity skew.

The partition is Flower Datasets' (`flwr-datasets`: its IidPartitioner, DirichletPartitioner,
PathologicalPartitioner, LinearPartitioner on a `datasets.Dataset` built from the local labels),
so that the federation is not cut by the code it benchmarks; where it is not installed (it is
the `benchmarks` extra, no dependency of cfl_mpi), `partitioner="own"` cuts with the same
recipes in numpy here, IID as cfl_mpi/data/partition.py cuts a group (slices of one seeded
permutation), and the federation records which one cut it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# Flower Datasets loads through Hugging Face `datasets`: never reach for a hub from here.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MIN_SITE, MAX_SITE = 30, 3000  # examples a site may hold
DATA_SEED = 0  # the federations are fixed; a run's seed varies its training and its held-out cut
FLWR_MISSING = (
    "flwr-datasets is not installed: pip install -e '.[benchmarks]' for Flower Datasets' partitioners, "
    "or pass --partitioner own for this module's numpy partitions of the same recipes"
)


@dataclass(frozen=True)
class Federation:
    """One federation: where its examples come from, how they are shifted and who holds what."""

    name: str
    source: str  # breast_cancer, wine, digits, mnist_train, mnist_test
    shifts: tuple[str, ...]  # one input shift per group (SHIFTS); one group "none": no true groups
    sites_per_group: int
    scheme: str  # iid, dirichlet, pathological, linear (quantity skew)
    what: str  # one line for the table
    alpha: float = 0.0  # dirichlet: the concentration
    classes_per_site: int = 0  # pathological: k
    pool: int | None = None  # examples drawn from the source (None: all of it)
    files: str = "npz"  # npz, or png: an image-folder tree per site

    @property
    def sites(self) -> int:
        return len(self.shifts) * self.sites_per_group

    @property
    def grouped(self) -> bool:
        """Whether the sites have true groups to score a clustering against."""
        return len(self.shifts) > 1

    @property
    def tabular(self) -> bool:
        return self.source in TABLES


def _lab(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Another lab's instrument: every feature scaled by 0.5-2x (log-uniform) and offset by
    N(0, 0.5²), on features standardised once over the whole table."""
    scale = np.exp(rng.uniform(np.log(0.5), np.log(2.0), x.shape[1]))
    return (x * scale + rng.normal(0.0, 0.5, x.shape[1])).astype(np.float32)


def _inverted(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (255 - x).astype(np.uint8)


def _blurred(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    return np.clip(gaussian_filter(x.astype(np.float32), sigma=(0, 1.0, 1.0)) + 0.5, 0, 255).astype(np.uint8)


def _rotated(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.ascontiguousarray(np.rot90(x, 1, axes=(1, 2)))


SHIFTS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "none": lambda x, rng: x,
    "lab": _lab,
    "inverted": _inverted,
    "blurred": _blurred,
    "rot90": _rotated,
}

TABLES = ("breast_cancer", "wine")

FEDERATIONS = {
    f.name: f
    for f in (
        Federation("cancer_labs", "breast_cancer", ("none", "lab"), 3, "iid", "2 labs (feature scale/offset), IID"),
        Federation("wine_labs", "wine", ("none", "lab"), 2, "iid", "2 labs (feature scale/offset), IID"),
        Federation("cancer_dir1", "breast_cancer", ("none",), 6, "dirichlet", "label skew Dirichlet 1, no groups", 1.0),
        Federation(
            "digits_inverted_dir1",
            "digits",
            ("none", "inverted"),
            4,
            "dirichlet",
            "2 groups (inverted scans), each label-skewed Dirichlet 1; PNG folders",
            alpha=1.0,
            files="png",
        ),
        Federation("digits_quantity", "digits", ("none",), 8, "linear", "quantity skew (sizes 1:8), no groups"),
        Federation(
            "mnist_dir0.3",
            "mnist_test",
            ("none",),
            8,
            "dirichlet",
            "label skew Dirichlet 0.3, no groups",
            0.3,
            pool=4000,
        ),
        Federation(
            "mnist_dir0.1",
            "mnist_train",
            ("none",),
            8,
            "dirichlet",
            "label skew Dirichlet 0.1, no groups",
            0.1,
            pool=4000,
        ),
        Federation(
            "mnist_dir1", "mnist_train", ("none",), 8, "dirichlet", "label skew Dirichlet 1, no groups", 1.0, pool=3200
        ),
        Federation(
            "mnist_patho2",
            "mnist_train",
            ("none",),
            8,
            "pathological",
            "2 classes a site, no groups",
            classes_per_site=2,
            pool=4000,
        ),
        Federation("mnist_iid", "mnist_train", ("none",), 8, "iid", "IID, no groups", pool=3200),
        Federation(
            "mnist_scans",
            "mnist_train",
            ("none", "inverted", "blurred"),
            3,
            "iid",
            "3 groups (plain, inverted, blurred scans), IID; PNG folders",
            pool=3600,
            files="png",
        ),
        Federation(
            "mnist_rot_dir0.3",
            "mnist_test",
            ("none", "rot90"),
            4,
            "dirichlet",
            "2 groups (scans turned 90°), each label-skewed Dirichlet 0.3",
            alpha=0.3,
            pool=4000,
        ),
    )
}


# ---------------------------------------------------------------------------------- sources
def load_source(source: str, mnist: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a source: tables as standardised float32 features, images as uint8 (n, h, w)."""
    if source in TABLES:
        from sklearn import datasets

        x, y = getattr(datasets, f"load_{source}")(return_X_y=True)
        x = (x - x.mean(0)) / x.std(0)
        return x.astype(np.float32), y.astype(np.int64)
    if source == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        return np.round(digits.images * (255 / 16)).astype(np.uint8), digits.target.astype(np.int64)
    if source.startswith("mnist_"):
        from cfl_mpi.data.mnist import load_split_uint8

        if mnist is None:
            raise FileNotFoundError(
                "the MNIST federations need the MNIST IDX files: give --mnist DIR or $CFL_MPI_MNIST"
            )
        return load_split_uint8(mnist, source.removeprefix("mnist_"))
    raise ValueError(f"unknown source {source!r}")


# ---------------------------------------------------------------------------------- partitions
def flwr_available() -> bool:
    """Whether Flower Datasets is installed (found, not imported: it loads `datasets`, seconds)."""
    return importlib.util.find_spec("flwr_datasets") is not None


def partition(labels: np.ndarray, fed: Federation, sites: int, seed: int, partitioner: str) -> list[np.ndarray]:
    """Indices into `labels` of each of `sites` sites under the federation's scheme."""
    if partitioner == "flwr":
        return _flwr_partition(labels, fed, sites, seed)
    if partitioner == "own":
        return _own_partition(labels, fed, sites, seed)
    raise ValueError(f"unknown partitioner {partitioner!r} (flwr or own)")


def _flwr_partition(labels: np.ndarray, fed: Federation, sites: int, seed: int) -> list[np.ndarray]:
    if not flwr_available():
        raise RuntimeError(FLWR_MISSING)
    from datasets import Dataset
    from flwr_datasets import partitioner as fp

    made: fp.Partitioner
    if fed.scheme == "iid":
        made = fp.IidPartitioner(num_partitions=sites)
    elif fed.scheme == "dirichlet":
        made = fp.DirichletPartitioner(
            num_partitions=sites, partition_by="label", alpha=fed.alpha, min_partition_size=MIN_SITE, seed=seed
        )
    elif fed.scheme == "pathological":
        made = fp.PathologicalPartitioner(
            num_partitions=sites,
            partition_by="label",
            num_classes_per_partition=fed.classes_per_site,
            class_assignment_mode="first-deterministic",  # every class held by some site
            seed=seed,
        )
    elif fed.scheme == "linear":
        made = fp.LinearPartitioner(num_partitions=sites)
    else:
        raise ValueError(f"unknown scheme {fed.scheme!r}")
    dataset = Dataset.from_dict({"label": labels.tolist(), "index": list(range(len(labels)))})
    if fed.scheme in ("iid", "linear"):  # these take the rows in order: shuffle them first, seeded
        dataset = dataset.shuffle(seed=seed)
    made.dataset = dataset
    with warnings.catch_warnings():  # the Dirichlet partitioner warns at each redraw for its minimum size
        warnings.simplefilter("ignore", UserWarning)
        return [np.sort(np.asarray(made.load_partition(i)["index"], dtype=np.int64)) for i in range(sites)]


def _own_partition(labels: np.ndarray, fed: Federation, sites: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 23])
    n = len(labels)
    if fed.scheme == "iid":  # cfl_mpi/data/partition.py's rule for a group: slices of one permutation
        return [np.sort(part) for part in np.array_split(rng.permutation(n), sites)]
    if fed.scheme == "linear":  # sizes in proportion to 1, 2, ..., sites (Flower's LinearPartitioner)
        bounds = np.floor(np.cumsum(np.arange(1, sites + 1)) / (sites * (sites + 1) / 2) * n).astype(int)
        return [np.sort(part) for part in np.split(rng.permutation(n), bounds[:-1])]
    classes = np.unique(labels)
    if fed.scheme == "dirichlet":  # each class split by a Dirichlet draw, redrawn until every site has MIN_SITE
        for _ in range(1000):
            parts: list[list[np.ndarray]] = [[] for _ in range(sites)]
            for c in classes:
                members = rng.permutation(np.flatnonzero(labels == c))
                cuts = (np.cumsum(rng.dirichlet(np.full(sites, fed.alpha))) * len(members)).astype(int)[:-1]
                for site, chunk in enumerate(np.split(members, cuts)):
                    parts[site].append(chunk)
            out = [np.sort(np.concatenate(p)) for p in parts]
            if min(len(p) for p in out) >= MIN_SITE:
                return out
        raise RuntimeError(f"{fed.name}: no Dirichlet draw gave every site {MIN_SITE} examples in 1000 tries")
    if fed.scheme == "pathological":  # site i holds classes i*k .. i*k+k-1 (mod the classes), each split evenly
        order = rng.permutation(classes)
        held = [
            [order[(i * fed.classes_per_site + j) % len(order)] for j in range(fed.classes_per_site)]
            for i in range(sites)
        ]
        parts = [[] for _ in range(sites)]
        for c in classes:
            holders = [i for i in range(sites) if c in held[i]]
            for i, chunk in zip(
                holders, np.array_split(rng.permutation(np.flatnonzero(labels == c)), max(1, len(holders)))
            ):
                parts[i].append(chunk)
        return [np.sort(np.concatenate(p)) for p in parts]
    raise ValueError(f"unknown scheme {fed.scheme!r}")


# ---------------------------------------------------------------------------------- building
@dataclass(frozen=True)
class Site:
    """What the built federation holds at one site (its file, group and label counts)."""

    path: str  # relative to the federation's folder
    group: int
    examples: int
    label_counts: list[int]


def build(fed: Federation, folder: Path, mnist: Path | None, partitioner: str) -> list[Site]:
    """Write the federation into `folder`: one file or image folder per site, `manifest.csv`
    (with each site's group where the federation has groups), `federation.json` (the recipe, the
    partitioner and every site's counts) and `config.yaml` (the run config, strategy defaults)."""
    x, y = load_source(fed.source, mnist)
    rng = np.random.default_rng([DATA_SEED, 29])
    if fed.pool is not None and fed.pool < len(y):
        pick = np.sort(rng.permutation(len(y))[: fed.pool])
        x, y = x[pick], y[pick]
    classes = int(y.max()) + 1
    groups = np.array_split(rng.permutation(len(y)), len(fed.shifts))  # disjoint examples per group
    folder.mkdir(parents=True, exist_ok=True)
    sites: list[Site] = []
    for g, (shift, members) in enumerate(zip(fed.shifts, groups)):
        members = np.sort(members)
        shifted = SHIFTS[shift](x[members], np.random.default_rng([DATA_SEED, 31, g]))
        for idx in partition(y[members], fed, fed.sites_per_group, DATA_SEED + g, partitioner):
            site = len(sites)
            name = f"site{site:02d}" + (".npz" if fed.files == "npz" else "")
            _write_site(folder / name, shifted[idx], y[members][idx], fed.files)
            sites.append(Site(name, g, len(idx), np.bincount(y[members][idx], minlength=classes).tolist()))
    with open(folder / "manifest.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["silo", "path", "group"] if fed.grouped else ["silo", "path"])
        for i, s in enumerate(sites):
            writer.writerow([i, s.path, s.group] if fed.grouped else [i, s.path])
    meta = {
        "federation": asdict(fed),
        "partitioner": partitioner_label(partitioner),
        "sites": [asdict(s) for s in sites],
    }
    (folder / "federation.json").write_text(json.dumps(meta, indent=1) + "\n")
    (folder / "config.yaml").write_text(run_config(fed, folder))
    return sites


def _write_site(path: Path, x: np.ndarray, y: np.ndarray, files: str) -> None:
    if files == "npz":
        np.savez(path, x=x, y=y)
        return
    from PIL import Image

    for i, (image, label) in enumerate(zip(x, y)):
        out = path / "train" / str(int(label))
        out.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(out / f"{i:05d}.png")


def partitioner_label(partitioner: str) -> str:
    if partitioner == "flwr":
        from importlib.metadata import version

        return f"Flower Datasets {version('flwr-datasets')}"
    return "own numpy partition (benchmarks/federation_data.py)"


def run_config(fed: Federation, folder: Path) -> str:
    """The federation's run config: what a user must set (silos, model, rounds), the rest the
    product's defaults. Tables: the MLP, 10 rounds of the default 10 local epochs; digits (8x8):
    the simple CNN, 5 rounds of 10 epochs; MNIST: the simple CNN, 5 rounds of 2 epochs (a 2-core
    machine's budget)."""
    model, rounds, epochs = (
        ("mlp", 10, 10) if fed.tabular else ("simple_cnn", 5, 2 if fed.source.startswith("mnist") else 10)
    )
    return (
        f"# {fed.name}: {fed.what} (benchmarks/federations.py)\n"
        f"name: {fed.name}\nseed: 0\nsilos: {fed.sites}\n"
        f"data:\n  name: silo_files\n  manifest: {folder.resolve() / 'manifest.csv'}\n"
        f"model:\n  name: {model}\n"
        f"train:\n  rounds: {rounds}\n  local_epochs: {epochs}\n"
        "strategy:\n  name: emdcfl\n"
    )
