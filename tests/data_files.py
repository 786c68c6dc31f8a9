"""Write small data sets in their real on-disk formats, for tests that must not download.

MNIST's IDX files (gzipped, as distributed), CIFAR-10's pickled Python batches (as in
`cifar-10-batches-py`), and a PACS folder tree of tiny JPEG/PNG images. The images are
scikit-learn's real 8×8 digits, upsampled (MNIST), or seeded noise with a class-dependent
tint (CIFAR-10, PACS), so that small models can learn something from them.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
from scipy import ndimage
from sklearn.datasets import load_digits


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX: magic (0, 0, 0x08 = unsigned byte, ndim), big-endian int32 dims, then the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def digit_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n real handwritten digits (scikit-learn's), upsampled to 28×28 uint8, and their labels."""
    bunch = load_digits()
    idx = np.random.default_rng(seed).permutation(len(bunch.target))[:n]
    images = ndimage.zoom(bunch.images[idx] / 16.0, (1, 20 / 8, 20 / 8), order=1)
    padded = np.zeros((len(idx), 28, 28))
    padded[:, 4:24, 4:24] = images  # MNIST's digits sit in a 20×20 box inside 28×28
    return (np.clip(padded, 0, 1) * 255).round().astype(np.uint8), bunch.target[idx].astype(np.uint8)


def write_mnist(root: Path, n_train: int = 0, n_test: int = 300) -> Path:
    """MNIST's four (or, with n_train 0, two test) gzipped IDX files in torchvision's `MNIST/raw`."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    images, labels = digit_images(n_train + n_test)
    if n_train:
        write_idx(raw / "train-images-idx3-ubyte.gz", images[:n_train])
        write_idx(raw / "train-labels-idx1-ubyte.gz", labels[:n_train])
    write_idx(raw / "t10k-images-idx3-ubyte.gz", images[n_train:])
    write_idx(raw / "t10k-labels-idx1-ubyte.gz", labels[n_train:])
    return root


def tinted_images(n: int, classes: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, size, size, 3) uint8 noise whose mean colour depends on the label (the same colours
    for every seed), and the labels (balanced, shuffled by `seed`)."""
    tint = np.random.default_rng(1234).uniform(40, 215, size=(classes, 3))
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % classes
    rng.shuffle(labels)
    images = tint[labels][:, None, None, :] + rng.normal(0, 25, size=(n, size, size, 3))
    return np.clip(images, 0, 255).astype(np.uint8), labels


def write_cifar10(root: Path, per_batch: int = 40, n_test: int = 60, seed: int = 0) -> Path:
    """CIFAR-10's python batches: dicts with `data` (n × 3072 uint8, channel-major) and `labels`."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):
        n = n_test if name == "test_batch" else per_batch
        images, labels = tinted_images(n, 10, 32, seed + k)
        entry = {
            "batch_label": f"{name} of {len(names)}",
            "labels": [int(y) for y in labels],
            "data": images.transpose(0, 3, 1, 2).reshape(n, 3072),
            "filenames": [f"img_{k}_{i}.png" for i in range(n)],
        }
        with open(folder / name, "wb") as fh:
            pickle.dump(entry, fh, protocol=2)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump(
            {
                "label_names": [
                    "airplane",
                    "automobile",
                    "bird",
                    "cat",
                    "deer",
                    "dog",
                    "frog",
                    "horse",
                    "ship",
                    "truck",
                ],
                "num_cases_per_batch": per_batch,
                "num_vis": 3072,
            },
            fh,
            protocol=2,
        )
    return root


PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


def write_pacs(root: Path, per_domain: dict[str, int], size: int = 12, seed: int = 0) -> Path:
    """`<root>/<domain>/<class>/<n>.jpg` (sketch as .png, as in PACS), tiny images."""
    from PIL import Image

    for d, (domain, n) in enumerate(per_domain.items()):
        images, labels = tinted_images(n, len(PACS_CLASSES), size, seed + d)
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = root / domain / PACS_CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            suffix = "png" if domain == "sketch" else "jpg"
            Image.fromarray(image).save(folder / f"pic_{i:04d}.{suffix}")
    return root
