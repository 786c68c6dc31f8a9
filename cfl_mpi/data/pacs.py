"""PACS (Li et al., 2017) from a local folder in the usual layout `<root>/<domain>/<class>/<image>`.

Domains: photo, art_painting, cartoon, sketch; 7 classes (dog, elephant, giraffe, guitar,
horse, house, person), numbered in sorted order of the class folder names. There is no
download: the data set is distributed as an archive to unpack into `data.root`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from ..settings import ConfigError
from .images import IMAGENET_MEAN, IMAGENET_STD, Images, kept_images, read_rgb, unit
from .partition import dealt_shard, split_shard
from .pools import PREPARE_HINT, give_root
from .spec import DataConfig, DataFacts, SiloData

DOMAINS = ("photo", "art_painting", "cartoon", "sketch")

EXTENSIONS = (".jpg", ".jpeg", ".png")
LAYOUT = f"DIR/<domain>/<class>/ holds the images ({', '.join(EXTENSIONS)}), one folder per domain of data.domains"
# The paper's 80/10/10 split of each silo's images (EMD-CFL paper, §4.1), and the authors' code's
# (`pacs.ipynb`): 20 % of the domain for testing, then 80/20 of each silo's share (data.pacs_split).
TEST_FRACTION, VAL_FRACTION = 0.1, 0.1
AUTHORS_TEST_FRACTION, AUTHORS_VAL_FRACTION = 0.2, 0.2


def missing_domains(root: Path, domains: list[str]) -> list[str]:
    return [d for d in domains if not (root / d).is_dir()]


def class_names(root: Path, domains: list[str]) -> list[str]:
    """Sorted class folder names over the domains (PACS: the same 7 in every domain)."""
    return sorted({c.name for d in domains for c in (root / d).iterdir() if c.is_dir()})


def list_domain(root: Path, domain: str, classes: list[str]) -> tuple[list[Path], np.ndarray]:
    """A domain's image files in a fixed (sorted) order, and their labels."""
    paths, labels = [], []
    for label, name in enumerate(classes):
        folder = root / domain / name
        if folder.is_dir():
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file())
            paths += files
            labels += [label] * len(files)
    return paths, np.asarray(labels, dtype=np.int64)


def read_images(paths: list[Path], size: int) -> np.ndarray:
    """Decode, convert to RGB and resize (bilinear) a list of image files: (n, size, size, 3) uint8."""
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        out[i] = read_rgb(path, size)
    return out


# PACS gives each domain its own silos (the EMD-CFL paper, §4.1): one group per domain.
@dataclass(frozen=True)
class PacsData(DataConfig):
    name: Literal["pacs"] = "pacs"
    # Folder of PACS: `<root>/<domain>/<class>/*.jpg` (or .png); no download.
    root: str | None = None
    # True cluster of each domain; null: every domain is its own cluster.
    group_clusters: list[int] | None = None
    # Edge of the square images each silo keeps in memory (PACS's 227 cut to the paper's 224).
    image_size: int = 224
    # The domains used, how many silos each gets (domain_silos; paper: 3 photo, 4 art, 4
    # cartoon, 7 sketch = 18 silos), and the fewest images a silo may hold (min_silo_images;
    # paper: at least 500).
    domains: list[str] = field(default_factory=lambda: list(DOMAINS))
    domain_silos: list[int] = field(default_factory=lambda: [3, 4, 4, 7])
    min_silo_images: int = 500
    # "paper": each silo's images split 80/10/10 (EMD-CFL paper, §4.1); "authors": the last
    # 20 % of each shuffled domain is its test pool, the rest dealt round-robin to the domain's
    # silos, each silo's share split 80/20 into training and validation (the authors' `pacs.ipynb`).
    pacs_split: Literal["paper", "authors"] = "paper"

    def problems(self, facts: DataFacts) -> Iterator[str]:
        groups = len(self.domains)
        if not (groups >= 1 and len(set(self.domains)) == groups and set(self.domains) <= set(DOMAINS)):
            yield f"data.domains: give distinct PACS domains out of {', '.join(DOMAINS)}, got {self.domains}"
        if not (len(self.domain_silos) == groups and all(n >= 1 for n in self.domain_silos)):
            yield f"data.domain_silos: give one positive silo count per domain ({groups}), got {self.domain_silos}"
        if facts.silos != sum(self.domain_silos):
            yield (
                f"silos: data.domain_silos {self.domain_silos} adds up to {sum(self.domain_silos)} silos but "
                f"silos is {facts.silos} (set silos to {sum(self.domain_silos)} or change data.domain_silos)"
            )
        if self.min_silo_images < 1:
            yield f"data.min_silo_images: must be at least 1, got {self.min_silo_images}"
        if self.group_clusters is not None and not (
            len(self.group_clusters) == groups and all(k >= 0 for k in self.group_clusters)
        ):
            yield (
                f"data.group_clusters: give one non-negative cluster label per group ({groups} for pacs), "
                f"got {self.group_clusters}"
            )
        if self.image_size < 8:
            yield f"data.image_size: must be at least 8, got {self.image_size}"
        if self.root is None:
            yield "data.root: pacs needs the folder of its files (set data.root)"

    def groups(self, silos: int) -> np.ndarray:
        return np.repeat(np.arange(len(self.domain_silos)), self.domain_silos)

    def num_classes(self) -> int:
        return 7

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    def root_folder(self) -> Path:
        if self.root is None:
            raise ConfigError("data.root: pacs needs the folder of its files (set data.root)")
        return Path(self.root)

    def check(self, facts: DataFacts) -> None:
        """The domains' folders, each with enough images for its silos (the paper's rule: every
        silo holds at least data.min_silo_images images of its domain)."""
        root = self.root_folder()
        missing = missing_domains(root, self.domains)
        if missing:
            raise ConfigError(
                f"data.root: PACS domain folders {', '.join(missing)} not found in {self.root} "
                f"({give_root(LAYOUT)}; PACS has no download: unpack it there, then check it with {PREPARE_HINT})"
            )
        classes = class_names(root, self.domains)
        for domain, k in zip(self.domains, self.domain_silos):
            n = len(list_domain(root, domain, classes)[1])
            if n // k < self.min_silo_images:
                raise ConfigError(
                    f"data.domain_silos: domain {domain} has {n} images in {root / domain}, too few for {k} silos "
                    f"of at least {self.min_silo_images} (give it at most {n // self.min_silo_images} silos, or "
                    "lower data.min_silo_images)"
                )

    def prepare(self, facts: DataFacts) -> None:
        self.check(facts)

    def build(self, silo: int, facts: DataFacts) -> SiloData:
        """A PACS silo decodes only its own images: a slice of its domain (data.pacs_split)."""
        root = self.root_folder()
        sizes = list(self.domain_silos)
        group = int(self.groups(facts.silos)[silo])
        local, per_group = silo - sum(sizes[:group]), sizes[group]
        classes = class_names(root, self.domains)
        paths, labels = list_domain(root, self.domains[group], classes)
        if self.pacs_split == "authors":
            part = dealt_shard(
                group, local, per_group, len(labels), AUTHORS_TEST_FRACTION, AUTHORS_VAL_FRACTION, facts.seed
            )
        else:
            part = split_shard(group, local, per_group, len(labels), TEST_FRACTION, VAL_FRACTION, facts.seed)

        def load(idx: np.ndarray) -> Images:
            images = unit(read_images([paths[i] for i in idx], self.image_size))
            return kept_images(images, IMAGENET_MEAN, IMAGENET_STD, 3)

        return SiloData(
            group,
            load(part.train),
            labels[part.train],
            load(part.val),
            labels[part.val],
            load(part.test),
            labels[part.test],
        )
