"""The backdoor features of the EMD-CFL paper, §4.1, §5.3 and Appendix C.4/C.5.

Each backdoor set has three groups of silos; group 0 is the *target*: clean data that
silos of group 1 try to backdoor with visually subtle, label-correlated features.

Backdoor MNIST (grey digits, (n, h, w) in [0, 1] → colour (n, h, w, 3)), as the authors'
`colormnist.ipynb` builds it (docs/research/FIDELITY.md): matplotlib's `summer` colour map sampled
at 40 entries, SUMMER_40[i] = (i/39, 0.5 + i/78, 0.4):
  group 0 (target): every digit in TARGET_COLOUR = (0.26, 0.63, 0.4), i.e. SUMMER_40[10]
           rounded: one step past the backdoor group's last colour;
  group 1: digit y in SUMMER_40[y]: the *hue* encodes the label, in the target's family;
  group 2: every digit in PURPLE = (149, 52, 235) / 255.
Groups 0 and 2 train on half of their training shard (`subsample`), so the backdoor group
holds twice the target's training data; the classes are balanced first (`balanced`).
Backdoor CIFAR10 ((n, 32, 32, 3) in [0, 1]), as the authors' `cifar10.ipynb` builds it:
  group 0: classes 0–4; group 1: classes 0–4 with a 3×3 patch in the top-left corner whose
  colour encodes the class (PATCH_COLOURS[y]: matplotlib's `tab10` colour y, truncated to
  uint8 as `add_color_patch` does); group 2: classes 5–9.
Backdoor test (target silos only), keeping the true labels: MNIST: the test digits coloured
SUMMER_40[9 − y] (the authors' `digit_to_color_rev`); CIFAR-10: the feature set to the value
of another label, `shifted_labels` (the next class of the group, cyclically). A model that
learnt the backdoor misclassifies them. (The authors patch every silo's test set with the
colour of (y + 1) mod 5; only the target silos' figure is reported, so only they build it.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike

from .images import IMAGENET_MEAN, IMAGENET_STD, Images, Stats, kept_images, resize, unit
from .pools import CIFAR10, MNIST, PooledData, Source
from .spec import DataFacts

TARGET_GROUP = 0

TARGET_COLOUR = (0.26, 0.63, 0.4)
PURPLE = (149 / 255, 52 / 255, 235 / 255)
PATCH = 3  # edge of the corner patch, in CIFAR-10's native pixels


@cache
def _colour_maps() -> tuple[np.ndarray, np.ndarray]:
    """(SUMMER_40, PATCH_COLOURS), from matplotlib's colour maps on first use: importing
    matplotlib costs every rank of every run a tenth of a second, and only the backdoor sets
    need the colours."""
    from matplotlib import colormaps

    summer_40 = colormaps["summer"].resampled(40)(np.arange(40))[:, :3].astype(np.float32)
    patch_colours = (colormaps["tab10"](np.arange(10))[:, :3] * 255).astype(np.uint8).astype(np.float32) / 255
    return summer_40, patch_colours


def __getattr__(name: str) -> np.ndarray:
    """`SUMMER_40` and `PATCH_COLOURS`, module constants made on first access."""
    if name == "SUMMER_40":
        return _colour_maps()[0]
    if name == "PATCH_COLOURS":
        return _colour_maps()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tint(grey: np.ndarray, rgb: ArrayLike) -> np.ndarray:
    """Colour grey digits: pixel value v becomes v·rgb; `rgb` is one colour or one per image."""
    colours = np.asarray(rgb, dtype=np.float32)
    if colours.ndim == 2:
        colours = colours[:, None, None, :]
    return grey[..., None].astype(np.float32) * colours


def patch(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Copy of a (n, h, w, 3) batch with each image's top-left PATCH×PATCH corner in its label's colour."""
    out = images.copy()
    out[:, :PATCH, :PATCH, :] = _colour_maps()[1][labels][:, None, None, :]
    return out


def balanced(labels: np.ndarray) -> np.ndarray:
    """Indices keeping the first min-count images of every class (the authors' `balance`)."""
    keep = min(np.bincount(labels)[np.unique(labels)])
    return np.sort(np.concatenate([np.flatnonzero(labels == c)[:keep] for c in np.unique(labels)]))


@dataclass(frozen=True, eq=False)
class Backdoor:
    """One backdoor set: its source, the labels each of its 3 groups holds, what each group
    sees and what the target silos are tested on."""

    source: Source
    groups: tuple[str, str, str]  # the groups' names
    classes: tuple[np.ndarray, np.ndarray, np.ndarray]  # the labels each group's silos hold
    subsample: tuple[float, float, float]  # the fraction of its training shard each group keeps
    balanced: bool  # the classes balanced first (the authors' notebook, MNIST)
    paper_silos: int  # the paper's silo count, named in a config error

    def appearance(self, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """What the silos of `group` see: the group's colouring or patch applied to clean images."""
        raise NotImplementedError

    def backdoor_test(self, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Target-group test images whose backdoor feature encodes another label (true labels kept)."""
        raise NotImplementedError

    def group_pool(self, group: int, labels: np.ndarray) -> np.ndarray:
        """The indices of a pool a group's copy holds: the group's classes (balanced first)."""
        kept = balanced(labels) if self.balanced else np.arange(len(labels))
        return kept[np.isin(labels[kept], self.classes[group])]

    def subsampled(self, group: int, train: np.ndarray, seed: int) -> np.ndarray:
        """The part of a silo's training shard its group keeps (all, or `subsample`'s fraction)."""
        if self.subsample[group] == 1.0:
            return train
        rng = np.random.default_rng([seed, 17, group])
        return np.sort(rng.permutation(train)[: int(self.subsample[group] * len(train))])


class ColouredDigits(Backdoor):
    def appearance(self, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        colour = (TARGET_COLOUR, _colour_maps()[0][labels], PURPLE)[group]
        return tint(images, colour)

    def backdoor_test(self, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return tint(images, _colour_maps()[0][9 - labels])


class PatchedImages(Backdoor):
    def appearance(self, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return patch(images, labels) if group == 1 else images.astype(np.float32, copy=False)

    def backdoor_test(self, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return patch(images, self.shifted_labels(labels))

    def shifted_labels(self, labels: np.ndarray) -> np.ndarray:
        """For each label, another label of the target group: the next one, cyclically."""
        classes = self.classes[TARGET_GROUP]
        position = np.searchsorted(classes, labels)
        return classes[(position + 1) % len(classes)]


VARIANTS: dict[str, Backdoor] = {
    "backdoor_mnist": ColouredDigits(
        MNIST, ("green", "green_backdoor", "purple"), (np.arange(10),) * 3, (0.5, 1.0, 0.5), True, 30
    ),
    "backdoor_cifar10": PatchedImages(
        CIFAR10,
        ("classes_0_4", "classes_0_4_patch", "classes_5_9"),
        (np.arange(5), np.arange(5), np.arange(5, 10)),
        (1.0, 1.0, 1.0),
        False,
        15,
    ),
}


# A source (MNIST, CIFAR-10) split across 3 groups of silos (the EMD-CFL paper, §4.1 and Appendix C):
# group 0 the backdoor's target, group 1 carrying the backdoor feature, group 2 another distribution.
@dataclass(frozen=True)
class BackdoorData(PooledData):
    SOURCES: ClassVar[dict[str, Source]] = {name: variant.source for name, variant in VARIANTS.items()}

    # The source: MNIST's digits coloured, or CIFAR-10 with a corner patch.
    name: Literal["backdoor_mnist", "backdoor_cifar10"] = "backdoor_mnist"

    @property
    def variant(self) -> Backdoor:
        return VARIANTS[self.name]

    def group_count(self) -> int:
        return len(self.variant.groups)

    def problems(self, facts: DataFacts) -> Iterator[str]:
        paper = self.variant.paper_silos
        yield from self.pooled_problems(
            facts,
            self.group_count(),
            f"{self.name} splits its silos evenly across 3 groups, {facts.silos} is not a multiple "
            f"of 3 (set silos to a multiple of 3; the paper uses {paper})",
        )

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)  # coloured, patched: colour images

    def backdoor_targets(self, silos: int) -> np.ndarray:
        """The target group evaluates backdoor accuracy."""
        return self.groups(silos) == TARGET_GROUP

    def normalisation(self, imagenet: bool) -> tuple[Stats, Stats]:
        """ImageNet's statistics for the torchvision models, and for a grey source the recipe
        colours, as the authors' code normalises its coloured digits (`src/data.py`, "CMNIST")."""
        if imagenet:
            return IMAGENET_MEAN, IMAGENET_STD
        if self.pixels == "raw":
            return 0.0, 1.0
        return self.source.stats if self.source.colour else (IMAGENET_MEAN, IMAGENET_STD)

    def group_pools(self, group: int, y_train: np.ndarray, y_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.variant.group_pool(group, y_train), self.variant.group_pool(group, y_test)

    def kept_for_training(self, group: int, train: np.ndarray, seed: int) -> np.ndarray:
        return self.variant.subsampled(group, train, seed)

    def look(self, group: int, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return resize(self.variant.appearance(group, unit(images), labels), self.image_size)

    def backdoor_test(
        self, images: np.ndarray, labels: np.ndarray, mean: Stats, std: Stats, channels: int
    ) -> tuple[Images, np.ndarray]:
        """The same test images, the feature set to another label's value, with the true labels."""
        poisoned = self.variant.backdoor_test(unit(images), labels)
        return kept_images(resize(poisoned, self.image_size), mean, std, channels), labels
