"""MNIST from its original IDX files, in torchvision's layout or a plain folder."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

SPLIT_SIZES = {"train": 60_000, "test": 10_000}  # images per split
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


class MissingDataError(FileNotFoundError):
    """A data set's files are not where the config says."""


# Where in data.root the files may lie: directly, or in torchvision's layout; LAYOUT says it to users.
FOLDERS = (".", "MNIST/raw")
LAYOUT = "DIR holds the IDX files (gzipped or not) directly or in DIR/MNIST/raw, as torchvision lays them out"


def _find(root: Path, name: str) -> Path | None:
    for folder in (root / f for f in FOLDERS):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (optionally gzipped): big-endian header, then uint8 data."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, file holds {array.size} bytes")
    return array.reshape(shape)


def missing_files(root: Path, splits: tuple[str, ...]) -> list[str]:
    return [name for split in splits for name in FILES[split] if _find(root, name) is None]


def download(root: Path) -> None:
    """Fetch MNIST into `<root>/MNIST/raw` with torchvision (needs a network)."""
    from torchvision.datasets import MNIST  # heavy import: only when downloading

    for train in (True, False):
        MNIST(str(root), train=train, download=True)


def load_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(n, 28, 28) floats in [0, 1] and int64 labels of one MNIST split."""
    images, labels = load_split_uint8(root, split)
    return images.astype(np.float64) / 255.0, labels


def load_split_uint8(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(n, 28, 28) uint8 pixels and int64 labels of one MNIST split (a quarter of the memory)."""
    images_name, labels_name = FILES[split]
    images, labels = _find(root, images_name), _find(root, labels_name)
    if images is None or labels is None:
        raise MissingDataError(f"MNIST {split} files not found in {root}")
    return read_idx(images), read_idx(labels).astype(np.int64)
