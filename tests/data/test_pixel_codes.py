"""A silo keeps images whose every pixel is a uint8 source's level as those bytes
(data/images.py's `PixelCodes`) and reads them as the very floats it would otherwise hold:
the same bits and layout, a quarter of the memory."""

from __future__ import annotations

import numpy as np
import pytest
from config_files import config_from
from data_files import write_mnist
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from jobs import read_results, require_slow_marker

from cfl_mpi.data import images
from cfl_mpi.data.images import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MNIST_MEAN,
    MNIST_STD,
    PixelCodes,
    kept_images,
    to_model_input,
    unit,
)

# (channels of the source, mean, std, channels the model takes)
INPUTS = [
    (1, 0.0, 1.0, 1),  # raw grey pixels (IFCA's MLP)
    (1, MNIST_MEAN, MNIST_STD, 1),
    (1, IMAGENET_MEAN, IMAGENET_STD, 3),  # grey into an ImageNet model
    (3, CIFAR10_MEAN, CIFAR10_STD, 3),
    (3, IMAGENET_MEAN, IMAGENET_STD, 3),
]


def assert_same_floats(got: np.ndarray, expected: np.ndarray) -> None:
    """Bit for bit (-0.0 is not 0.0) and in the same layout (torch's kernels follow the strides)."""
    assert got.dtype == expected.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert got.strides == expected.strides


@settings(max_examples=60, deadline=None)
@given(data=st.data(), case=st.sampled_from(INPUTS), n=st.integers(1, 5), edge=st.integers(1, 9))
def test_codes_read_as_the_floats_to_the_bit(data, case, n, edge):
    colours, mean, std, channels = case
    shape = (n, edge, edge) if colours == 1 else (n, edge, edge, colours)
    codes = data.draw(arrays(np.uint8, shape))
    kept = kept_images(unit(codes), mean, std, channels)
    assert isinstance(kept, PixelCodes) and len(kept) == n
    assert kept.codes.dtype == np.uint8 and kept.codes.nbytes == codes.nbytes  # one byte a pixel
    assert_same_floats(kept.floats(), to_model_input(unit(codes), mean, std, channels))
    assert_same_floats(kept.floats(), kept.floats())  # every read the same


@pytest.mark.parametrize(
    "pixel",
    [0.3, -0.0, float("nan"), 1.5, 128 / 255 + 1e-7],
    ids=["between levels", "negative zero", "nan", "above one", "a level, off by one ulp"],
)
def test_floats_that_are_not_levels_are_kept_as_floats(pixel):
    batch = unit(np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4))
    batch[1, 2, 3] = np.float32(pixel)
    kept = kept_images(batch, MNIST_MEAN, MNIST_STD, 1)
    assert isinstance(kept, np.ndarray)
    assert_same_floats(kept, to_model_input(batch, MNIST_MEAN, MNIST_STD, 1))


def test_float64_images_are_kept_as_floats():
    batch = np.arange(16, dtype=np.uint8).reshape(1, 4, 4) / 255.0
    assert isinstance(kept_images(batch, 0.0, 1.0, 1), np.ndarray)


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory):
    return write_mnist(tmp_path_factory.mktemp("data") / "mnist", n_train=400, n_test=200)


@pytest.mark.parametrize(
    ("data", "model", "kept_as"),
    [
        ({"name": "rotated_mnist"}, {}, PixelCodes),  # quarter turns move pixels
        ({"name": "rotated_mnist", "rotations": [-3, -1, 1, 3]}, {}, PixelCodes),  # nearest neighbour too
        ({"name": "rotated_mnist", "pixels": "raw"}, {"name": "mlp"}, PixelCodes),
        ({"name": "rotated_mnist"}, {"name": "resnet18", "input_size": 32}, PixelCodes),  # 3 channels from one
        ({"name": "rotated_mnist", "image_size": 20}, {"name": "mlp"}, np.ndarray),  # resized: new values
        ({"name": "rotated_digits"}, {}, np.ndarray),  # upsampled from 8x8
    ],
    ids=["quarter turns", "small turns", "raw", "imagenet", "resized", "digits"],
)
def test_a_silo_keeps_its_images_as_bytes_where_they_are_a_sources_levels(tmp_path, mnist_root, data, model, kept_as):
    section = {"root": str(mnist_root), "download": False, **data}
    cfg = config_from(tmp_path, {"silos": 8, "data": section, **({"model": model} if model else {})})
    silo = cfg.data.build(5, cfg.data_facts())
    for stored, floats in [
        (silo.train_images, silo.x_train),
        (silo.val_images, silo.x_val),
        (silo.test_images, silo.x_test),
    ]:
        assert isinstance(stored, kept_as)
        if isinstance(stored, PixelCodes):  # a quarter of the floats, a twelfth for 3 channels from one
            assert floats.nbytes == stored.codes.nbytes * (12 if model.get("name") == "resnet18" else 4)


@pytest.mark.job
def test_a_job_on_bytes_gives_the_bits_of_one_on_floats(tmp_path, mnist_root, monkeypatch):
    """The whole run (EMD-CFL's clustering on the silos' embeddings, training, evaluation):
    the same accuracies, clusters and final models whether the silos keep bytes or floats."""
    from cfl_mpi.backends.simulate import simulate

    require_slow_marker("a simulated job")
    body = {
        "silos": 8,
        "data": {"name": "rotated_mnist", "root": str(mnist_root), "download": False},
        "model": {"name": "simple_cnn", "channels": [8, 16], "embedding_dim": 32},
        "train": {"rounds": 2, "local_epochs": 1, "batch_size": 32},
        "strategy": {"name": "emdcfl", "pair_keys": "seeded"},
    }
    runs = {}
    for kept in ("bytes", "floats"):
        if kept == "floats":
            monkeypatch.setattr(images, "byte_codes", lambda images01: None)
        out = tmp_path / kept
        simulate(config_from(tmp_path, body, f"out={out}"))
        summary, records = read_results(out)
        models = np.load(out / "checkpoint" / "round2.npz")
        runs[kept] = (summary["avg_acc"], [(r["accuracy"], r["clusters"]) for r in records], dict(models))
    (acc, rounds, models), (acc_f, rounds_f, models_f) = runs["bytes"], runs["floats"]
    assert acc == acc_f and rounds == rounds_f
    assert models.keys() == models_f.keys()
    for name in models:
        np.testing.assert_array_equal(models[name], models_f[name])
