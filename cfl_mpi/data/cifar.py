"""CIFAR-10 from its pickled Python batches, in torchvision's layout `<root>/cifar-10-batches-py`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FOLDER = "cifar-10-batches-py"
SPLIT_SIZES = {"train": 50_000, "test": 10_000}  # images per split
FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
LAYOUT = (
    f"DIR/{FOLDER} holds data_batch_1 to data_batch_5 and test_batch (cifar-10-python.tar.gz unpacked, "
    "as torchvision lays it out)"
)
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def missing_files(root: Path, splits: tuple[str, ...]) -> list[str]:
    return [name for split in splits for name in FILES[split] if not (root / FOLDER / name).is_file()]


def download(root: Path) -> None:
    """Fetch and unpack CIFAR-10 into `<root>/cifar-10-batches-py` with torchvision (needs a network)."""
    from torchvision.datasets import CIFAR10  # heavy import: only when downloading

    CIFAR10(str(root), train=True, download=True)


def load_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(n, 32, 32, 3) uint8 images and int64 labels of one CIFAR-10 split.

    Parsed by torchvision's own CIFAR10 reader, which unpickles the batches. These files come
    from the user's own disk (`data.root`, filled by the user or by torchvision's download on
    rank 0): they are never received from a peer, which only ever sends typed raw buffers.
    The reader checks that the split's files are present but not their MD5 sums (every rank
    would hash 180 MB); torchvision's download verifies the archive.
    """
    if missing_files(root, (split,)):
        raise FileNotFoundError(f"CIFAR-10 {split} files not found in {root / FOLDER}")
    reader = _local_reader()(str(root), train=split == "train", download=False)
    return np.ascontiguousarray(reader.data), np.asarray(reader.targets, dtype=np.int64)


def _local_reader() -> type:
    from torchvision.datasets import CIFAR10

    class LocalCIFAR10(CIFAR10):
        """torchvision's CIFAR10 over files already on disk: presence check, no MD5, no meta file."""

        def _check_integrity(self) -> bool:
            needed = self.train_list if self.train else self.test_list
            return all((Path(self.root) / self.base_folder / name).is_file() for name, _ in needed)

        def _load_meta(self) -> None:
            self.classes = list(CLASSES)
            self.class_to_idx = {name: i for i, name in enumerate(CLASSES)}

    return LocalCIFAR10
