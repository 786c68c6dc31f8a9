"""What the rest of cfl_mpi knows about a data set: its parameters (the config's `data:`
section), the facts of the run it is built for, and one silo's arrays.

A data set is one module with a frozen dataclass subclassing `DataConfig`, registered by
name in `data/__init__.py`; its methods answer what the config check, the server and each
silo need, and nothing reaches it but its own section and `DataFacts` (never the whole
config).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple

import numpy as np

from .images import Images, as_floats, rows_of


class DataFacts(NamedTuple):
    """What a data set is built for besides its own parameters."""

    silos: int
    seed: int
    # the model is an ImageNet network (torchvision's): it takes 3 channels and ImageNet's statistics
    imagenet: bool = False
    # the strategy reads each silo's validation set (EMD-CFL's τ and noise: `validation_rows`)
    validation: bool = False


class LentRows(NamedTuple):
    """Validation rows a silo lends its strategy's clustering (EMD-CFL's τ and noise, on a
    small site) and takes back into training once clustered: `rows`, indices into its
    validation set; `order`, the rows of (its training set, then the lent rows) in the order
    of the training set they make together, the one a strategy that reads no validation set
    trains on."""

    rows: np.ndarray
    order: np.ndarray


@dataclass(frozen=True)
class SiloData:
    """One silo's private data (y: int64). `x_train` … `x_backdoor` are the model's input
    (float32, NCHW images or feature vectors); the images behind them may be kept as their
    pixels' bytes (`PixelCodes`) and are then made floats on each read: a silo that keeps its
    data all run reads them where it uses them and holds no floats between rounds.

    `backdoor_images`/`y_backdoor`: on the target silos of a backdoor set, their test images
    with the backdoor feature set to another label's value, and the true labels; None elsewhere.
    """

    group: int  # its known group, -1 where none is known
    train_images: Images
    y_train: np.ndarray
    val_images: Images
    y_val: np.ndarray
    test_images: Images
    y_test: np.ndarray
    backdoor_images: Images | None = None
    y_backdoor: np.ndarray | None = None
    lent: LentRows | None = None

    def clustered(self) -> SiloData:
        """Its data once its clustering is done: the lent validation rows train, the others
        still validate (rows no model of the run has trained on)."""
        if self.lent is None:
            return self
        x_val, rows = self.x_val, self.lent.rows
        kept = np.setdiff1d(np.arange(len(self.y_val)), rows)
        return replace(
            self,
            train_images=rows_of([self.x_train, x_val[rows]], self.lent.order),
            y_train=np.concatenate([self.y_train, self.y_val[rows]])[self.lent.order],
            val_images=rows_of([x_val], kept),
            y_val=self.y_val[kept],
            lent=None,
        )

    @property
    def x_train(self) -> np.ndarray:
        return as_floats(self.train_images)

    @property
    def x_val(self) -> np.ndarray:
        return as_floats(self.val_images)

    @property
    def x_test(self) -> np.ndarray:
        return as_floats(self.test_images)

    @property
    def x_backdoor(self) -> np.ndarray | None:
        return None if self.backdoor_images is None else as_floats(self.backdoor_images)


class DataConfig:
    """Base of a data set's frozen parameters (its `data:` section of the config)."""

    name: str
    # Whether each silo reads files of its own that only its rank sees: the server then learns
    # what it needs of them (shapes, classes, counts) in the agreement before the first round
    # (data/report.py) instead of from the parameters.
    per_silo_files: ClassVar[bool] = False
    # The fields that agreement fills in where the config leaves them null.
    agreed_fields: ClassVar[tuple[str, ...]] = ()

    # What callers read of any data set: None where its section has no such key (a section
    # that has one declares it as a field, which takes the place of these).
    @property
    def root(self) -> str | None:
        """The folder its files are read from (or fetched into)."""
        return None

    @property
    def classes(self) -> int | None:
        """The number of classes the config states, where it leaves them to no recipe."""
        return None

    @property
    def input_shape(self) -> list[int] | None:
        """The shape of one model input the config states, where the files alone would say."""
        return None

    @property
    def group_clusters(self) -> list[int] | None:
        """The true cluster of each group, where groups share clusters."""
        return None

    def problems(self, facts: DataFacts) -> Iterator[str]:
        """One config-error line per value the types cannot rule out (`data.<key>: …`)."""
        return iter(())

    def groups(self, silos: int) -> np.ndarray | None:
        """The known group of every silo (rotation, domain, a manifest's column), or None
        where the data set knows none: no ARI then, and no Oracle."""
        return None

    def true_clusters(self, silos: int) -> np.ndarray | None:
        """Ground-truth cluster of every silo: its group, mapped through `group_clusters` if set."""
        groups = self.groups(silos)
        if groups is None or self.group_clusters is None:
            return groups
        return np.asarray(self.group_clusters, dtype=np.int64)[groups]

    def num_classes(self) -> int:
        raise NotImplementedError

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        """The shape of one model input a silo holds: (channels, height, width) or (features,)."""
        raise NotImplementedError

    def backdoor_targets(self, silos: int) -> np.ndarray:
        """Which silos report accuracy on backdoored test images (none by default)."""
        return np.zeros(silos, dtype=bool)

    def lent_rows(self, facts: DataFacts) -> int:
        """The most examples a silo's training set gains once it is clustered (`LentRows`)."""
        return 0

    def check(self, facts: DataFacts) -> None:
        """Before any work, on every rank: ConfigError when the data cannot be found (nor fetched)."""

    def prepare(self, facts: DataFacts) -> None:
        """Rank 0, before any silo reads: fetch what is missing; ConfigError if impossible."""

    def start_note(self, facts: DataFacts) -> str | None:
        """A line the server says at the start about the data, or None."""
        return None

    def files_of(self, silo: int) -> str:
        """How errors name the silo's data (its file), or "" where it has none of its own."""
        return ""

    def build(self, silo: int, facts: DataFacts) -> SiloData:
        """Silo `silo`'s (0-based) own data: called by the process that hosts it, only."""
        raise NotImplementedError

    def read_for_agreement(self, silo: int, facts: DataFacts) -> SiloData:
        """`build`, for a silo's report in the agreement before the first round (`per_silo_files`)."""
        return self.build(silo, facts)

    def agreed(self, shape: tuple[int, ...], classes: int) -> DataConfig:
        """These parameters with what the silos agreed on filled in (`per_silo_files`)."""
        raise NotImplementedError


def input_size(shape: tuple[int, ...]) -> int:
    """Values in one model input."""
    return math.prod(shape)
