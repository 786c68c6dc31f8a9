"""scikit-learn's handwritten digits: 1,797 real 8x8 images shipped with the package."""
from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits


POOL_SIZE = 1797  # scikit-learn's digits


def load_digit_pool() -> tuple[np.ndarray, np.ndarray]:
    """All digits as (n, 8, 8) floats in [0, 1] and int64 labels."""
    bunch = load_digits()
    return (bunch.images / 16.0).astype(np.float64), bunch.target.astype(np.int64)
