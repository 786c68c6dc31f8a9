"""IFCA's rotated MNIST as IFCA's code builds it (configs/ifca_rotated_mnist.yaml): each
rotation one permutation of the 60,000 training images cut into its 600 silos, tests from the
test split, raw [0, 1] pixels."""

from __future__ import annotations

import numpy as np
from jobs import PROJECT_ROOT

from cfl_mpi.config import load_config
from cfl_mpi.data import mnist

CONFIG = PROJECT_ROOT / "configs/ifca_rotated_mnist.yaml"


def test_each_rotation_is_one_permutation_of_the_training_split_cut_into_its_silos():
    cfg = load_config(CONFIG)
    n_train, n_test = cfg.data.pool_sizes(cfg.seed)
    assert (n_train, n_test, cfg.silos, cfg.data.group_count()) == (60_000, 10_000, 2400, 4)
    orders = []
    for group in (0, 3):
        shards = [cfg.data.shard(group, local, 600, n_train, n_test, cfg.seed) for local in range(600)]
        assert {(len(s.train), len(s.val)) for s in shards} == {(91, 9)}  # 100 images, 9 kept for EMD-CFL's noise
        held = np.concatenate([np.concatenate([s.val, s.train]) for s in shards])
        np.testing.assert_array_equal(np.sort(held), np.arange(n_train))  # no image twice, none left out
        np.testing.assert_array_equal(np.sort(np.concatenate([s.test for s in shards])), np.arange(n_test))
        orders.append(held)
    assert not np.array_equal(*orders)  # a permutation of its own per rotation


def test_a_silo_holds_raw_pixels_of_its_rotation(shared_data, tmp_path):
    root = shared_data / "mnist"
    cfg = load_config(CONFIG, [f"data.root={root}", "data.download=false", "silos=8"])
    images, labels = mnist.load_split_uint8(root, "train")
    silo = 2  # the first silo of the 90° rotation
    data = cfg.data.build(silo, cfg.data_facts())
    part = cfg.data.shard(1, 0, 2, len(labels), 10_000, cfg.seed)
    np.testing.assert_array_equal(data.y_train, labels[part.train])
    expected = np.rot90(images[part.train] / 255.0, k=1, axes=(1, 2)).astype(np.float32)
    np.testing.assert_allclose(data.x_train[:, 0], expected, rtol=0, atol=1e-6)
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0
