"""The rotated sets (the EMD-CFL paper, §4.1 and Appendix E.9): a source's pool copied once
per rotation angle, each copy split across that rotation's silos."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from ..settings import ConfigError
from .images import resize, rotate, unit
from .partition import images_shared_by, sized_shard
from .pools import CIFAR10, DIGITS, MNIST, PooledData, Source
from .spec import DataFacts


# A source (scikit-learn's digits, MNIST, CIFAR-10) copied once per rotation angle: one group of
# silos per angle.
@dataclass(frozen=True)
class RotatedData(PooledData):
    SOURCES: ClassVar[dict[str, Source]] = {
        "rotated_digits": DIGITS,
        "rotated_mnist": MNIST,
        "rotated_cifar10": CIFAR10,
    }

    # The source turned: scikit-learn's digits (embedded, no files), MNIST or CIFAR-10.
    name: Literal["rotated_digits", "rotated_mnist", "rotated_cifar10"] = "rotated_digits"
    # Rotation angles in degrees, one group per angle (the paper's 0/90/180/270, and its
    # Appendix E.9 variants).
    rotations: list[float] = field(default_factory=lambda: [0.0, 90.0, 180.0, 270.0])
    # Black pixels added around each image before it is rotated. The authors' rotated CIFAR-10
    # "Min" set adds 2 (the authors' `rotcifar10.ipynb`, docs/research/FIDELITY.md); everything else 0.
    rotation_border: int = 0
    # Images in every silo's share of the training pool (training + validation), IFCA's shape
    # (its rotated MNIST gives each of 2,400 clients 100). null: each group's copy of the pool
    # split evenly across its silos. Silos of a group stay disjoint while they fit in the
    # pool; beyond it they share images (partition.sized_shard says how).
    silo_images: int | None = None

    def group_count(self) -> int:
        return len(self.rotations)

    def problems(self, facts: DataFacts) -> Iterator[str]:
        groups = len(self.rotations)
        if groups < 1:
            yield "data.rotations: give at least one angle, e.g. [0, 90, 180, 270]"
            return
        yield from self.pooled_problems(
            facts,
            groups,
            f"{facts.silos} silos cannot be split evenly across {groups} rotations "
            f"(set silos to a multiple of {groups})",
        )
        if self.rotation_border < 0:
            yield f"data.rotation_border: must be 0 or more pixels, got {self.rotation_border}"
        if self.silo_images is not None and self.silo_images < 2:
            yield f"data.silo_images: a silo needs at least 2 images (training and validation), got {self.silo_images}"

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        """(channels, size, size): 3 channels for a colour source and for the ImageNet models."""
        return (3 if self.source.colour or imagenet else 1, self.image_size, self.image_size)

    def check(self, facts: DataFacts) -> None:
        """The files, and a training pool that can give every silo data.silo_images images."""
        if self.silo_images is not None and self.silo_images > self.pool_sizes(facts.seed)[0]:
            raise ConfigError(
                f"data.silo_images: {self.silo_images} images per silo, but {self.name}'s training pool "
                f"holds {self.pool_sizes(facts.seed)[0]} (give at most that)"
            )
        super().check(facts)

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

    def shard(self, group: int, local: int, per_group: int, n_train: int, n_test: int, seed: int):
        if self.silo_images is None:
            return super().shard(group, local, per_group, n_train, n_test, seed)
        return sized_shard(group, local, self.silo_images, n_train, n_test, self.val_fraction, seed)

    def look(self, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Turned by the group's angle at the source's size, then resized, as the authors do;
        the 8x8 digits are upsampled first, then turned as MNIST is."""
        angle, size = self.rotations[group], self.image_size
        if self.source.resize_first:
            return rotate(resize(unit(images), size), angle)
        return resize(rotate(unit(images), angle, self.source.rotate_expand, self.rotation_border), size)
