"""Silos that bring their own data: each silo's files, named per silo, read only by the process
that hosts the silo (the server reads none).

A silo's data is one of
- an `.npz` file, or a folder of `.npy` files (memory-mapped, never read whole), holding
  `x` and `y`, or splits already made: `x_train`/`y_train`, optionally `x_val`/`y_val`,
  `x_test`/`y_test` (and `x_backdoor`/`y_backdoor`, a backdoored test set to report on);
  `x` is images (N, H, W), (N, C, H, W) or (N, H, W, C), or feature vectors (N, F); uint8
  pixels are scaled to [0, 1], floats are taken as they are; `y` class labels as a site has
  them (labels.py);
- an image-folder tree: `train/<class>/*.png|jpg`, optional `val/` and `test/` alike
  (image_folders.py).
A split a silo lacks is cut from what it has, seeded by the run's seed and the silo
(`data.test_fraction` of the examples for testing, `data.val_fraction` of the rest for
validation). Errors name the user's own arrays and rows, never the splits cut from them. The
server learns of a silo's data only what the agreement before the first round reports
(data/report.py): the shape of one example, its labels' range and its example counts.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from ..settings import ConfigError
from ..wire.messages import all_finite
from .image_folders import read_tree
from .images import model_layout, unit
from .labels import class_indices
from .manifest import Manifest, read_manifest
from .report import shape_text
from .spec import DataConfig, DataFacts, LentRows, SiloData

SPLITS = ("train", "val", "test", "backdoor")
FINITE_CHUNK = 1 << 22  # values checked for NaN and inf at a time: a memory-mapped file is never read whole
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R 601-2, PIL's colour-to-grey weights


@dataclass(frozen=True)
class SiloFiles(DataConfig):
    """Every silo reads its own files, named per silo: give `files` or `manifest`."""

    per_silo_files: ClassVar[bool] = True
    agreed_fields: ClassVar[tuple[str, ...]] = ("input_shape", "classes")
    name: Literal["silo_files"] = "silo_files"
    # Each silo's data, a path with `{silo}` standing for its index (0-based; `{silo:03d}` pads
    # it): an .npz file, a folder of .npy files or an image-folder tree (`train/<class>/...`).
    files: str | None = None
    # Or a CSV file with a header row `silo,path` (optionally `,group`): one row per silo, its
    # path relative to the manifest's folder, and its known group, any label (only used to
    # score the clustering against: ARI, the Oracle).
    manifest: str | None = None
    # Number of classes; null: learned before the first round, the largest label any silo
    # holds plus one (at least the length of data.class_names).
    classes: int | None = None
    # Shape of one example ([channels, height, width] or [features]); null: learned before the
    # first round from the silos, which must all agree.
    input_shape: list[int] | None = None
    # Where the channels of 4-D image arrays are: auto takes (N, C, H, W) when the second axis
    # has 1 or 3 entries and the last does not, else (N, H, W, C).
    layout: Literal["auto", "nchw", "nhwc"] = "auto"
    # Image folders: the edge every image is resized to; null: the images' own (all one size).
    image_size: int | None = None
    # Channels of every image (folders and arrays): null, the files' own (grey images 1,
    # colour 3); 1 makes colour grey (ITU-R 601-2 luma), 3 repeats grey into three (the
    # ImageNet models take 3).
    channels: Literal[1, 3] | None = None
    # The classes' names in label order: image folders' class folders, or text labels in y;
    # null: folders are named by their labels (0, 1, ...) and y holds numbers.
    class_names: list[str] | None = None
    # A silo without its own test split holds this fraction of its examples out for testing.
    test_fraction: float = 0.2
    # A silo without its own validation split holds this fraction of its training examples out.
    # "auto": 10 %, and for a strategy that reads it (EMD-CFL's τ and noise) at least 32
    # examples on a small site, at most 40 % of it; those beyond the 10 % train again once
    # the silo is clustered.
    val_fraction: float | Literal["auto"] = "auto"
    # True cluster of each group of the manifest (groups numbered 0, 1, ... are their own
    # index; named groups are indexed in the order they first appear, silo 0's first); null:
    # every group is its own cluster.
    group_clusters: list[int] | None = None

    # ------------------------------------------------------------------ the config check
    def problems(self, facts: DataFacts) -> Iterator[str]:
        if (self.files is None) == (self.manifest is None):
            yield "data.files: give either data.files (a path with {silo}) or data.manifest (a CSV file), not both"
            return
        if self.files is not None and "{silo" not in self.files:
            yield f"data.files: {self.files!r} has no {{silo}} for the silo's index (e.g. sites/{{silo}}.npz)"
            return
        if not 0.0 < self.test_fraction < 1.0:
            yield f"data.test_fraction: must lie strictly between 0 and 1, got {self.test_fraction}"
        if self.val_fraction != "auto" and not 0.0 < self.val_fraction < 1.0:
            yield f"data.val_fraction: must lie strictly between 0 and 1 or be auto, got {self.val_fraction}"
        if self.classes is not None and self.classes < 2:
            yield f"data.classes: must be at least 2, got {self.classes}"
        if self.input_shape is not None and not (1 <= len(self.input_shape) <= 3 and min(self.input_shape) >= 1):
            yield f"data.input_shape: give [channels, height, width] or [features], got {self.input_shape}"
        if self.image_size is not None and self.image_size < 1:
            yield f"data.image_size: must be positive, got {self.image_size}"
        if self.channels == 1 and facts.imagenet:
            yield "data.channels: the ImageNet models (model.name) take 3-channel images, got 1 (set it to 3 or null)"
        if self.class_names is not None:
            if len(set(self.class_names)) != len(self.class_names) or not self.class_names:
                yield f"data.class_names: give each class's name once, got {self.class_names}"
            elif self.classes is not None and len(self.class_names) != self.classes:
                yield (
                    f"data.class_names: lists {len(self.class_names)} classes but data.classes is {self.classes} "
                    "(give one name per class)"
                )
        if self.manifest is not None:
            try:
                manifest = read_manifest(Path(self.manifest))
            except ConfigError as err:
                yield str(err)
                return
            if len(manifest.rows) != facts.silos:
                yield (
                    f"silos: data.manifest {self.manifest} lists {len(manifest.rows)} silos but silos is {facts.silos} "
                    f"(set silos to {len(manifest.rows)})"
                )
            yield from self._group_problems(manifest)

    def _group_problems(self, manifest: Manifest) -> Iterator[str]:
        names = manifest.group_names()
        if self.group_clusters is None or (
            names is not None and len(self.group_clusters) == len(names) and min(self.group_clusters) >= 0
        ):
            return
        if names is None:
            yield "data.group_clusters: the manifest gives no groups (add a group column, or remove this setting)"
            return
        named = names != [str(g) for g in range(len(names))]
        order = f", in this order: {', '.join(names[:12])}{', ...' if len(names) > 12 else ''}" if named else ""
        yield (
            f"data.group_clusters: give one non-negative cluster label per group of the manifest "
            f"({len(names)}{order}), got {self.group_clusters}"
        )

    # ------------------------------------------------------------------ what the run knows
    def groups(self, silos: int) -> np.ndarray | None:
        return None if self.manifest is None else read_manifest(Path(self.manifest)).group_ids()

    def num_classes(self) -> int:
        if self.classes is None:
            raise RuntimeError("data.classes is learned in the agreement before the first round")
        return self.classes

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        if self.input_shape is None:
            raise RuntimeError("data.input_shape is learned in the agreement before the first round")
        return tuple(self.input_shape)

    def agreed(self, shape: tuple[int, ...], classes: int) -> SiloFiles:
        """These parameters with what the silos agreed on filled in: a class that data.class_names
        lists keeps its place in the model though no silo holds it."""
        return replace(self, input_shape=list(shape), classes=max(classes, len(self.class_names or ())))

    def files_of(self, silo: int) -> str:
        return str(self.path(silo))

    def path(self, silo: int) -> Path:
        """Silo `silo`'s file or folder."""
        if self.files is not None:
            return Path(self.files.format(silo=silo))
        assert self.manifest is not None
        manifest = Path(self.manifest)
        return manifest.parent / read_manifest(manifest).rows[silo].path

    def lent_rows(self, facts: DataFacts) -> int:
        return VALIDATION_FLOOR if self.val_fraction == "auto" and facts.validation else 0

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
            if self.manifest is not None:
                where = read_manifest(Path(self.manifest)).where(silo)
                raise fail(f"not found ({where} names it: fix the path there, relative to the manifest's folder)")
            raise fail(f"not found (data.files {self.files} names it for silo {silo}: put the data there)")
        try:
            arrays, layout = self._arrays(path)
        except ConfigError as err:
            raise fail(str(err)) from None
        except Exception as err:  # noqa: BLE001 - a damaged file: whatever numpy or zipfile raise
            raise fail(_unreadable(err)) from None
        try:
            splits, lent = self._splits(arrays, layout, silo, facts)
        except ConfigError as err:
            raise fail(str(err)) from None
        group = -1 if (groups := self.groups(facts.silos)) is None else int(groups[silo])
        backdoor_images, y_backdoor = splits.get("backdoor", (None, None))
        return SiloData(group, *splits["train"], *splits["val"], *splits["test"], backdoor_images, y_backdoor, lent)

    def _arrays(self, path: Path) -> tuple[dict[str, Any], str]:
        """The arrays by name (`x`, `y` or `x_<split>`, `y_<split>`), memory-mapped where the
        format allows, and their layout (`tree`: an image folder's, (N, H, W, C))."""
        if path.is_file():
            if path.suffix != ".npz":
                raise ConfigError(
                    "is a file but not an .npz archive (give an .npz file, a folder of .npy files or an image folder)"
                )
            with np.load(path, allow_pickle=False) as archive:
                return {name: _member(archive, name) for name in archive.files}, self.layout
        if (path / "train").is_dir():
            return read_tree(path, self.image_size, self.channels, self.class_names), "tree"
        npy = {p.stem: _memory_map(p) for p in sorted(path.glob("*.npy"))}
        if not npy:
            raise ConfigError("holds no .npy files and no train/ image folder")
        return npy, self.layout

    def _splits(
        self, arrays: dict[str, Any], layout: str, silo: int, facts: DataFacts
    ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], LentRows | None]:
        """Model-ready (x, y) of every split, those the silo lacks cut from what it has, and
        the validation rows lent to the clustering (`validation_rows`)."""
        given = {s: (f"x_{s}", f"y_{s}") for s in SPLITS if f"x_{s}" in arrays and f"y_{s}" in arrays}
        if "x" in arrays and "y" in arrays:
            if "train" in given:
                raise ConfigError("holds both x/y and x_train/y_train (keep one)")
            pool = ("x", "y")
        elif "train" in given:
            pool = given.pop("train")
        else:
            raise ConfigError(
                f"holds no x and y, nor x_train and y_train (it holds {', '.join(sorted(arrays)) or 'nothing'})"
            )
        labels: dict[str, np.ndarray] = {}
        for x_key, y_key in (pool, *given.values()):
            if len(arrays[x_key]) != len(arrays[y_key]):
                raise ConfigError(
                    f"{x_key} holds {len(arrays[x_key])} examples but {y_key} {len(arrays[y_key])} labels "
                    "(give one label per example)"
                )
            labels[y_key] = class_indices(np.asarray(arrays[y_key]), y_key, self.class_names, self.classes)
        rng = np.random.default_rng([facts.seed, 17, silo])
        n = len(labels[pool[1]])
        test_idx = None
        if "test" not in given:
            perm = rng.permutation(n)
            n_test = int(round(self.test_fraction * n))
            test_idx, rest = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        else:
            rest = np.arange(n)
        lent = None
        if "val" not in given:
            perm = rng.permutation(len(rest))
            n_val = validation_rows(self.val_fraction, len(rest), facts.validation)
            val_idx, train_idx = rest[np.sort(perm[:n_val])], rest[np.sort(perm[n_val:])]
            # the rows beyond the 10 % every other strategy holds out rejoin training once clustered
            if (n_kept := validation_rows(self.val_fraction, len(rest), False)) < n_val:
                kept = np.isin(val_idx, rest[perm[:n_kept]])
                lent = LentRows(np.flatnonzero(~kept), np.argsort(np.concatenate([train_idx, val_idx[~kept]])))
        else:
            val_idx, train_idx = None, rest
        parts: dict[str, tuple[tuple[str, str], np.ndarray | None]] = {"train": (pool, train_idx)}
        parts["val"] = (given["val"], None) if val_idx is None else (pool, val_idx)
        parts["test"] = (given["test"], None) if test_idx is None else (pool, test_idx)
        if "backdoor" in given:
            parts["backdoor"] = (given["backdoor"], None)
        out = {}
        for split, ((x_key, y_key), idx) in parts.items():
            y = labels[y_key] if idx is None else labels[y_key][idx]
            if len(y) == 0 and split != "backdoor":
                raise ConfigError(
                    f"too few examples for a {split} set ({n} in all; data.val_fraction {self.val_fraction}, "
                    f"data.test_fraction {self.test_fraction}; give more, or give x_{split}/y_{split})"
                )
            whole = idx is None or (len(idx) == len(labels[y_key]) and np.array_equal(idx, np.arange(len(idx))))
            name = f"{x_key[2:]}/" if layout == "tree" else x_key  # how errors name the array
            out[split] = (self._examples(arrays[x_key], None if whole else idx, name, layout, facts.imagenet), y)
        shapes = {x_key: out[split][0].shape[1:] for split, ((x_key, _), _) in parts.items()}
        if len(set(shapes.values())) > 1:
            said = ", ".join(
                f"{key[2:] + '/' if layout == 'tree' else key} {shape_text(s)}" for key, s in shapes.items()
            )
            raise ConfigError(
                f"its splits hold examples of different shapes ({said}; give them one, for image folders "
                "with data.image_size)"
            )
        return out, lent

    def _examples(self, x: Any, idx: np.ndarray | None, key: str, layout: str, imagenet: bool) -> np.ndarray:
        """The examples `idx` (None: all) of the array `key` as float32, images NCHW with
        `data.channels` laid out as the built-in data sets lay theirs (images.model_layout,
        whose strides decide torch's kernels: the same layout, the same rounding): uint8
        pixels scaled to [0, 1], other numbers as they are. Float32 examples already in that
        layout are taken as they are (a memory map stays one); others are read and converted a
        chunk at a time straight into the one array they end in. NaN and inf are looked for a
        chunk at a time."""
        if x.dtype.kind not in "uifb":
            raise ConfigError(f"{key} is of dtype {x.dtype}, not numbers")
        if x.ndim not in (2, 3, 4):
            raise ConfigError(
                f"{key} has shape {x.shape}: give images (N, H, W), (N, C, H, W), (N, H, W, C) or vectors (N, F)"
            )
        last = x.ndim == 3 or (x.ndim == 4 and self._channels_last(x.shape, layout))
        have = 0 if x.ndim == 2 else 1 if x.ndim == 3 else x.shape[3] if last else x.shape[1]
        want = self._channels_of(key, x.shape, have, imagenet)
        nchw = x.ndim == 4 and not last
        if idx is None and want == have and (view := _model_view(x, nchw)) is not None:
            _check_finite(view, key, None, len(x))
            return view
        n = len(x) if idx is None else len(idx)
        edges = x.shape[1:3] if last else x.shape[2:]
        shape = (x.shape[1],) if x.ndim == 2 else (*edges, 1) if want == 1 else (want, *edges)
        out = np.empty((n, *shape), dtype=np.float32)  # one channel: NHWC memory (model_layout)
        step = max(1, FINITE_CHUNK // max(1, math.prod(x.shape[1:])))
        for start in range(0, n, step):
            rows = unit(np.asarray(x[start : start + step] if idx is None else x[idx[start : start + step]]))
            if x.ndim > 2:
                given = rows[..., None] if x.ndim == 3 else rows if last else np.moveaxis(rows, 1, 3)
                nhwc = _with_channels(given, want)
                rows = nhwc if want == 1 else np.moveaxis(nhwc, 3, 1)
            out[start : start + step] = rows
        _check_finite(out, key, idx, len(x))
        return model_layout(out) if want == 1 else out

    def _channels_of(self, key: str, shape: tuple[int, ...], have: int, imagenet: bool) -> int:
        """The channels the examples of `key` get (0 for feature vectors); ConfigError with the
        fix where data.channels or the model asks for what they cannot give."""
        if have == 0:
            if self.channels is not None:
                raise ConfigError(f"{key} holds feature vectors {shape}, which have no channels (remove data.channels)")
            return 0
        want = self.channels or have
        if want != have and have not in (1, 3):
            raise ConfigError(f"the images of {key} have {have} channels, not 1 or 3 as data.channels {want} converts")
        if imagenet and want != 3:
            fix = "set data.channels: 3 to repeat the grey into three" if want == 1 else "give 3-channel images"
            raise ConfigError(
                f"the images of {key} have {want} channel{'s' * (want > 1)}, the ImageNet models (model.name) "
                f"take 3 ({fix})"
            )
        return want

    def _channels_last(self, shape: tuple[int, ...], layout: str) -> bool:
        if layout != "auto":
            return layout in ("nhwc", "tree")
        return not (shape[1] in (1, 3) and shape[3] not in (1, 3))


VALIDATION_FLOOR, VALIDATION_MOST = 32, 0.4


def validation_rows(share: float | str, examples: int, read: bool) -> int:
    """How many of a site's `examples` (its test share out) it holds out for validation.

    `auto`: the paper's 10 %; where the strategy `read`s the validation set (EMD-CFL's τ and
    noise), at least VALIDATION_FLOOR examples, at most VALIDATION_MOST of the site: τ and the
    noise measured on 8 validation examples of a 95-row site are mostly their own sampling
    error, and the robust rule then finds no groups (docs/methods/emdcfl.md, "Sample sizes"). The
    rows beyond the 10 % are lent (`LentRows`): at most VALIDATION_FLOOR, they rejoin training
    once the silo is clustered. A strategy that never reads it keeps the 10 % its runs always
    held out."""
    if share == "auto":
        share = min(VALIDATION_MOST, max(0.1, VALIDATION_FLOOR / examples)) if read and examples else 0.1
    return int(round(float(share) * examples))


def _with_channels(nhwc: np.ndarray, channels: int) -> np.ndarray:
    """Float images (n, h, w, c) with `channels` channels: grey repeated, colour made grey by luma."""
    if nhwc.shape[-1] == channels:
        return nhwc
    if channels == 3:
        return np.repeat(nhwc, 3, axis=-1)
    return (nhwc @ LUMA)[..., None]


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


def _check_finite(x: np.ndarray, key: str, idx: np.ndarray | None, rows: int) -> None:
    """NaN or inf anywhere in `x` (the rows `idx` of the array `key`, None: all its `rows`) is
    the silo's error, naming the first such row of the user's array; read a chunk at a time
    (a memory map too)."""
    step = max(1, FINITE_CHUNK // max(1, math.prod(x.shape[1:])))
    for start in range(0, len(x), step):
        chunk = np.asarray(x[start : start + step])
        if not all_finite(chunk):
            first = start + int(np.flatnonzero(~np.isfinite(chunk.reshape(len(chunk), -1)).all(axis=1))[0])
            row = first if idx is None else int(idx[first])
            raise ConfigError(f"{key} row {row} (of {rows} rows) holds NaN or infinite values (fix or drop that row)")


def _member(archive: Any, name: str) -> np.ndarray:
    """The array `name` of an .npz archive; an array of Python objects (which would need
    pickle, never loaded from a silo's file) is the silo's error, with the fix."""
    try:
        return archive[name]
    except ValueError as err:
        if "allow_pickle" not in str(err):
            raise
        raise ConfigError(
            f"{name} holds Python objects, which are never unpickled "
            f"(save numbers, or text labels as {name}.astype(str))"
        ) from None


def _unreadable(err: Exception) -> str:
    """Why a silo's file cannot be read, as its error says it, with the fix."""
    detail = str(err).splitlines()[0][:200] if str(err) else "no detail"
    fix = "let the job's user read it" if isinstance(err, PermissionError) else "copy it again, or save it anew"
    return f"cannot be read ({type(err).__name__}: {detail}; {fix})"


def _memory_map(path: Path) -> np.ndarray:
    """The .npy file at `path`, memory-mapped (opened, not read) once its header is checked
    against its size: a file cut short would otherwise fail on first touch (SIGBUS). Errors
    name the file by its name, the silo's error its folder."""
    fmt = np.lib.format
    try:
        with path.open("rb") as file:
            version = fmt.read_magic(file)
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read_header(file)
            offset = file.tell()
    except Exception as err:  # noqa: BLE001 - whatever numpy raises on a damaged header
        raise ConfigError(f"{path.name} {_unreadable(err)}") from None
    if dtype.hasobject:
        raise ConfigError(f"{path.name} holds Python objects, which are never unpickled (save numbers, or text as str)")
    expected = offset + math.prod(shape) * dtype.itemsize
    actual = path.stat().st_size
    if actual < expected:
        raise ConfigError(
            f"{path.name} is cut short: its header gives {shape} of {dtype}, {expected} bytes, the file holds {actual} "
            "(copy it again)"
        )
    return np.load(path, mmap_mode="c", allow_pickle=False)


_BUILT: dict[tuple[str, int, DataFacts], SiloData] = {}  # read for the agreement, taken by `build`
_BUILT_LOCK = threading.Lock()
