"""Silos' files as sites have them: grey images kept grey (and `data.channels` to force a
count), labels as tables give them (whole floats, text through `data.class_names`), manifest
groups named by any label; and every mistake one line naming the silo, the file (the image
inside a folder, the manifest's line), the user's own array and row, and the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from jobs import PROJECT_ROOT
from PIL import Image

from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.data import DataFacts, SiloFiles
from cfl_mpi.runtime.agreement import agreed_in_process, local_reports, read_reports, report_frame
from cfl_mpi.wire.round import MAX_WHY

ONE = DataFacts(silos=1, seed=0)


def config(tmp_path: Path, data: dict, silos: int = 2, **top) -> Path:
    path = tmp_path / "files.yaml"
    body = {
        "silos": silos,
        "data": {"name": "silo_files", **data},
        "train": {"rounds": 1, "local_epochs": 1},
        "model": {"channels": [8, 16]},
        "strategy": {"name": "fedavg"},
        "out": str(tmp_path / "run"),
        **top,
    }
    path.write_text(yaml.safe_dump(body))
    return path


def one_line(cfg_path: Path, silo: int, where: Path, overrides: list[str] | None = None) -> str:
    """The agreement's error: one line that starts by naming the silo and its file."""
    with pytest.raises(ConfigError) as err:
        agreed_in_process(load_config(cfg_path, overrides or []))
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"data: silo {silo} ({where}): "), line
    return line


def image_tree(root: Path, mode: str, n: int = 5, size: tuple[int, int] = (6, 5), seed: int = 0) -> Path:
    """train/0, train/1 of `n` PNG images each in PIL mode `mode`."""
    rng = np.random.default_rng(seed)
    for label in ("0", "1"):
        folder = root / "train" / label
        folder.mkdir(parents=True)
        for i in range(n):
            if mode == "I;16":
                pixels = rng.integers(0, 65536, size[::-1], dtype=np.uint16)
                Image.fromarray(pixels).save(folder / f"{i}.png")
            else:
                rgba = rng.integers(0, 256, (*size[::-1], 4), dtype=np.uint8)
                Image.fromarray(rgba, "RGBA").convert(mode).save(folder / f"{i}.png")
    return root


# --------------------------------------------------------------------------- channels


@pytest.mark.parametrize(("mode", "channels"), [("L", 1), ("LA", 1), ("I;16", 1), ("RGB", 3), ("RGBA", 3)])
def test_an_image_folder_keeps_its_images_own_channels(tmp_path, mode, channels):
    image_tree(tmp_path / "site0", mode, n=5)
    data = SiloFiles(files=str(tmp_path / "site{silo}")).build(0, ONE)
    assert data.x_train.shape[1:] == (channels, 5, 6) and data.x_train.dtype == np.float32
    pixels = np.concatenate([data.x_train, data.x_val, data.x_test])
    first = tmp_path / "site0" / "train" / "0" / "0.png"
    with Image.open(first) as img:  # PIL's own reading of one image, as the silo must hold it
        if mode == "I;16":
            own = np.asarray(img, dtype=np.float64)[None] / 65535
        else:
            own = np.asarray(img.convert("L" if channels == 1 else "RGB"), dtype=np.float64) / 255
            own = own[None] if channels == 1 else own.transpose(2, 0, 1)
    assert any(np.allclose(p, own, atol=1e-6) for p in pixels)  # the split is shuffled: somewhere among them
    assert pixels.min() >= 0.0 and pixels.max() <= 1.0


def test_data_channels_converts_folders_and_arrays_to_the_count_it_names(tmp_path):
    image_tree(tmp_path / "grey", "L")
    image_tree(tmp_path / "colour", "RGB")
    x = SiloFiles(files=str(tmp_path / "grey"), channels=3).build(0, ONE).x_train
    assert x.shape[1] == 3 and np.array_equal(x[:, 0], x[:, 1]) and np.array_equal(x[:, 0], x[:, 2])
    colour = SiloFiles(files=str(tmp_path / "colour"), channels=1).build(0, ONE).x_train
    assert colour.shape[1] == 1

    rng = np.random.default_rng(4)
    rgb = rng.integers(0, 256, (20, 5, 6, 3), dtype=np.uint8)
    np.savez(tmp_path / "a0.npz", x_train=rgb, y_train=np.arange(20) % 2, x_test=rgb, y_test=np.arange(20) % 2)
    made_grey = SiloFiles(files=str(tmp_path / "a{silo}.npz"), channels=1).build(0, ONE).x_test
    pil_grey = np.stack([np.asarray(Image.fromarray(im).convert("L")) for im in rgb]) / 255  # PIL's luma, in bytes
    assert made_grey.shape == (20, 1, 5, 6)
    assert np.abs(made_grey[:, 0] - pil_grey).max() <= 0.5 / 255 + 1e-6  # PIL rounds to a byte
    grey = rng.integers(0, 256, (20, 5, 6), dtype=np.uint8)
    np.savez(tmp_path / "b0.npz", x_train=grey, y_train=np.arange(20) % 2, x_test=grey, y_test=np.arange(20) % 2)
    made_colour = SiloFiles(files=str(tmp_path / "b{silo}.npz"), channels=3).build(0, ONE).x_test
    np.testing.assert_array_equal(made_colour, np.repeat(grey[:, None] / np.float32(255), 3, axis=1))


def test_grey_silos_agree_on_one_channel_and_an_imagenet_model_asks_for_data_channels_3(tmp_path):
    for silo in range(2):
        image_tree(tmp_path / f"site{silo}", "L", seed=silo, size=(8, 8))
    path = config(tmp_path, {"files": str(tmp_path / "site{silo}"), "input_shape": [1, 8, 8]})
    assert agreed_in_process(load_config(path)).sample_shape == (1, 8, 8)
    line = one_line(path, 0, tmp_path / "site0", ["model.name=resnet18", "data.input_shape=null"])
    assert re.search(r"the images of train/ have 1 channel, the ImageNet models .* \(set data.channels: 3", line)
    agreed = agreed_in_process(load_config(path, ["model.name=resnet18", "data.input_shape=null", "data.channels=3"]))
    assert agreed.sample_shape == (3, 8, 8)
    with pytest.raises(ConfigError, match=r"^data.channels: the ImageNet models .* take 3-channel images, got 1"):
        load_config(path, ["model.name=resnet18", "data.channels=1"])


def test_feature_vectors_have_no_channels_to_set(tmp_path):
    for silo in range(2):
        np.savez(tmp_path / f"v{silo}.npz", x=np.zeros((30, 5), np.float32), y=np.arange(30) % 2)
    path = config(tmp_path, {"files": str(tmp_path / "v{silo}.npz"), "channels": 3}, model={"name": "mlp"})
    line = one_line(path, 0, tmp_path / "v0.npz")
    assert line.endswith("x holds feature vectors (30, 5), which have no channels (remove data.channels)")


# --------------------------------------------------------------------------- labels


def test_whole_float_labels_are_the_integers_they_hold(tmp_path):
    x = np.random.default_rng(5).random((40, 4), dtype=np.float32)
    np.savez(tmp_path / "i0.npz", x=x, y=np.arange(40) % 3)
    np.savez(tmp_path / "f0.npz", x=x, y=(np.arange(40) % 3).astype(np.float64))  # a pandas column
    ints = SiloFiles(files=str(tmp_path / "i{silo}.npz")).build(0, ONE)
    floats = SiloFiles(files=str(tmp_path / "f{silo}.npz")).build(0, ONE)
    for split in ("y_train", "y_val", "y_test"):
        assert getattr(floats, split).dtype == np.int64
        np.testing.assert_array_equal(getattr(floats, split), getattr(ints, split))


@pytest.mark.parametrize("kind", ["U", "S"])
def test_text_labels_are_mapped_through_class_names(tmp_path, kind):
    names = ["benign", "malignant", "unclear"]
    y_int = np.random.default_rng(6).integers(0, 2, 40)  # no silo holds "unclear"
    x = np.arange(40, dtype=np.float32)[:, None] * np.ones(3, np.float32)  # row i's features are i
    for silo in range(2):
        np.savez(tmp_path / f"t{silo}.npz", x=x, y=np.array(names)[y_int].astype(kind))
    path = config(tmp_path, {"files": str(tmp_path / "t{silo}.npz"), "class_names": names}, model={"name": "mlp"})
    agreed = agreed_in_process(load_config(path))
    assert agreed.data.num_classes() == 3  # every class named keeps its place in the model
    data = agreed.data.build(0, agreed.data_facts())
    for x_split, y_split in ((data.x_train, data.y_train), (data.x_test, data.y_test)):
        np.testing.assert_array_equal(y_split, y_int[x_split[:, 0].astype(int)])
    with pytest.raises(ConfigError, match=r"^data.class_names: lists 3 classes but data.classes is 4"):
        load_config(path, ["data.classes=4"])


def test_a_text_label_not_in_class_names_names_the_value_key_row_and_setting(tmp_path):
    y = np.array(["cat", "dog"] * 20)
    y[23] = "dgo"
    for silo in range(2):
        np.savez(tmp_path / f"t{silo}.npz", x=np.zeros((40, 3), np.float32), y=y)
    path = config(tmp_path, {"files": str(tmp_path / "t{silo}.npz"), "class_names": ["cat", "dog"]})
    line = one_line(path, 0, tmp_path / "t0.npz", ["model.name=mlp"])
    assert line.endswith(
        "y row 23 (of 40 rows) holds the label 'dgo', which data.class_names does not list "
        "(add it there, or fix that row)"
    )


def test_label_and_value_errors_name_the_users_key_and_row_not_the_split(tmp_path):
    """A 95-row file: its rows, not those of the splits cut from it."""
    x = np.random.default_rng(7).random((95, 1, 4, 4), dtype=np.float32)
    x[90, 0, 1, 2] = np.inf
    y = (np.arange(95) % 2).astype(float)
    y[61] = 0.25
    np.savez(tmp_path / "s0.npz", x=x, y=np.arange(95) % 2)
    np.savez(tmp_path / "s1.npz", x=np.zeros_like(x), y=y)
    path = config(tmp_path, {"files": str(tmp_path / "s{silo}.npz")})
    assert one_line(path, 0, tmp_path / "s0.npz").endswith(
        "x row 90 (of 95 rows) holds NaN or infinite values (fix or drop that row)"
    )
    np.savez(tmp_path / "s0.npz", x=np.zeros_like(x), y=np.arange(95) % 2)
    assert one_line(path, 1, tmp_path / "s1.npz").endswith(
        "y row 61 (of 95 rows) holds 0.25, not a whole number (labels are the integers 0, 1, ...; 1 row is not "
        "whole: fix it)"
    )


def test_label_errors_count_the_rows_at_fault_and_give_the_fix(tmp_path):
    """Out of range for data.classes: fix the rows or raise data.classes; negative or not
    whole: fix the rows; each with how many rows share the fault."""
    x = np.zeros((30, 1, 8, 8), np.float32)
    y = np.arange(30) % 3
    np.savez(tmp_path / "s0.npz", x=x, y=y)
    path = config(tmp_path, {"files": str(tmp_path / "s{silo}.npz"), "classes": 3})
    for labels, says in [
        (np.where(np.arange(30) == 4, 7, y), "holds the label 7, out of range for data.classes 3 (labels run from 0 "
         "to 2; 1 row is out of range: fix it, or raise data.classes)"),
        (np.where(np.arange(30) < 5, 3, y), "holds the label 3, out of range for data.classes 3 (labels run from 0 "
         "to 2; 5 rows are out of range: fix them, or raise data.classes)"),
        (y - 1, "holds the label -1 (labels run from 0; 10 rows are negative: fix them)"),
        (y + 0.5, "holds 0.5, not a whole number (labels are the integers 0, 1, ...; 30 rows are not whole: fix "
         "them)"),
    ]:  # fmt: skip
        np.savez(tmp_path / "s1.npz", x=x, y=labels)
        assert one_line(path, 1, tmp_path / "s1.npz").endswith(says)


def test_a_damaged_archive_or_npy_header_is_named_with_the_fix(tmp_path):
    """A zip member whose bytes changed fails its CRC; a .npy whose header is gone names that
    .npy, not only the silo's folder; both say to copy the file again."""
    x = np.random.default_rng(3).random((40, 1, 8, 8), dtype=np.float32)
    for silo in range(2):
        np.savez(tmp_path / f"s{silo}.npz", x=x, y=np.arange(40) % 2)
    damaged = bytearray((tmp_path / "s1.npz").read_bytes())
    damaged[len(damaged) // 3 : len(damaged) // 3 + 64] = bytes(64)
    (tmp_path / "s1.npz").write_bytes(bytes(damaged))
    line = one_line(config(tmp_path, {"files": str(tmp_path / "s{silo}.npz")}), 1, tmp_path / "s1.npz")
    assert line.endswith("cannot be read (BadZipFile: Bad CRC-32 for file 'x.npy'; copy it again, or save it anew)")
    for silo in range(2):
        (tmp_path / f"d{silo}").mkdir()
        np.save(tmp_path / f"d{silo}" / "x.npy", x)
        np.save(tmp_path / f"d{silo}" / "y.npy", np.arange(40) % 2)
    header = tmp_path / "d1" / "x.npy"
    header.write_bytes(bytes(16) + header.read_bytes()[16:])
    line = one_line(config(tmp_path, {"files": str(tmp_path / "d{silo}")}), 1, tmp_path / "d1")
    said = r"/d1\): x.npy cannot be read \(ValueError: .*; copy it again, or save it anew\)$"
    assert re.search(said, line), line


# --------------------------------------------------------------------------- manifest groups


def test_named_groups_are_numbered_in_order_of_first_appearance_and_group_clusters_follows(tmp_path):
    for silo in range(5):
        np.savez(tmp_path / f"s{silo}.npz", x=np.zeros((30, 3), np.float32), y=np.arange(30) % 2)
    groups = ["hospital_b", "clinic", "hospital_b", "hospital_a", "clinic"]
    (tmp_path / "m.csv").write_text("silo,path,group\n" + "".join(f"{s},s{s}.npz,{g}\n" for s, g in enumerate(groups)))
    data = {"manifest": str(tmp_path / "m.csv")}
    cfg = load_config(config(tmp_path, data, silos=5, model={"name": "mlp"}))
    np.testing.assert_array_equal(cfg.data.true_clusters(5), [0, 1, 0, 2, 1])
    clustered = load_config(config(tmp_path, {**data, "group_clusters": [0, 1, 0]}, silos=5, model={"name": "mlp"}))
    np.testing.assert_array_equal(clustered.data.true_clusters(5), [0, 1, 0, 0, 1])  # both hospitals one cluster
    assert agreed_in_process(clustered).data.build(3, clustered.data_facts()).group == 2
    with pytest.raises(ConfigError) as err:
        load_config(config(tmp_path, {**data, "group_clusters": [0, 1]}, silos=5, model={"name": "mlp"}))
    assert str(err.value) == (
        "data.group_clusters: give one non-negative cluster label per group of the manifest "
        "(3, in this order: hospital_b, clinic, hospital_a), got [0, 1]"
    )


def test_manifest_mistakes_name_the_manifest_and_its_line(tmp_path):
    for silo in range(2):
        np.savez(tmp_path / f"s{silo}.npz", x=np.zeros((30, 3), np.float32), y=np.arange(30) % 2)
    manifest = tmp_path / "m.csv"
    manifest.write_text("silo,path,group\n0,s0.npz,a\n1,s1.npz,\n")
    with pytest.raises(ConfigError, match=r"^data.manifest: .*m.csv line 3: no group, while line 2 gives one"):
        load_config(config(tmp_path, {"manifest": str(manifest)}))
    manifest.write_text("silo,path\n0,s0.npz\n1,sites/s1.npz\n")
    line = one_line(config(tmp_path, {"manifest": str(manifest)}, model={"name": "mlp"}), 1, tmp_path / "sites/s1.npz")
    assert line.endswith(
        f"not found (data.manifest {manifest} line 3 names it: fix the path there, relative to the manifest's folder)"
    )


# --------------------------------------------------------------------------- damaged files


def test_a_damaged_image_in_a_folder_is_named_itself(tmp_path):
    for silo in range(2):
        image_tree(tmp_path / f"site{silo}", "RGB", size=(8, 8))
    damaged = tmp_path / "site1" / "train" / "1" / "2.png"
    damaged.write_bytes(damaged.read_bytes()[:60])
    line = one_line(config(tmp_path, {"files": str(tmp_path / "site{silo}")}), 1, tmp_path / "site1")
    assert re.search(r"/site1\): image train/1/2.png cannot be read \(.*; replace or remove it\)$", line), line


def test_images_of_another_size_or_colour_suggest_the_setting_that_unites_them(tmp_path):
    image_tree(tmp_path / "site0", "RGB", size=(8, 8))
    Image.new("RGB", (9, 8)).save(tmp_path / "site0" / "train" / "1" / "9.png")
    image_tree(tmp_path / "site1", "RGB", size=(8, 8))
    Image.new("L", (8, 8)).save(tmp_path / "site1" / "train" / "1" / "9.png")
    path = config(tmp_path, {"files": str(tmp_path / "site{silo}")})
    assert re.search(
        r"is 9x8 colour, train's first image .* 8x8 colour \(set data.image_size to",
        one_line(path, 0, tmp_path / "site0"),
    )
    agreed_in_process(load_config(path, ["data.image_size=8", "data.channels=3"]))
    (tmp_path / "site0" / "train" / "1" / "9.png").unlink()
    assert re.search(
        r"is 8x8 grey, .* 8x8 colour \(set data.channels: 1 or 3 to", one_line(path, 1, tmp_path / "site1")
    )


def test_silos_whose_images_differ_in_size_or_colour_are_told_the_setting_that_unites_them(tmp_path):
    image_tree(tmp_path / "site0", "RGB", size=(8, 8))
    image_tree(tmp_path / "site1", "RGB", size=(10, 10))
    path = config(tmp_path, {"files": str(tmp_path / "site{silo}")})
    assert one_line(path, 1, tmp_path / "site1").endswith(
        f"its examples are 3x10x10, silo 0's ({tmp_path / 'site0'}) 3x8x8 "
        "(image folders: set data.image_size to resize every silo's images to one edge)"
    )
    assert agreed_in_process(load_config(path, ["data.image_size=8"])).sample_shape == (3, 8, 8)
    image_tree(tmp_path / "grey", "L", size=(8, 8))
    path = config(tmp_path, {"files": str(tmp_path / "site{silo}"), "image_size": 8})
    (tmp_path / "site1").rename(tmp_path / "colour")
    (tmp_path / "grey").rename(tmp_path / "site1")
    assert one_line(path, 1, tmp_path / "site1").endswith(
        "(set data.channels: 1 or 3 to give every silo's images one channel count)"
    )
    assert agreed_in_process(load_config(path, ["data.channels=1"])).sample_shape == (1, 8, 8)


def test_the_site_unlike_most_is_named_though_it_be_silo_0(tmp_path):
    """One grey site among three colour ones: the grey one is named, not silo 1 for being
    unlike silo 0; on a tie the lowest silo's shape is the reference."""
    image_tree(tmp_path / "site0", "L", size=(8, 8))
    for silo in (1, 2, 3):
        image_tree(tmp_path / f"site{silo}", "RGB", size=(8, 8))
    path = config(tmp_path, {"files": str(tmp_path / "site{silo}")}, silos=4)
    assert one_line(path, 0, tmp_path / "site0").endswith(
        f"its examples are 1x8x8, silo 1's ({tmp_path / 'site1'}) 3x8x8 "
        "(set data.channels: 1 or 3 to give every silo's images one channel count)"
    )
    path = config(tmp_path, {"files": str(tmp_path / "site{silo}")}, silos=2)
    assert "its examples are 3x8x8, silo 0's" in one_line(path, 1, tmp_path / "site1")


def test_a_truncated_npy_file_is_found_before_it_is_mapped(tmp_path):
    for silo in range(2):
        folder = tmp_path / f"site{silo}"
        folder.mkdir()
        np.save(folder / "x.npy", np.zeros((50, 1, 8, 8), np.float32))
        np.save(folder / "y.npy", np.arange(50) % 2)
    cut = tmp_path / "site1" / "x.npy"
    whole = cut.stat().st_size
    cut.write_bytes(cut.read_bytes()[: whole - 1000])
    line = one_line(config(tmp_path, {"files": str(tmp_path / "site{silo}")}), 1, tmp_path / "site1")
    assert line.endswith(
        f"): x.npy is cut short: its header gives (50, 1, 8, 8) of float32, {whole} bytes, the file holds "
        f"{whole - 1000} (copy it again)"
    )


def test_under_drop_a_long_reason_keeps_the_silo_its_file_and_the_fix(tmp_path, monkeypatch):
    """The reason a silo gives for leaving travels in a header of fixed width: a long one loses
    its middle, so the line every party prints still starts with the silo and its file and ends
    with the fix (before: it lost its end, the fix with it)."""
    monkeypatch.chdir(tmp_path)
    for silo in range(2):
        image_tree(Path(f"site{silo}"), "RGB", size=(8, 8))
    damaged = Path("site1/train/1") / ("an_image_with_a_long_name_" * 6 + ".png")
    damaged.write_bytes((damaged.parent / "2.png").read_bytes()[:60])
    cfg = load_config(config(tmp_path, {"files": "site{silo}"}, runtime={"on_silo_failure": "drop"}))
    why = local_reports(cfg, [1])[1]
    assert isinstance(why, str) and len(why) > MAX_WHY and why.endswith("; replace or remove it)")
    told = read_reports(report_frame(1, why), [1], leaving=True)[1]
    assert len(told) == MAX_WHY and told.startswith("data: silo 1 (site1): image train/1/an_image_with")
    assert told.endswith("_long_name_.png cannot be read (OSError: image file is truncated; replace or remove it)")
    assert " ... " in told


def test_under_the_real_job_a_bad_file_is_exit_2_one_line_and_no_results(tmp_path):
    """The simulator's command line, as a user runs it, on a silo whose labels are all NaN."""
    for silo in range(2):
        np.savez(tmp_path / f"s{silo}.npz", x=np.zeros((30, 1, 8, 8), np.float32), y=np.arange(30) % 2)
    np.savez(tmp_path / "s1.npz", x=np.zeros((30, 1, 8, 8), np.float32), y=np.full(30, np.nan))
    path = config(tmp_path, {"files": str(tmp_path / "s{silo}.npz")})
    proc = subprocess.run(
        [sys.executable, "-m", "cfl_mpi.backends.simulate", str(path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("cfl_mpi:")]
    assert proc.returncode == 2 and errors == [
        f"cfl_mpi: config error: data: silo 1 ({tmp_path / 's1.npz'}): y row 0 (of 30 rows) is nan: "
        "every example needs a label (fix or drop that row)"
    ], proc.stderr
    assert not (tmp_path / "run").exists()
