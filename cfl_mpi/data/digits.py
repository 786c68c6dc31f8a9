"""scikit-learn's handwritten digits: 1,797 real 8x8 images shipped with the package."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

# Where scikit-learn keeps the digits (its `load_digits` reads this file). Every silo rank
# reads it: found without importing scikit-learn, whose import would cost each rank more
# than reading the set does.
DIGITS_FILE = ("datasets", "data", "digits.csv.gz")


def _digits_file() -> Path | None:
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder, *DIGITS_FILE)
        if path.is_file():
            return path
    return None


POOL_SIZE = 1797  # scikit-learn's digits


def load_digit_pool() -> tuple[np.ndarray, np.ndarray]:
    """All digits as (n, 8, 8) floats in [0, 1] and int64 labels."""
    path = _digits_file()
    if path is None:  # a scikit-learn that keeps its data elsewhere: ask it
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return (bunch.images / 16.0).astype(np.float64), bunch.target.astype(np.int64)
    with gzip.open(path, mode="rt", encoding="utf-8") as f:  # as load_digits reads it
        data = np.loadtxt(f, delimiter=",")
    images = data[:, :-1].reshape(-1, 8, 8)
    return (images / 16.0).astype(np.float64), data[:, -1].astype(np.int64)
