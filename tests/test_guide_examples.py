"""The how-to guide's examples of one's own data and model run as written: their code blocks
are read from docs/how-to/your-own-data.md, the Python written to the file its first comment
names and run there, the YAML loaded as the config it shows."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import yaml
from jobs import PROJECT_ROOT

from cfl_mpi.config import load_config
from cfl_mpi.runtime.agreement import agreed_in_process

GUIDE = PROJECT_ROOT / "docs" / "how-to" / "your-own-data.md"
TITLE = "# Your own data (`data.name: silo_files`)"


def guide_blocks(language: str) -> list[str]:
    """The `language` code blocks of the guide's page on one's own data and model, in order."""
    text = GUIDE.read_text()
    assert text.startswith(TITLE + "\n"), f"{GUIDE} no longer opens with {TITLE!r}"
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def write_python_blocks(folder: Path) -> list[Path]:
    """Each Python block written to the file its first line names (`# my_models/signals.py ...`)."""
    files = []
    for block in guide_blocks("python"):
        named = re.match(r"# (\S+\.py)\b", block)
        assert named, f"a Python block of the guide names no file in its first line:\n{block}"
        path = folder / named[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block)
        files.append(path)
    return files


def test_the_guides_own_data_example_runs_as_written(tmp_path, monkeypatch):
    """write_sites.py makes the files the guide's config names; the silos then agree on grey
    28x28 images and the two classes named."""
    monkeypatch.chdir(tmp_path)  # the config's files path is relative to where the job starts
    (script,) = [p for p in write_python_blocks(tmp_path) if p.name == "write_sites.py"]
    runpy.run_path(str(script), run_name="__main__")
    configs = [b for b in guide_blocks("yaml") if "data:" in b]
    assert len(configs) == 1
    path = tmp_path / "config.yaml"
    path.write_text(configs[0])
    cfg = agreed_in_process(load_config(path, [f"out={tmp_path / 'run'}"]))
    assert (cfg.sample_shape, cfg.data.num_classes(), cfg.strategy.name) == ((1, 28, 28), 2, "emdcfl")
    data = cfg.data.build(3, cfg.data_facts())
    assert set(np.unique(data.y_train)) == {0, 1} and len(data.y_train) + len(data.y_val) + len(data.y_test) == 95


@pytest.mark.job
def test_the_guides_own_model_trains_on_silos_of_vectors(tmp_path, monkeypatch):
    """my_models/signals.py as the guide writes it, named by the guide's `model:` line, on
    silos that hold vectors (N, 64) as the guide says: one round of FedAvg."""
    from cfl_mpi.backends.simulate import simulate

    write_python_blocks(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (model,) = [yaml.safe_load(b)["model"] for b in guide_blocks("yaml") if b.startswith("model:")]
    rng = np.random.default_rng(0)
    for silo in range(2):
        y = rng.integers(0, 3, 60)
        x = rng.normal(size=(60, 64)).astype(np.float32) + y[:, None].astype(np.float32)
        np.savez(tmp_path / f"signals{silo}.npz", x=x, y=y)
    path = tmp_path / "signals.yaml"
    body = {
        "silos": 2,
        "data": {"name": "silo_files", "files": str(tmp_path / "signals{silo}.npz")},
        "model": model,
        "train": {"rounds": 1, "local_epochs": 1},
        "strategy": {"name": "fedavg"},
        "out": str(tmp_path / "run"),
    }
    path.write_text(yaml.safe_dump(body))
    summary = simulate(load_config(path))
    assert summary["rounds"] == 1 and 0.0 <= summary["avg_acc"] <= 1.0
