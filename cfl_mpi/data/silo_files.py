"""Silos that bring their own data: each silo's files, named per silo, read only by the process
that hosts the silo (the server reads none).

A silo's data is one of
- an `.npz` file, or a folder of `.npy` files (memory-mapped, never read whole), holding
  `x` and `y`, or splits already made: `x_train`/`y_train`, optionally `x_val`/`y_val`,
  `x_test`/`y_test` (and `x_backdoor`/`y_backdoor`, a backdoored test set to report on);
  `x` is images (N, H, W), (N, C, H, W) or (N, H, W, C), or feature vectors (N, F); uint8
  pixels are scaled to [0, 1], floats are taken as they are; `y` integer class labels;
- an image-folder tree: `train/<class>/*.png|jpg`, optional `val/` and `test/` alike.
A split a silo lacks is cut from what it has, seeded by the run's seed and the silo
(`data.test_fraction` of the examples for testing, `data.val_fraction` of the rest for
validation). The server learns of a silo's data only what the agreement before the first
round reports (data/agreement.py): the shape of one example, its labels' range and its
example counts.
"""

from __future__ import annotations

import csv
import functools
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from ..settings import ConfigError
from ..wire.messages import all_finite
from .images import model_layout, read_rgb, unit
from .spec import DataFacts, DataParams, SiloData

SPLITS = ("train", "val", "test", "backdoor")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
FINITE_CHUNK = 1 << 22  # values checked for NaN and inf at a time: a memory-mapped file is never read whole


@dataclass(frozen=True)
class SiloFiles(DataParams):
    """Every silo reads its own files, named per silo: give `files` or `manifest`."""

    per_silo_files: ClassVar[bool] = True
    agreed_fields: ClassVar[tuple[str, ...]] = ("input_shape", "classes")
    name: Literal["silo_files"] = "silo_files"
    # Each silo's data, a path with `{silo}` standing for its index (0-based; `{silo:03d}` pads
    # it): an .npz file, a folder of .npy files or an image-folder tree (`train/<class>/...`).
    files: str | None = None
    # Or a CSV file with a header row `silo,path` (optionally `,group`): one row per silo, its
    # path relative to the manifest's folder, and its known group (only used to score the
    # clustering against: ARI, the Oracle).
    manifest: str | None = None
    # Number of classes; null: learned before the first round, the largest label any silo
    # holds plus one.
    classes: int | None = None
    # Shape of one example ([channels, height, width] or [features]); null: learned before the
    # first round from the silos, which must all agree.
    input_shape: list[int] | None = None
    # Where the channels of 4-D image arrays are: auto takes (N, C, H, W) when the second axis
    # has 1 or 3 entries and the last does not, else (N, H, W, C).
    layout: Literal["auto", "nchw", "nhwc"] = "auto"
    # Image folders: the edge every image is resized to; null: the images' own (all one size).
    image_size: int | None = None
    # Image folders: the class folders' names in label order; null: the folders are named by
    # their labels (0, 1, ...).
    class_names: list[str] | None = None
    # A silo without its own test split holds this fraction of its examples out for testing.
    test_fraction: float = 0.2
    # A silo without its own validation split holds this fraction of its training examples out.
    val_fraction: float = 0.1
    # True cluster of each group of the manifest; null: every group is its own cluster.
    group_clusters: list[int] | None = None

    # ------------------------------------------------------------------ the config check
    def problems(self, facts: DataFacts) -> Iterator[str]:
        if (self.files is None) == (self.manifest is None):
            yield "data.files: give either data.files (a path with {silo}) or data.manifest (a CSV file), not both"
            return
        if self.files is not None and "{silo" not in self.files:
            yield f"data.files: {self.files!r} has no {{silo}} for the silo's index (e.g. sites/{{silo}}.npz)"
            return
        for name in ("test_fraction", "val_fraction"):
            frac = getattr(self, name)
            if not 0.0 < frac < 1.0:
                yield f"data.{name}: must lie strictly between 0 and 1, got {frac}"
        if self.classes is not None and self.classes < 2:
            yield f"data.classes: must be at least 2, got {self.classes}"
        if self.input_shape is not None and not (1 <= len(self.input_shape) <= 3 and min(self.input_shape) >= 1):
            yield f"data.input_shape: give [channels, height, width] or [features], got {self.input_shape}"
        if self.image_size is not None and self.image_size < 1:
            yield f"data.image_size: must be positive, got {self.image_size}"
        if self.manifest is not None:
            try:
                rows = _manifest(Path(self.manifest))
            except ConfigError as err:
                yield str(err)
                return
            if len(rows) != facts.silos:
                yield (
                    f"silos: data.manifest {self.manifest} lists {len(rows)} silos but silos is {facts.silos} "
                    f"(set silos to {len(rows)})"
                )
            groups = self.groups(facts.silos)
            if self.group_clusters is not None and (
                groups is None or len(self.group_clusters) != groups.max() + 1 or min(self.group_clusters) < 0
            ):
                yield (
                    f"data.group_clusters: give one non-negative cluster label per group of the manifest "
                    f"({0 if groups is None else groups.max() + 1}), got {self.group_clusters}"
                )

    # ------------------------------------------------------------------ what the run knows
    def groups(self, silos: int) -> np.ndarray | None:
        if self.manifest is None:
            return None
        rows = _manifest(Path(self.manifest))
        if any(group is None for _, group in rows):
            return None
        return np.array([group for _, group in rows], dtype=np.int64)

    def num_classes(self) -> int:
        if self.classes is None:
            raise RuntimeError("data.classes is learned in the agreement before the first round")
        return self.classes

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        if self.input_shape is None:
            raise RuntimeError("data.input_shape is learned in the agreement before the first round")
        return tuple(self.input_shape)

    def agreed(self, shape: tuple[int, ...], classes: int) -> SiloFiles:
        """These parameters with what the silos agreed on filled in."""
        return replace(self, input_shape=list(shape), classes=classes)

    def files_of(self, silo: int) -> str:
        return str(self.path(silo))

    def path(self, silo: int) -> Path:
        """Silo `silo`'s file or folder."""
        if self.files is not None:
            return Path(self.files.format(silo=silo))
        assert self.manifest is not None
        manifest = Path(self.manifest)
        return manifest.parent / _manifest(manifest)[silo][0]

    # ------------------------------------------------------------------ one silo's data
    def build(self, silo: int, facts: DataFacts) -> SiloData:
        """The silo's own data, checked (`problems_of` says what a silo's file may get wrong)."""
        key = self._key(silo, facts)
        with _BUILT_LOCK:
            kept = _BUILT.pop(key, None)
        return kept if kept is not None else self._read(silo, facts)

    def read_for_agreement(self, silo: int, facts: DataFacts) -> SiloData:
        """`build`, kept for the silo's `build` in this process: the agreement reads each file once."""
        data = self._read(silo, facts)
        with _BUILT_LOCK:
            _BUILT[self._key(silo, facts)] = data
        return data

    def _key(self, silo: int, facts: DataFacts) -> tuple[str, int, DataFacts]:
        """What a silo's read data is kept under: the parameters less what the agreement fills
        in, so that the agreed config's `build` finds what the agreement read."""
        return repr(replace(self, input_shape=None, classes=None)), silo, facts

    def _read(self, silo: int, facts: DataFacts) -> SiloData:
        path = self.path(silo)

        def fail(why: str) -> ConfigError:
            return ConfigError(f"data: silo {silo} ({path}): {why}")

        if not path.exists():
            raise fail("not found (each silo's file must be where data.files or data.manifest says)")
        try:
            arrays = self._arrays(path)
        except ConfigError as err:
            raise fail(str(err)) from None
        except Exception as err:  # a damaged file: whatever numpy or PIL raise
            detail = str(err).splitlines()[0][:200] if str(err) else "no detail"
            raise fail(f"cannot be read ({type(err).__name__}: {detail})") from None
        try:
            splits = self._splits(arrays, silo, facts.seed)
        except ConfigError as err:
            raise fail(str(err)) from None
        group = -1 if (groups := self.groups(facts.silos)) is None else int(groups[silo])
        backdoor = splits.get("backdoor")
        return SiloData(
            group,
            *splits["train"],
            *splits["val"],
            *splits["test"],
            *(backdoor if backdoor is not None else (None, None)),
        )

    def _arrays(self, path: Path) -> dict[str, Any]:
        """The arrays by name (`x`, `y` or `x_<split>`, `y_<split>`), memory-mapped where the
        format allows."""
        if path.is_file():
            if path.suffix != ".npz":
                raise ConfigError(
                    "is a file but not an .npz archive (give an .npz file, a folder of .npy files or an image folder)"
                )
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        if (path / "train").is_dir():
            return self._image_tree(path)
        npy = {p.stem: np.load(p, mmap_mode="c", allow_pickle=False) for p in sorted(path.glob("*.npy"))}
        if not npy:
            raise ConfigError("holds no .npy files and no train/ image folder")
        return npy

    def _image_tree(self, root: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for split in ("train", "val", "test"):
            folder = root / split
            if not folder.is_dir():
                continue
            images: list[np.ndarray] = []
            labels: list[int] = []
            for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
                label = self._label_of(class_dir.name)
                for file in sorted(class_dir.iterdir()):
                    if file.suffix.lower() not in IMAGE_EXTENSIONS:
                        continue
                    pixels = read_rgb(file, self.image_size)
                    if images and pixels.shape != images[0].shape:
                        raise ConfigError(
                            f"{file} is {pixels.shape[1]}x{pixels.shape[0]}, {split}'s first image "
                            f"{images[0].shape[1]}x{images[0].shape[0]} (set data.image_size to resize them all)"
                        )
                    images.append(pixels)
                    labels.append(label)
            out[f"x_{split}"] = np.stack(images) if images else np.zeros((0, 1, 1, 3), np.uint8)
            out[f"y_{split}"] = np.array(labels, dtype=np.int64)
        return out

    def _label_of(self, folder: str) -> int:
        if self.class_names is not None:
            if folder not in self.class_names:
                raise ConfigError(f"class folder {folder!r} is not in data.class_names")
            return self.class_names.index(folder)
        if not folder.isdigit():
            raise ConfigError(f"class folder {folder!r} is not a label (name them 0, 1, ... or set data.class_names)")
        return int(folder)

    def _splits(self, arrays: dict[str, Any], silo: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Model-ready (x, y) of every split, those the silo lacks cut from what it has."""
        given = {s: (arrays[f"x_{s}"], arrays[f"y_{s}"]) for s in SPLITS if f"x_{s}" in arrays and f"y_{s}" in arrays}
        if "x" in arrays and "y" in arrays:
            if "train" in given:
                raise ConfigError("holds both x/y and x_train/y_train (keep one)")
            given["all"] = (arrays["x"], arrays["y"])
        elif "train" not in given:
            raise ConfigError(
                f"holds no x and y, nor x_train and y_train (it holds {', '.join(sorted(arrays)) or 'nothing'})"
            )
        for name, (x, y) in given.items():
            if len(x) != len(y):
                raise ConfigError(f"x_{name} holds {len(x)} examples but y_{name} {len(y)} labels")
        rng = np.random.default_rng([seed, 17, silo])
        pool = given.pop("all") if "all" in given else given.pop("train")
        n = len(pool[1])
        test_idx = None
        if "test" not in given:
            perm = rng.permutation(n)
            n_test = int(round(self.test_fraction * n))
            test_idx, rest = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        else:
            rest = np.arange(n)
        if "val" not in given:
            perm = rng.permutation(len(rest))
            n_val = int(round(self.val_fraction * len(rest)))
            val_idx, train_idx = rest[np.sort(perm[:n_val])], rest[np.sort(perm[n_val:])]
        else:
            val_idx, train_idx = None, rest
        parts: dict[str, tuple[Any, Any, np.ndarray | None]] = {"train": (*pool, train_idx)}
        parts["val"] = (*given["val"], None) if val_idx is None else (*pool, val_idx)
        parts["test"] = (*given["test"], None) if test_idx is None else (*pool, test_idx)
        if "backdoor" in given:
            parts["backdoor"] = (*given["backdoor"], None)
        out = {}
        for split, (x, y, idx) in parts.items():
            whole = idx is None or (len(idx) == len(y) and np.array_equal(idx, np.arange(len(y))))
            out[split] = (
                self._examples(x, None if whole else idx, split),
                self._labels(np.asarray(y) if whole else np.asarray(y)[idx], split),
            )
            if len(out[split][1]) == 0 and split != "backdoor":
                raise ConfigError(
                    f"too few examples for a {split} set ({n} in all; data.val_fraction {self.val_fraction}, "
                    f"data.test_fraction {self.test_fraction}; give more, or give x_{split}/y_{split})"
                )
        shapes = {split: xy[0].shape[1:] for split, xy in out.items()}
        if len(set(shapes.values())) > 1:
            raise ConfigError(f"its splits hold examples of different shapes ({shapes})")
        return out

    def _examples(self, x: Any, idx: np.ndarray | None, split: str) -> np.ndarray:
        """The examples `idx` (None: all) as float32, images NCHW laid out as the built-in data
        sets lay theirs (images.model_layout, whose strides decide torch's kernels: the same
        layout, the same rounding): uint8 pixels scaled to [0, 1], other numbers as they are.
        Float32 examples already in that layout are taken as they are (a memory map stays one);
        others are read and converted a chunk at a time straight into the one array they end
        in. NaN and inf are looked for a chunk at a time."""
        if x.dtype.kind not in "uifb":
            raise ConfigError(f"x_{split} is of dtype {x.dtype}, not numbers")
        if x.ndim not in (2, 3, 4):
            raise ConfigError(
                f"x_{split} has shape {x.shape}: give images (N, H, W), (N, C, H, W), (N, H, W, C) or vectors (N, F)"
            )
        nchw = x.ndim == 4 and not self._channels_last(x.shape)
        if idx is None and (view := _model_view(x, nchw)) is not None:
            _check_finite(view, split)
            return view
        n = len(x) if idx is None else len(idx)
        if x.ndim == 2:
            out = np.empty((n, x.shape[1]), dtype=np.float32)
        elif x.ndim == 3 or (x.shape[1] if nchw else x.shape[3]) == 1:  # one channel: NHWC memory (model_layout)
            out = np.empty((n, *(x.shape[2:] if nchw else x.shape[1:3]), 1), dtype=np.float32)
        else:
            out = np.empty((n, *(x.shape[1:] if nchw else (x.shape[3], *x.shape[1:3]))), dtype=np.float32)
        step = max(1, FINITE_CHUNK // max(1, math.prod(x.shape[1:])))
        for start in range(0, n, step):
            rows = np.asarray(x[start : start + step] if idx is None else x[idx[start : start + step]])
            if x.ndim == 3:
                rows = rows[..., None]
            elif x.ndim == 4 and out.shape[-1] == 1 and nchw:
                rows = np.moveaxis(rows, 1, 3)
            elif x.ndim == 4 and out.shape[-1] != 1 and not nchw:
                rows = np.moveaxis(rows, 3, 1)
            out[start : start + step] = unit(rows)
        _check_finite(out, split)
        return model_layout(out) if out.ndim == 4 and out.shape[-1] == 1 else out

    def _channels_last(self, shape: tuple[int, ...]) -> bool:
        if self.layout != "auto":
            return self.layout == "nhwc"
        return not (shape[1] in (1, 3) and shape[3] not in (1, 3))

    def _labels(self, y: np.ndarray, split: str) -> np.ndarray:
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise ConfigError(f"y_{split} must be one integer label per example, got {y.dtype} of shape {y.shape}")
        if len(y) and y.min() < 0:
            raise ConfigError(f"y_{split} holds the label {int(y.min())} (labels run from 0)")
        if self.classes is not None and len(y) and y.max() >= self.classes:
            raise ConfigError(
                f"y_{split} holds the label {int(y.max())}, out of range for data.classes {self.classes} "
                f"(labels run from 0 to {self.classes - 1})"
            )
        return y.astype(np.int64)


def _model_view(x: Any, nchw: bool) -> np.ndarray | None:
    """`x` itself as the model's examples, where it already holds float32 in their layout (no
    copy: a memory map stays one); None where it must be converted. One-channel images get the
    strides `images.model_layout` gives them, the channel axis one element wide, which address
    the same bytes."""
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    if x.ndim == 2 or (x.ndim == 4 and nchw and x.shape[1] != 1):
        return x
    one_channel = x.ndim == 3 or (x.ndim == 4 and (x.shape[1] if nchw else x.shape[3]) == 1)
    if not one_channel:
        return None
    h, w = (int(a) for a in (x.shape[1:3] if x.ndim == 3 or not nchw else x.shape[2:]))
    item = x.itemsize
    return np.lib.stride_tricks.as_strided(x, (len(x), 1, h, w), (h * w * item, item, w * item, item))


def _check_finite(x: np.ndarray, split: str) -> None:
    """NaN or inf anywhere in `x` is the silo's error; read a chunk at a time (a memory map too)."""
    step = max(1, FINITE_CHUNK // max(1, math.prod(x.shape[1:])))
    for start in range(0, len(x), step):
        if not all_finite(np.asarray(x[start : start + step])):
            raise ConfigError(f"x_{split} holds NaN or infinite values (among examples {start} to {start + step - 1})")


_BUILT: dict[tuple[str, int, DataFacts], SiloData] = {}  # read for the agreement, taken by `build`
_BUILT_LOCK = threading.Lock()


def _manifest(path: Path) -> tuple[tuple[str, int | None], ...]:
    """(path, group or None) of every silo, in silo order, from a `silo,path[,group]` CSV file,
    read again only when it changed."""
    if not path.is_file():
        raise ConfigError(
            f"data.manifest: {path} not found (give a CSV file with the columns silo,path and optionally group)"
        )
    stat = path.stat()
    return _read_manifest(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_manifest(path: Path, mtime_ns: int, size: int) -> tuple[tuple[str, int | None], ...]:
    where = f"data.manifest: {path}"
    try:
        with path.open(newline="") as file:
            rows = list(csv.DictReader(file))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"{where} cannot be read ({type(err).__name__})") from None
    if not rows or not {"silo", "path"} <= set(rows[0]):
        raise ConfigError(f"{where} needs a header row with the columns silo,path (and optionally group)")
    entries: dict[int, tuple[str, int | None]] = {}
    for line, row in enumerate(rows, start=2):
        try:
            silo = int(row["silo"])
            group = int(row["group"]) if row.get("group") not in (None, "") else None
        except ValueError:
            raise ConfigError(f"{where} line {line}: silo and group must be integers") from None
        if silo in entries or silo < 0 or not row["path"]:
            raise ConfigError(f"{where} line {line}: silo {silo} is listed twice, negative or without a path")
        if group is not None and group < 0:
            raise ConfigError(f"{where} line {line}: group {group} is negative")
        entries[silo] = (row["path"], group)
    if sorted(entries) != list(range(len(entries))):
        raise ConfigError(f"{where}: the silos must be numbered 0 to {len(entries) - 1}, each once")
    return tuple(entries[s] for s in range(len(entries)))
