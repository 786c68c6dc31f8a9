"""Silos that bring their own data: the formats a site has, the agreement before the first
round (every bad file one line naming the silo and its file), the registry's seam for a new
data set, and `export`: a built-in federation written as files gives the built-in run's
results bit for bit."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import yaml
from jobs import PROJECT_ROOT, assert_same_results, run_mpi, run_results
from PIL import Image

from cfl_mpi import data as data_sets
from cfl_mpi.commands.export import export
from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.data import DataConfig, DataFacts, SiloData, SiloFiles
from cfl_mpi.data.images import to_model_input
from cfl_mpi.data.report import REPORT_BYTES, DataReport, frame, read_frames
from cfl_mpi.runtime.agreement import agreed_in_process
from cfl_mpi.wire.messages import ProtocolError

SMALL = ["silos=8", "train.rounds=2", "train.local_epochs=1", "model.channels=[8,16]", "strategy.pair_keys=seeded"]
FACTS = DataFacts(silos=4, seed=0)


def files_config(tmp_path: Path, data: dict, silos: int = 4, **top) -> Path:
    path = tmp_path / "files.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "silos": silos,
                "data": {"name": "silo_files", **data},
                "train": {"rounds": 1, "local_epochs": 1},
                "model": {"channels": [8, 16]},
                "strategy": {"name": "fedavg"},
                **top,
            }
        )
    )
    return path


def write_silos(folder: Path, silos: int = 4, n: int = 40, shape=(1, 8, 8), classes: int = 3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(silos):
        np.savez(folder / f"site{s}.npz", x=rng.random((n, *shape), dtype=np.float32), y=np.arange(n) % classes)


# --------------------------------------------------------------------------- formats


def test_x_and_y_are_split_by_the_seed_and_the_silo_into_disjoint_sets(tmp_path):
    write_silos(tmp_path, n=50)
    params = SiloFiles(files=str(tmp_path / "site{silo}.npz"))
    a, again, other = params.build(0, FACTS), params.build(0, FACTS), params.build(1, FACTS)
    assert (len(a.y_train), len(a.y_val), len(a.y_test)) == (36, 4, 10)  # test 20 %, then validation 10 %
    np.testing.assert_array_equal(a.x_train, again.x_train)
    x = np.load(tmp_path / "site0.npz")["x"]
    rows = {tuple(r.ravel()) for r in x}
    parts = [{tuple(r.ravel()) for r in part} for part in (a.x_train, a.x_val, a.x_test)]
    assert set.union(*parts) == rows and sum(map(len, parts)) == len(rows)
    assert (
        not np.array_equal(a.y_train, other.y_train[: len(a.y_train)])
        or len(other.y_train) != len(a.y_train)
        or not np.array_equal(a.x_train[:3], other.x_train[:3])
    )


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "nhw"])
def test_image_layouts_and_uint8_pixels_become_the_model_layout(tmp_path, layout):
    rng = np.random.default_rng(1)
    nhwc = rng.integers(0, 256, (30, 6, 6, 3 if layout != "nhw" else 1), dtype=np.uint8)
    x = {"nchw": nhwc.transpose(0, 3, 1, 2), "nhwc": nhwc, "nhw": nhwc[..., 0]}[layout]
    np.savez(tmp_path / "s0.npz", x_train=x, y_train=np.arange(30) % 2, x_test=x[:5], y_test=np.zeros(5, np.int64))
    data = SiloFiles(files=str(tmp_path / "s{silo}.npz")).build(0, DataFacts(1, 0))
    channels = nhwc.shape[-1]
    assert data.x_test.shape == (5, channels, 6, 6) and data.x_test.dtype == np.float32
    np.testing.assert_array_equal(data.x_test, nhwc[:5].transpose(0, 3, 1, 2).astype(np.float32) / 255)
    assert data.x_test.strides == to_model_input(nhwc[:5] / 255, 0.0, 1.0).strides  # the built-in sets' layout
    assert len(data.y_train) + len(data.y_val) == 30


def test_feature_vectors_and_a_folder_of_memory_mapped_npy_files(tmp_path):
    folder = tmp_path / "site0"
    folder.mkdir()
    x = np.random.default_rng(2).normal(size=(40, 7)).astype(np.float32)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", np.arange(40) % 4)
    params = SiloFiles(files=str(tmp_path / "site{silo}"))
    assert isinstance(params._arrays(folder)[0]["x"], np.memmap)  # opened, not read
    data = params.build(0, DataFacts(1, 0))
    assert data.x_train.shape[1:] == (7,) and data.x_train.dtype == np.float32
    assert len(data.y_train) + len(data.y_val) + len(data.y_test) == 40


def test_a_2_gb_npy_file_opens_without_being_read(tmp_path):
    """The agreement reads a silo's examples a chunk at a time; opening one is a memory map."""
    import resource

    folder = tmp_path / "big"
    folder.mkdir()
    x = np.lib.format.open_memmap(folder / "x.npy", mode="w+", dtype=np.float32, shape=(1 << 19, 1024))  # 2 GiB
    del x
    np.save(folder / "y.npy", np.zeros(1 << 19, np.int64))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    arrays, _ = SiloFiles(files=str(tmp_path / "{silo}"))._arrays(folder)
    assert isinstance(arrays["x"], np.memmap) and arrays["x"].nbytes == 1 << 31
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: far below the file's 2 GiB


def test_an_image_folder_tree_with_its_own_test_split(tmp_path):
    rng = np.random.default_rng(3)
    for split, n in (("train", 6), ("test", 2)):
        for label in ("0", "1"):
            d = tmp_path / "site0" / split / label
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(d / f"{i}.png")
    data = SiloFiles(files=str(tmp_path / "site{silo}"), image_size=8).build(0, DataFacts(1, 0))
    assert data.x_test.shape == (4, 3, 8, 8) and sorted(data.y_test.tolist()) == [0, 0, 1, 1]
    assert len(data.y_train) + len(data.y_val) == 12


def test_a_manifest_names_each_silos_file_and_group(tmp_path):
    write_silos(tmp_path / "sites")
    rows = "".join(f"{s},sites/site{s}.npz,{s // 2}\n" for s in range(4))
    (tmp_path / "m.csv").write_text("silo,path,group\n" + rows)
    cfg = load_config(files_config(tmp_path, {"manifest": str(tmp_path / "m.csv")}))
    np.testing.assert_array_equal(cfg.data.true_clusters(4), [0, 0, 1, 1])
    assert cfg.data.files_of(3) == str(tmp_path / "sites" / "site3.npz")
    (tmp_path / "m.csv").write_text("silo,path\n0,a.npz\n0,b.npz\n")
    with pytest.raises(ConfigError, match="data.manifest: .* silo 0 is listed twice"):
        load_config(files_config(tmp_path, {"manifest": str(tmp_path / "m.csv")}, silos=2))


def test_without_known_groups_the_oracle_refuses_and_ifca_needs_k(tmp_path):
    write_silos(tmp_path)
    data = {"files": str(tmp_path / "site{silo}.npz")}
    with pytest.raises(ConfigError, match="strategy.name: oracle trains the true clusters"):
        load_config(files_config(tmp_path, data, strategy={"name": "oracle"}))
    with pytest.raises(ConfigError, match="strategy.k: the data set knows no groups"):
        load_config(files_config(tmp_path, data, strategy={"name": "ifca"}))
    load_config(files_config(tmp_path, data, strategy={"name": "ifca", "k": 2}))


# --------------------------------------------------------------------------- the agreement


def test_the_agreement_learns_the_shape_and_classes_from_the_silos(tmp_path):
    write_silos(tmp_path, shape=(1, 8, 8), classes=3)
    cfg = agreed_in_process(load_config(files_config(tmp_path, {"files": str(tmp_path / "site{silo}.npz")})))
    assert (cfg.sample_shape, cfg.data.num_classes()) == ((1, 8, 8), 3)


def test_each_file_is_read_once_the_agreement_hands_its_data_to_the_silo(tmp_path, monkeypatch):
    from cfl_mpi.data import silo_files

    write_silos(tmp_path)
    cfg = load_config(files_config(tmp_path, {"files": str(tmp_path / "site{silo}.npz")}))
    monkeypatch.setattr(silo_files, "_BUILT", {})  # other tests agree without building
    reads = []
    read = silo_files.SiloFiles._read
    monkeypatch.setattr(
        silo_files.SiloFiles, "_read", lambda self, silo, facts: reads.append(silo) or read(self, silo, facts)
    )
    agreed = agreed_in_process(cfg)
    for silo in range(4):
        agreed.data.build(silo, agreed.data_facts())
    assert reads == [0, 1, 2, 3] and not silo_files._BUILT


def test_a_report_frame_reads_back_and_a_hostile_one_is_refused_naming_the_silo():
    report = DataReport(ndim=3, axis0=1, axis1=8, axis2=8, max_label=2, labels_seen=3, n_train=5, n_val=1, n_test=2)
    frames = frame(0, report) + frame(1, report)
    assert len(frames) == 2 * REPORT_BYTES and read_frames(frames, [0, 1])[1].shape == (1, 8, 8)
    with pytest.raises(ProtocolError, match="silo 1 sent a bad message .*claims sender 0"):
        read_frames(frame(0, report) + frame(0, report), [0, 1])
    lying = DataReport(ndim=1, axis0=4, axis1=8, axis2=0, max_label=2, labels_seen=3, n_train=5, n_val=1, n_test=2)
    with pytest.raises(ProtocolError, match="silo 0 sent data of round 0 with a shape of 1 axes"):
        read_frames(frame(0, lying), [0])
    with pytest.raises(ProtocolError, match="silo 0 sent a bad message"):
        read_frames(b"{" + b" " * (REPORT_BYTES - 1), [0])


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[callable, str]]:
    """Each bad file a site may bring: how to make it (on silo 2) and what the one line says."""

    def npz(**arrays):
        return lambda p: np.savez(p, **arrays)

    x, y = np.zeros((40, 1, 8, 8), np.float32), np.arange(40) % 3
    nan = x.copy()
    nan[7, 0, 3, 3] = np.nan
    return {
        "missing": (lambda p: None, "not found"),
        "unreadable": (lambda p: p.write_bytes(b"not an archive"), "cannot be read"),
        "empty": (npz(x=x[:0], y=y[:0]), "too few examples"),
        "no arrays": (npz(z=x), "holds no x and y"),
        "other shape": (npz(x=np.zeros((40, 1, 9, 9), np.float32), y=y), "examples are 1x9x9, silo 0's .* 1x8x8"),
        "label out of range": (
            npz(x=x, y=y + 5),
            r"y row 0 \(of 40 rows\) holds the label 5, out of range for data.classes 3",
        ),
        "negative label": (
            npz(x=x, y=y - 1),
            r"y row 0 \(of 40 rows\) holds the label -1 \(labels run from 0; 14 rows",
        ),
        "fractional labels": (npz(x=x, y=y + 0.5), r"y row 0 \(of 40 rows\) holds 0.5, not a whole number"),
        "nan label": (npz(x=x, y=np.where(np.arange(40) == 9, np.nan, y)), r"y row 9 \(of 40 rows\) is nan"),
        "text labels without names": (npz(x=x, y=np.array(["a", "b"] * 20)), "text labels .* data.class_names"),
        "object labels": (lambda p: np.savez(p, x=x, y=np.array(["a"] * 40, dtype=object)), r"y holds Python objects"),
        "nan": (npz(x=nan, y=y), r"x row 7 \(of 40 rows\) holds NaN or infinite values"),
        "too few": (npz(x=x[:3], y=y[:3]), "too few examples for a val set"),
        "lengths differ": (npz(x=x, y=y[:30]), "x holds 40 examples but y 30 labels"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs(Path("."))))
def test_every_bad_silo_file_is_one_line_naming_the_silo_and_its_file(tmp_path, case):
    write_silos(tmp_path, classes=3)
    (tmp_path / "site2.npz").unlink()
    make, says = _bad_inputs(tmp_path)[case]
    make(tmp_path / "site2.npz")
    classes = {"classes": 3} if case == "label out of range" else {}
    cfg = load_config(files_config(tmp_path, {"files": str(tmp_path / "site{silo}.npz"), **classes}))
    with pytest.raises(ConfigError) as err:
        agreed_in_process(cfg)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"data: silo 2 ({tmp_path / 'site2.npz'})"), line
    assert __import__("re").search(says, line), line


def test_a_model_that_does_not_fit_the_agreed_shape_is_one_line(tmp_path):
    write_silos(tmp_path, shape=(1, 8, 10))  # not square: the simple CNN cannot take it, the MLP can
    path = files_config(tmp_path, {"files": str(tmp_path / "site{silo}.npz")})
    with pytest.raises(ConfigError, match=r"model.name: simple_cnn takes square images .* 1x8x10 \(as the silos'"):
        agreed_in_process(load_config(path))
    assert agreed_in_process(load_config(path, ["model.name=mlp"])).sample_shape == (1, 8, 10)


# --------------------------------------------------------------------------- a new data set


@dataclass(frozen=True)
class Blobs(DataConfig):
    """A toy data set: each silo's examples are Gaussian blobs around its group's centre."""

    name: Literal["blobs"] = "blobs"
    groups_of: int = 2
    group_clusters: list[int] | None = None

    def groups(self, silos: int) -> np.ndarray:
        return np.arange(silos) % self.groups_of

    def num_classes(self) -> int:
        return 2

    def sample_shape(self, imagenet: bool) -> tuple[int, ...]:
        return (6,)

    def build(self, silo: int, facts: DataFacts) -> SiloData:
        rng = np.random.default_rng([facts.seed, silo])
        group = int(self.groups(facts.silos)[silo])

        def part(n: int) -> tuple[np.ndarray, np.ndarray]:
            y = rng.integers(0, 2, n)
            x = rng.normal(size=(n, 6)).astype(np.float32) + (2 * y - 1)[:, None] * (1 - 2 * group)
            return x.astype(np.float32), y

        return SiloData(group, *part(60), *part(10), *part(20))


@pytest.mark.job
def test_a_new_data_set_is_one_class_and_one_registry_line(tmp_path, monkeypatch):
    from cfl_mpi.backends.simulate import simulate

    monkeypatch.setitem(data_sets.REGISTRY, "blobs", Blobs)
    path = tmp_path / "blobs.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "silos": 4,
                "data": {"name": "blobs"},
                "model": {"name": "mlp"},
                "train": {"rounds": 2, "local_epochs": 2},
                "strategy": {"name": "oracle"},
                "out": str(tmp_path / "run"),
            }
        )
    )
    summary = simulate(load_config(path))
    assert summary["ari"] == 1.0 and summary["avg_acc"] > 0.8


# --------------------------------------------------------------------------- export


@pytest.mark.job
def test_the_exported_quick_start_gives_the_built_in_results_bit_for_bit(tmp_path):
    from cfl_mpi.backends.simulate import simulate

    built_in = load_config(PROJECT_ROOT / "configs/digits.yaml", [*SMALL, f"out={tmp_path / 'built_in'}"])
    exported = export(built_in, tmp_path / "files")
    manifest = (tmp_path / "files" / "manifest.csv").read_text().splitlines()
    assert manifest[0] == "silo,path,group" and manifest[1] == "0,silo_0000.npz,0" and len(manifest) == 9
    simulate(built_in)
    simulate(load_config(exported, [f"out={tmp_path / 'files_run'}"]))
    assert_same_results(run_results(tmp_path / "built_in"), run_results(tmp_path / "files_run"))


def test_a_run_on_silo_files_resumes_with_the_config_it_started_with(tmp_path):
    """The results folder's config holds what the silos agreed on; a resume checks its config
    (shape and classes null, as written) before it agrees again: the same experiment, while
    another one is still refused."""
    from cfl_mpi.config import experiment_dict
    from cfl_mpi.runtime.checkpoint import check_resumable

    write_silos(tmp_path, classes=3)
    path = files_config(tmp_path, {"files": str(tmp_path / "site{silo}.npz")})
    (tmp_path / "run").mkdir()
    agreed = agreed_in_process(load_config(path))
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(experiment_dict(agreed), sort_keys=False))
    check_resumable(load_config(path), tmp_path / "run")
    with pytest.raises(ConfigError, match="data.classes: differs from the run being resumed"):
        check_resumable(load_config(path, ["data.classes=4"]), tmp_path / "run")


@pytest.mark.job
def test_the_exported_rotated_mnist_gives_the_built_in_results_bit_for_bit(tmp_path, shared_data):
    """16 silos of rotated MNIST on both splits (training pool, test split) as files: the same
    clusters, per-silo accuracies and W as the built-in data set. 300 training-pool images a
    silo (data.silo_images) are enough to compare, bit for bit: the silos still fall into two
    clusters (ARI 0.44), so the clusters compared are not all one."""
    sets = [
        f"data.root={shared_data / 'mnist'}",
        "data.download=false",
        "silos=16",
        "data.silo_images=300",
        "train.rounds=1",
        "train.local_epochs=1",
        "model.channels=[8,16]",
        "strategy.pair_keys=seeded",
    ]
    built_in = load_config(PROJECT_ROOT / "configs/rotated.yaml", [*sets, f"out={tmp_path / 'built_in'}"])
    from cfl_mpi.backends.simulate import simulate

    exported = export(built_in, tmp_path / "files")
    simulate(built_in)
    simulate(load_config(exported, [f"out={tmp_path / 'files_run'}"]))
    assert_same_results(run_results(tmp_path / "built_in"), run_results(tmp_path / "files_run"))


@pytest.mark.mpi
def test_under_mpirun_each_rank_opens_only_its_own_silos_files_and_the_results_match(tmp_path):
    """The exported quick start under `mpirun -n 5` (2 silos a rank), every file open audited:
    rank 0 opens no silo's file, each silo rank only its own silos'; the results are the
    simulator's on the built-in data, bit for bit."""
    from cfl_mpi.backends.simulate import simulate

    built_in = load_config(PROJECT_ROOT / "configs/digits.yaml", [*SMALL, f"out={tmp_path / 'built_in'}"])
    exported = export(built_in, tmp_path / "files")
    simulate(built_in)
    audit = tmp_path / "opens"
    audit.mkdir()
    silo_file = str(tmp_path / "files" / "silo_")  # the silos' data (config.yaml and the manifest hold none)
    hook = (
        "import os, sys, runpy\n"
        f"log = open(os.path.join({str(audit)!r}, 'rank' + os.environ.get('PMI_RANK', '0')), 'w')\n"
        "def seen(event, args):\n"
        f"    if event == 'open' and isinstance(args[0], str) and args[0].startswith({silo_file!r}):\n"
        "        log.write(args[0] + '\\n'); log.flush()\n"
        "sys.addaudithook(seen)\n"
        "sys.argv = ['cfl_mpi.main', *sys.argv[1:]]\n"
        "runpy.run_module('cfl_mpi.main', run_name='__main__')\n"
    )
    result = run_mpi(5, ["-c", hook, str(exported), "--out", str(tmp_path / "mpi"), "--quiet"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_results(run_results(tmp_path / "built_in"), run_results(tmp_path / "mpi"))
    opened = {r: {Path(p).name for p in (audit / f"rank{r}").read_text().split()} for r in range(5)}
    assert opened[0] == set()
    for rank in range(1, 5):
        assert opened[rank] == {f"silo_{s:04d}.npz" for s in (2 * rank - 2, 2 * rank - 1)}, opened


@pytest.mark.mpi
def test_under_mpirun_a_bad_silo_file_ends_the_job_in_seconds_with_one_line_and_exit_2(tmp_path):
    built_in = load_config(PROJECT_ROOT / "configs/digits.yaml", SMALL)
    exported = export(built_in, tmp_path / "files")
    bad = np.load(tmp_path / "files" / "silo_0005.npz")
    arrays = {k: bad[k] for k in bad.files}
    arrays["y_train"] = arrays["y_train"] + 10
    np.savez(tmp_path / "files" / "silo_0005.npz", **arrays)
    out = tmp_path / "run"
    start = time.monotonic()
    result = run_mpi(9, ["-m", "cfl_mpi.main", str(exported), "--out", str(out)])
    seconds = time.monotonic() - start
    errors = [line for line in result.stderr.splitlines() if line.startswith("cfl_mpi:")]
    assert result.returncode == 2, result.stderr[-3000:]
    rows = len(arrays["y_train"])
    assert errors == [
        f"cfl_mpi: config error: data: silo 5 ({tmp_path / 'files' / 'silo_0005.npz'}): y_train row 0 (of {rows} "
        f"rows) holds the label {arrays['y_train'][0]}, out of range for data.classes 10 (labels run from 0 to 9; "
        f"{rows} rows are out of range: fix them, or raise data.classes)"
    ], result.stderr
    assert not out.exists(), "nothing is written before the agreement"
    print(f"bad silo file under mpirun -n 9: exit 2 after {seconds:.1f} s")


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 8, 8), (12,)])
def test_validation_rows_lent_to_the_clustering_rejoin_training_as_every_other_strategy_splits(tmp_path, shape):
    """A small site holds out at least 32 rows where the strategy reads validation (EMD-CFL's
    τ and noise); once clustered it trains on exactly the rows, in the order and the memory
    layout, that a strategy holding out the paper's 10 % trains on, and validates on the rest."""
    write_silos(tmp_path, silos=1, n=120, shape=shape)
    files = SiloFiles(files=str(tmp_path / "site{silo}.npz"))
    lends = files.build(0, DataFacts(1, 0, validation=True))
    plain = files.build(0, DataFacts(1, 0))
    assert plain.lent is None and files.lent_rows(DataFacts(1, 0)) == 0
    assert lends.lent is not None and 0 < len(lends.lent.rows) <= files.lent_rows(DataFacts(1, 0, validation=True))
    assert len(lends.y_val) == 32 and len(plain.y_val) == 10  # 10 % of the 96 rows the test split leaves
    clustered = lends.clustered()
    for mine, theirs in ((clustered.x_train, plain.x_train), (clustered.x_val, plain.x_val)):
        assert mine.strides == theirs.strides
        np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(clustered.y_train, plain.y_train)
    np.testing.assert_array_equal(clustered.y_val, plain.y_val)
    assert clustered.lent is None and clustered.clustered() is clustered


def test_a_validation_share_given_lends_nothing(tmp_path):
    write_silos(tmp_path, silos=1, n=120)
    files = SiloFiles(files=str(tmp_path / "site{silo}.npz"), val_fraction=0.3)
    assert files.build(0, DataFacts(1, 0, validation=True)).lent is None
    assert files.lent_rows(DataFacts(1, 0, validation=True)) == 0
