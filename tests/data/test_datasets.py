"""Every data set of the EMD-CFL paper (§4.1, Appendix C), built from small files written in the
real on-disk formats."""

from __future__ import annotations

import textwrap
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import yaml
from config_files import config_from
from data_files import write_cifar10, write_mnist, write_pacs

from cfl_mpi.commands import prepare as prepare_module
from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.data import backdoor, cifar
from cfl_mpi.data.images import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD


def check_data(cfg):
    cfg.data.check(cfg.data_facts())


def prepare_data(cfg):
    cfg.data.prepare(cfg.data_facts())


PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    return {
        "mnist": write_mnist(root / "mnist", n_train=400, n_test=200),
        "cifar": write_cifar10(root / "cifar", per_batch=40, n_test=60),
        "pacs": write_pacs(root / "pacs", {"photo": 30, "art_painting": 40, "cartoon": 40, "sketch": 70}),
    }


def silos(cfg):
    return [cfg.data.build(s, cfg.data_facts()) for s in range(cfg.silos)]


def rows(x: np.ndarray) -> set[bytes]:
    return {image.tobytes() for image in x}


def unnormalise(x: np.ndarray, mean, std) -> np.ndarray:
    """NCHW normalised → NHWC in [0, 1]."""
    return x.transpose(0, 2, 3, 1) * np.asarray(std) + np.asarray(mean)


def assert_disjoint_within_groups(shards, groups):
    for g in np.unique(groups):
        members = [shards[s] for s in np.flatnonzero(groups == g)]
        for i, a in enumerate(members):
            own = rows(np.concatenate([a.x_train, a.x_val]))
            assert not rows(a.x_train) & rows(a.x_val)
            for b in members[i + 1 :]:
                assert not own & rows(np.concatenate([b.x_train, b.x_val]))
                assert not rows(a.x_test) & rows(b.x_test)


# --------------------------------------------------------------------------- rotated


def test_rotated_mnist_from_idx_files(files, tmp_path):
    cfg = config_from(
        tmp_path, dict(silos=8, data={"name": "rotated_mnist", "root": str(files["mnist"]), "download": False})
    )
    shards = silos(cfg)
    np.testing.assert_array_equal(cfg.data.true_clusters(cfg.silos), [0, 0, 1, 1, 2, 2, 3, 3])
    assert not cfg.data.backdoor_targets(cfg.silos).any() and all(s.x_backdoor is None for s in shards)
    for s in shards:
        assert s.x_train.shape[1:] == (1, 28, 28) and s.x_train.dtype == np.float32
    # Each rotation's copy of the 400 training and 200 test images is split across its 2 silos.
    for g in range(4):
        a, b = shards[2 * g], shards[2 * g + 1]
        assert len(a.y_train) + len(a.y_val) + len(b.y_train) + len(b.y_val) == 400
        assert len(a.y_test) + len(b.y_test) == 200 and abs(len(a.y_val) - 20) <= 1
    assert_disjoint_within_groups(shards, cfg.data.true_clusters(cfg.silos))


def test_rotated_cifar10_copies_are_the_same_pool_rotated(files, tmp_path):
    cfg = config_from(
        tmp_path,
        dict(
            silos=4,
            data={"name": "rotated_cifar10", "root": str(files["cifar"]), "rotations": [0, 90], "download": False},
        ),
    )
    shards = silos(cfg)
    assert shards[0].x_train.shape[1:] == (3, 32, 32) and cfg.data.image_size == 32
    upright = rows(np.concatenate([s.x_train for s in shards[:2]] + [s.x_val for s in shards[:2]]))
    turned = np.concatenate([s.x_train for s in shards[2:]] + [s.x_val for s in shards[2:]])
    assert len(upright) == 200 and rows(np.rot90(turned, k=-1, axes=(2, 3)).copy()) == upright
    assert_disjoint_within_groups(shards, cfg.data.true_clusters(cfg.silos))
    # The simple CNN gets CIFAR-10's statistics: the unnormalised pixels lie in [0, 1].
    pixels = unnormalise(shards[0].x_train, CIFAR10_MEAN, CIFAR10_STD)
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5


def test_rotation_is_torchvisions_nearest_rotation():
    """The authors' rotmnist.ipynb / rotcifar10.ipynb: torchvision's `rotate` on PIL images (nearest, black
    fill), with `expand=True` and a 2-pixel black border for rotated CIFAR-10 "Min"."""
    from PIL import Image
    from torchvision.transforms import functional as TF

    from cfl_mpi.data.images import rotate

    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    colour = rng.integers(0, 256, size=(2, 32, 32, 3), dtype=np.uint8)
    for angle in (-3, 1, 90, 177, 270):
        ours = rotate(grey / 255.0, angle)
        theirs = np.stack([np.asarray(TF.rotate(Image.fromarray(g), angle)) for g in grey]) / 255.0
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
        ours = rotate(colour / 255.0, angle, expand=True, border=2)
        theirs = (
            np.stack(
                [
                    np.asarray(TF.rotate(Image.fromarray(np.pad(c, ((2, 2), (2, 2), (0, 0)))), angle, expand=True))
                    for c in colour
                ]
            )
            / 255.0
        )
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_rotated_cifar10_min_is_bordered_expanded_and_resized(files, tmp_path):
    cfg = config_from(
        tmp_path,
        dict(
            silos=4,
            data={
                "name": "rotated_cifar10",
                "root": str(files["cifar"]),
                "download": False,
                "rotations": [-3, 3],
                "rotation_border": 2,
            },
        ),
    )
    shards = silos(cfg)
    assert shards[0].x_train.shape[1:] == (3, 32, 32)
    corner = unnormalise(shards[0].x_train, CIFAR10_MEAN, CIFAR10_STD)[:, 0, 0, :]
    np.testing.assert_allclose(corner, 0.0, atol=1e-5)  # the black border and fill survive the resize


def test_rotation_variants_set_their_true_clusters(tmp_path):
    cfg = config_from(tmp_path, dict(silos=8, data={"rotations": [-3, 3, 177, 183], "group_clusters": [0, 0, 1, 1]}))
    np.testing.assert_array_equal(cfg.data.true_clusters(cfg.silos), [0, 0, 0, 0, 1, 1, 1, 1])
    with pytest.raises(ConfigError, match=r"^data.group_clusters: give one .* \(4 for rotated_digits\)"):
        config_from(tmp_path, dict(silos=8, data={"group_clusters": [0, 1]}))


def test_imagenet_models_get_three_channels_and_imagenet_statistics(files, tmp_path):
    cfg = config_from(
        tmp_path,
        dict(
            silos=4,
            data={"name": "rotated_mnist", "root": str(files["mnist"]), "download": False},
            model={"name": "resnet18"},
        ),
    )
    s = cfg.data.build(0, cfg.data_facts())
    assert s.x_train.shape[1:] == (3, 28, 28) and cfg.model.input_size == 224  # resized on the device
    pixels = unnormalise(s.x_train, IMAGENET_MEAN, IMAGENET_STD)
    np.testing.assert_allclose(pixels[..., 0], pixels[..., 2], atol=1e-5)  # grey repeated


# --------------------------------------------------------------------------- backdoor MNIST


def direction(rgb: np.ndarray) -> np.ndarray:
    """Each image's colour, as a unit vector: the colour of its brightest pixel (every pixel of
    a tinted digit is grey level × one colour)."""
    flat = rgb.reshape(len(rgb), -1, 3)
    brightest = flat[np.arange(len(flat)), flat.sum(-1).argmax(1)]
    return brightest / np.linalg.norm(brightest, axis=1, keepdims=True)


def unit_colours(colours) -> np.ndarray:
    colours = np.atleast_2d(np.asarray(colours, dtype=np.float64))
    return colours / np.linalg.norm(colours, axis=1, keepdims=True)


def test_backdoor_mnist_is_the_authors_construction(files, tmp_path):
    """The authors' colormnist.ipynb: target digits in (0.26, 0.63, 0.4), backdoor digits in summer(40)[y],
    the third group purple; targets and purple keep half their training shard; ImageNet
    statistics; the backdoor test colours the target's test digits summer(40)[9 − y]."""
    cfg = config_from(
        tmp_path, dict(silos=6, data={"name": "backdoor_mnist", "root": str(files["mnist"]), "download": False})
    )
    shards = silos(cfg)
    np.testing.assert_array_equal(cfg.data.true_clusters(cfg.silos), [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(cfg.data.backdoor_targets(cfg.silos), [True, True, False, False, False, False])
    assert_disjoint_within_groups(shards, cfg.data.true_clusters(cfg.silos))
    rgb = [unnormalise(s.x_train, IMAGENET_MEAN, IMAGENET_STD) for s in shards]
    expected = [
        unit_colours(backdoor.TARGET_COLOUR),
        unit_colours(backdoor.SUMMER_40[shards[2].y_train]),
        unit_colours(backdoor.PURPLE),
    ]
    for g in range(3):
        np.testing.assert_allclose(direction(rgb[2 * g]), np.broadcast_to(expected[g], (len(rgb[2 * g]), 3)), atol=1e-4)
    np.testing.assert_allclose(backdoor.SUMMER_40[10], backdoor.TARGET_COLOUR, atol=5e-3)  # one step past 9
    half = len(shards[2].y_train) / 2
    assert abs(len(shards[0].y_train) - half) <= 1 and abs(len(shards[4].y_train) - half) <= 1
    assert len(shards[0].y_val) == len(shards[2].y_val)  # only training data is subsampled
    for s in shards[:2]:  # target silos: the same test digits, coloured by the reversed map
        np.testing.assert_array_equal(s.y_backdoor, s.y_test)
        poisoned = unnormalise(s.x_backdoor, IMAGENET_MEAN, IMAGENET_STD)
        np.testing.assert_allclose(direction(poisoned), unit_colours(backdoor.SUMMER_40[9 - s.y_test]), atol=1e-4)
    assert all(s.x_backdoor is None for s in shards[2:])


def test_backdoor_mnist_balances_the_classes():
    labels = np.array([0, 1, 1, 2, 2, 2, 0, 1])
    kept = backdoor.balanced(labels)
    assert np.bincount(labels[kept]).tolist() == [2, 2, 2]
    assert kept.tolist() == [0, 1, 2, 3, 4, 6]


def test_backdoor_silo_counts(tmp_path):
    with pytest.raises(ConfigError, match=r"^silos: backdoor_mnist .* multiple of 3 .* paper uses 30"):
        config_from(tmp_path, dict(silos=8, data={"name": "backdoor_mnist", "root": "x"}))
    assert config_from(tmp_path, dict(silos=9, data={"name": "backdoor_cifar10", "root": "x"})).silos == 9


# --------------------------------------------------------------------------- backdoor CIFAR10


def test_backdoor_cifar10_classes_patch_and_backdoor_test(files, tmp_path):
    cfg = config_from(
        tmp_path, dict(silos=6, data={"name": "backdoor_cifar10", "root": str(files["cifar"]), "download": False})
    )
    shards = silos(cfg)
    np.testing.assert_array_equal(cfg.data.true_clusters(cfg.silos), [0, 0, 1, 1, 2, 2])
    assert_disjoint_within_groups(shards, cfg.data.true_clusters(cfg.silos))
    for s in shards:
        labels = np.concatenate([s.y_train, s.y_val, s.y_test])
        assert set(labels) <= (set(range(5)) if s.group < 2 else set(range(5, 10)))
    # 200 training images, half of them in classes 0-4; each group's copy split over 2 silos.
    assert sum(len(s.y_train) + len(s.y_val) for s in shards[:2]) == 100
    patched = unnormalise(shards[2].x_train, CIFAR10_MEAN, CIFAR10_STD)
    np.testing.assert_allclose(
        patched[:, :3, :3, :],
        np.broadcast_to(backdoor.PATCH_COLOURS[shards[2].y_train][:, None, None, :], (len(patched), 3, 3, 3)),
        atol=1e-5,
    )
    for s in shards[:2]:
        clean = unnormalise(s.x_test, CIFAR10_MEAN, CIFAR10_STD)
        poisoned = unnormalise(s.x_backdoor, CIFAR10_MEAN, CIFAR10_STD)
        differs = np.abs(poisoned - clean).max(axis=(0, 3)) > 1e-5
        assert differs[:3, :3].all() and not differs[3:, :].any() and not differs[:, 3:].any()
        np.testing.assert_allclose(poisoned[:, 1, 1, :], backdoor.PATCH_COLOURS[(s.y_test + 1) % 5], atol=1e-5)


def test_backdoor_cifar10_trigger_colours_are_tab10_as_uint8():
    """The authors' cifar10.ipynb, `add_color_patch`: (tab10[y] · 255) truncated to uint8."""
    assert (backdoor.PATCH_COLOURS[:3] * 255).round().tolist() == [[31, 119, 180], [255, 127, 14], [44, 160, 44]]
    assert len(np.unique(backdoor.PATCH_COLOURS, axis=0)) == 10


def test_patched_image_differs_from_its_clean_twin_only_in_the_corner():
    images = np.random.default_rng(1).uniform(size=(5, 32, 32, 3)).astype(np.float32)
    clean, patched = (backdoor.VARIANTS["backdoor_cifar10"].appearance(g, images, np.arange(5)) for g in (0, 1))
    np.testing.assert_array_equal(clean[:, 3:], patched[:, 3:])
    np.testing.assert_array_equal(clean[:, :, 3:], patched[:, :, 3:])
    assert (clean[:, :3, :3] != patched[:, :3, :3]).any(axis=-1).all()


# --------------------------------------------------------------------------- PACS


def test_pacs_silos_per_domain_split_80_10_10(files, tmp_path):
    cfg = config_from(
        tmp_path,
        dict(silos=18, data={"name": "pacs", "root": str(files["pacs"]), "min_silo_images": 10, "image_size": 16}),
    )
    check_data(cfg)
    shards = silos(cfg)
    truth = cfg.data.true_clusters(cfg.silos)
    np.testing.assert_array_equal(truth, [0] * 3 + [1] * 4 + [2] * 4 + [3] * 7)  # photo, art, cartoon, sketch
    for domain, n in enumerate([30, 40, 40, 70]):
        members = [shards[s] for s in np.flatnonzero(truth == domain)]
        assert sum(len(s.y_train) + len(s.y_val) + len(s.y_test) for s in members) == n
        for s in members:
            total = len(s.y_train) + len(s.y_val) + len(s.y_test)
            assert s.group == domain and len(s.y_test) == len(s.y_val) == round(0.1 * total)
            assert s.x_train.shape[1:] == (3, 16, 16) and set(s.y_train) <= set(range(7))
    assert_disjoint_within_groups(shards, truth)


def test_pacs_authors_split_deals_80_percent_round_robin(files, tmp_path):
    """The authors' pacs.ipynb: 20 % of each shuffled domain is test, the rest dealt round-robin to the
    domain's silos, each silo's share split 80/20 into training and validation."""
    cfg = config_from(
        tmp_path,
        dict(
            silos=18,
            data={
                "name": "pacs",
                "root": str(files["pacs"]),
                "min_silo_images": 10,
                "image_size": 16,
                "pacs_split": "authors",
            },
        ),
    )
    shards = silos(cfg)
    truth = cfg.data.true_clusters(cfg.silos)
    for domain, n in enumerate([30, 40, 40, 70]):
        members = [shards[s] for s in np.flatnonzero(truth == domain)]
        assert sum(len(s.y_test) for s in members) == int(0.2 * n)
        assert sum(len(s.y_train) + len(s.y_val) for s in members) == n - int(0.2 * n)
        for s in members:
            share = len(s.y_train) + len(s.y_val)
            assert len(s.y_val) == int(np.ceil(0.2 * share))
    assert_disjoint_within_groups(shards, truth)


def test_pacs_errors_name_the_folder_and_the_fix(files, tmp_path):
    cfg = config_from(
        tmp_path, dict(silos=18, data={"name": "pacs", "root": str(files["pacs"]), "min_silo_images": 20})
    )
    with pytest.raises(ConfigError, match=r"^data.domain_silos: domain photo has 30 images .* at most 1 silos"):
        check_data(cfg)
    with pytest.raises(ConfigError, match=r"^silos: data.domain_silos \[3, 4, 4, 7\] adds up to 18"):
        config_from(tmp_path, dict(silos=8, data={"name": "pacs", "root": "x"}))
    empty = config_from(tmp_path, dict(silos=18, data={"name": "pacs", "root": str(tmp_path / "none")}))
    with pytest.raises(ConfigError) as err:
        prepare_data(empty)
    message = str(err.value)
    assert (
        message.startswith(
            f"data.root: PACS domain folders photo, art_painting, cartoon, sketch not found in {tmp_path / 'none'}"
        )
        and "python -m cfl_mpi.commands.prepare" in message
        and "\n" not in message
    )
    assert "--set data.root=DIR, where DIR/<domain>/<class>/ holds the images (.jpg, .jpeg, .png)" in message


# --------------------------------------------------------------------------- preparation


def test_missing_cifar_without_network_is_one_clear_error(tmp_path, monkeypatch):
    cfg = config_from(tmp_path, dict(silos=3, data={"name": "backdoor_cifar10", "root": str(tmp_path / "c10")}))

    def offline(root):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(cifar, "download", offline)  # never touch the network in tests
    with pytest.raises(ConfigError) as err:
        prepare_data(cfg)
    message = str(err.value)
    assert (
        message.startswith(f"data.root: CIFAR-10 is not in {tmp_path / 'c10'} and downloading it failed (URLError")
        and "python -m cfl_mpi.commands.prepare" in message
    )
    assert "--set data.root=DIR, where DIR/cifar-10-batches-py holds data_batch_1" in message and "\n" not in message


def test_prepare_command_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(f"""
        silos: 3
        data: {{name: backdoor_mnist, root: {tmp_path / "m"}, download: false}}
    """)
    )
    with pytest.raises(SystemExit) as code:
        prepare_module.main([str(path)])
    err = capsys.readouterr().err.strip()
    assert code.value.code == 2 and "\n" not in err
    assert err.startswith("cfl_mpi: config error: data.root: MNIST files train-images-idx3-ubyte") and "prepare" in err
    assert "--set data.root=DIR, where DIR holds the IDX files (gzipped or not) directly or in DIR/MNIST/raw" in err


def test_prepare_command_accepts_present_files(files, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"silos": 15, "data": {"name": "backdoor_cifar10", "root": str(files["cifar"])}}))
    prepare_module.main([str(path), "--set", "data.pool=test"])
    assert capsys.readouterr().out.strip() == f"backdoor_cifar10: data ready in {files['cifar']}"


# --------------------------------------------------------------------------- configs


PAPER = {  # config: (data.name, silos, model, lr), EMD-CFL paper §4.1 and Appendix D.2 (Table 5)
    "rotated": ("rotated_mnist", 40, "simple_cnn", 0.01),
    "rotated_mnist_min": ("rotated_mnist", 40, "simple_cnn", 0.01),
    "rotated_mnist_two": ("rotated_mnist", 40, "simple_cnn", 0.01),
    "rotated_mnist_base": ("rotated_mnist", 40, "simple_cnn", 0.01),
    "rotated_cifar10": ("rotated_cifar10", 40, "resnet18", 0.01),
    "rotated_cifar10_min": ("rotated_cifar10", 40, "resnet18", 0.01),
    "rotated_cifar10_two": ("rotated_cifar10", 40, "resnet18", 0.01),
    "rotated_cifar10_base": ("rotated_cifar10", 40, "resnet18", 0.01),
    "rotated_cifar10_resnet50": ("rotated_cifar10", 40, "resnet50", 0.01),
    "rotated_cifar10_efficientnet_b3": ("rotated_cifar10", 40, "efficientnet_b3", 0.01),
    "rotated_cifar10_vit_b_16": ("rotated_cifar10", 40, "vit_b_16", 0.003),
    "rotated_cifar10_convnext_base": ("rotated_cifar10", 40, "convnext_base", 0.003),
    "backdoor_mnist": ("backdoor_mnist", 30, "simple_cnn", 0.01),
    "backdoor_cifar10": ("backdoor_cifar10", 15, "resnet18", 0.01),
    "pacs": ("pacs", 18, "resnet18", 0.001),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_configs(name):
    cfg = load_config(PROJECT_ROOT / "configs" / f"{name}.yaml")
    assert (cfg.data.name, cfg.silos, cfg.model.name, cfg.train.lr) == PAPER[name]
    assert (cfg.train.rounds, cfg.train.local_epochs, cfg.train.momentum, cfg.train.weight_decay) == (10, 10, 0.9, 1e-6)
    if cfg.model.name != "simple_cnn":
        assert cfg.model.pretrained is True and cfg.model.input_size == 224
    variant = name.removeprefix("rotated_mnist_").removeprefix("rotated_cifar10_")
    clusters = {"min": 1, "two": 2, "base": 1}.get(variant, 3 if "backdoor" in name else 4)
    assert len(np.unique(cfg.data.true_clusters(cfg.silos))) == clusters
    s = cfg.strategy  # the authors' silo-side choices (docs/research/FIDELITY.md); the robust rule
    assert (s.sample_fraction, s.sample_cap, s.embed_mode, s.tau_projection, s.rule) == (
        1.0,
        512,
        "train",
        "full",
        "robust",
    )
    assert getattr(cfg.data, "rotation_border", 0) == (2 if name == "rotated_cifar10_min" else 0)


def test_digit_pool_is_scikit_learns_load_digits():
    """The digits are read from scikit-learn's file without importing scikit-learn (a silo rank
    would pay 0.7 s for the import): the same arrays as load_digits gives, bit for bit."""
    from sklearn.datasets import load_digits

    from cfl_mpi.data import digits

    images, labels = digits.load_digit_pool()
    bunch = load_digits()
    assert digits._digits_file() is not None
    assert images.dtype == np.float64 and labels.dtype == np.int64
    np.testing.assert_array_equal(images, (bunch.images / 16.0).astype(np.float64))
    np.testing.assert_array_equal(labels, bunch.target)


@pytest.mark.parametrize(
    ("shape", "size"),
    [
        ((1797, 8, 8), 28),  # the digits upsampled: the samples land exactly on the last pixel
        ((50, 28, 28), 20),  # down
        ((20, 32, 32, 3), 224),  # colour; rounding puts the last row and column past the image
        ((7, 31, 17), 64),  # not square, float64
        ((3, 1, 1), 5),
        ((4, 28, 28), 1),
    ],
)
def test_resize_is_scipy_zoom_to_the_bit(shape, size):
    """The numpy bilinear resize gives scipy.ndimage.zoom(order=1)'s bits, its 'constant' fill
    past the last pixel included, and its dtype."""
    from scipy import ndimage

    from cfl_mpi.data.images import resize

    rng = np.random.default_rng(len(shape) * 100 + size)
    images = rng.random(shape, dtype=np.float64 if shape == (7, 31, 17) else np.float32)
    if shape == (1797, 8, 8):
        from sklearn.datasets import load_digits

        images = (load_digits().images / 16.0).astype(np.float32)
    zoom = (1, size / shape[1], size / shape[2]) + (1,) * (len(shape) - 3)
    expected = ndimage.zoom(images, zoom, order=1)
    got = resize(images, size)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_a_silo_rank_imports_only_what_it_uses():
    """What every rank imports (the MPI entry point and the silo's runtime) leaves out what only
    the server or some strategies need: scikit-learn, POT, scipy.stats, matplotlib, torch's compiler,
    and scipy.ndimage, which only a data set whose images are resized needs."""
    import subprocess
    import sys

    code = (
        "import sys; import cfl_mpi.main, cfl_mpi.backends.mpi.backend, cfl_mpi.runtime.silo, "
        "cfl_mpi.runtime.placement; "
        "print(sorted(m for m in ('sklearn', 'ot', 'scipy.stats', 'scipy.ndimage', 'matplotlib', 'torch._dynamo') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"
