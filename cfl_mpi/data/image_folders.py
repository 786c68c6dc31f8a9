"""A silo's image-folder tree, `train/<class>/*.png|jpg` with optional `val/` and `test/`
alike, as the arrays `x_<split>` (N, H, W, C) and `y_<split>` of its splits. Every image is
decoded here, so that a damaged one is an error naming that image (by its path in the tree,
the silo's error naming the tree), not only its folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..settings import ConfigError
from .images import read_image, unit

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
TREE_SPLITS = ("train", "val", "test")


def read_tree(
    root: Path, image_size: int | None, channels: int | None, class_names: list[str] | None
) -> dict[str, np.ndarray]:
    """The splits of the tree at `root` (those it has): images of one size and channel count
    (uint8, or float32 in [0, 1] where any image is 16-bit grey) and their class indices."""
    out: dict[str, np.ndarray] = {}
    for split in TREE_SPLITS:
        folder = root / split
        if not folder.is_dir():
            continue
        images: list[np.ndarray] = []
        labels: list[int] = []
        first: Path | None = None
        for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            label = _label_of(class_dir.name, class_names)
            for file in sorted(class_dir.iterdir()):
                if file.suffix.lower() not in IMAGE_EXTENSIONS:
                    continue
                pixels = _decoded(file, root, image_size, channels)
                if first is None:
                    first = file
                elif pixels.shape != images[0].shape:
                    fix = "data.channels: 1 or 3" if pixels.shape[:2] == images[0].shape[:2] else "data.image_size"
                    raise ConfigError(
                        f"image {file.relative_to(root)} is {_kind(pixels)}, {split}'s first image "
                        f"{first.relative_to(root)} {_kind(images[0])} "
                        f"(set {fix} to give them all one)"
                    )
                images.append(pixels)
                labels.append(label)
        if any(image.dtype != np.uint8 for image in images):  # 16-bit grey: every image as floats in [0, 1]
            images = [unit(image) for image in images]
        out[f"x_{split}"] = np.stack(images) if images else np.zeros((0, 1, 1, channels or 3), np.uint8)
        out[f"y_{split}"] = np.array(labels, dtype=np.int64)
    return out


def _decoded(file: Path, root: Path, image_size: int | None, channels: int | None) -> np.ndarray:
    try:
        return read_image(file, image_size, channels)
    except Exception as err:  # noqa: BLE001 - whatever PIL raises on a damaged or foreign file
        detail = str(err).splitlines()[0][:200] if str(err) else "no detail"
        raise ConfigError(
            f"image {file.relative_to(root)} cannot be read ({type(err).__name__}: {detail}; replace or remove it)"
        ) from None


def _label_of(folder: str, class_names: list[str] | None) -> int:
    if class_names is not None:
        if folder not in class_names:
            raise ConfigError(f"class folder {folder!r} is not in data.class_names (add it there)")
        return class_names.index(folder)
    if not folder.isdigit():
        raise ConfigError(f"class folder {folder!r} is not a label (name them 0, 1, ... or set data.class_names)")
    return int(folder)


def _kind(pixels: np.ndarray) -> str:
    """An image's size and colour, as an error says them: 28x28 grey."""
    height, width, channels = pixels.shape
    return f"{width}x{height} {'grey' if channels == 1 else 'colour'}"
