"""A model of the user's own, named "package.module:factory": found at the config check, called
and checked at the start of the job (one line for each way it can be wrong), and trained like
a built-in one, here a 1-D CNN on signals each silo brings as feature vectors."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.models.build import prepare_weights
from cfl_mpi.runtime.agreement import agreed_in_process

SIGNALS = '''
from torch import nn
from cfl_mpi.models.split_model import SplitModel


def conv1d(input_shape, num_classes):
    """A 1-D CNN for signals of input_shape[-1] samples: its embedding ends in 16 values."""
    embedding = nn.Sequential(nn.Unflatten(1, (1, input_shape[-1])), nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(),
                              nn.AdaptiveAvgPool1d(2), nn.Flatten())
    return SplitModel(embedding, nn.Linear(16, num_classes))


def plain(input_shape, num_classes):
    return nn.Linear(input_shape[-1], num_classes)
'''


@pytest.fixture
def signals(tmp_path, monkeypatch):
    """A module of the user's, and four silos of 64-sample signals: a slow and a fast wave, two classes."""
    (tmp_path / "my_signals.py").write_text(SIGNALS)
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(0)
    t = np.linspace(0, 1, 64)
    for silo in range(4):
        y = rng.integers(0, 2, 80)
        freq = np.where(y == 1, 9.0, 3.0)[:, None]
        x = np.sin(2 * np.pi * freq * t) + 0.1 * rng.normal(size=(80, 64))
        np.savez(tmp_path / f"site{silo}.npz", x=x.astype(np.float32), y=y)

    def config(model: dict, **top):
        path = tmp_path / "c.yaml"
        data = {"name": "silo_files", "files": str(tmp_path / "site{silo}.npz")}
        train = {"rounds": 3, "local_epochs": 10, "lr": 0.05}
        path.write_text(
            yaml.safe_dump(
                {
                    "silos": 4,
                    "data": data,
                    "model": model,
                    "train": train,
                    "strategy": {"name": "fedavg"},
                    "out": str(tmp_path / "run"),
                    **top,
                }
            )
        )
        return path

    return config


def test_a_missing_module_or_a_bad_name_is_one_line_at_the_config_check(signals):
    with pytest.raises(ConfigError, match="model.name: module no_such_models not found"):
        load_config(signals({"name": "no_such_models:build", "embedding_dim": 16}))
    with pytest.raises(ConfigError, match="model.name: 'my_signals:' is not package.module:factory"):
        load_config(signals({"name": "my_signals:", "embedding_dim": 16}))
    with pytest.raises(ConfigError, match="model.embedding_dim: give the size of my_signals:conv1d's embedding"):
        load_config(signals({"name": "my_signals:conv1d"}))
    with pytest.raises(ConfigError, match="model.name: unknown model 'resnet19'"):
        load_config(signals({"name": "resnet19"}))


@pytest.mark.parametrize(
    "model, says",
    [
        ({"name": "my_signals:plain", "embedding_dim": 16}, "returned a Linear, not a cfl_mpi.models.split_model"),
        ({"name": "my_signals:missing", "embedding_dim": 16}, "my_signals has no function missing"),
        (
            {"name": "my_signals:conv1d", "embedding_dim": 12},
            r"model.embedding_dim: my_signals:conv1d's embedding gives",
        ),
    ],
)
def test_a_model_that_cannot_serve_is_one_line_before_any_work(signals, model, says):
    cfg = agreed_in_process(load_config(signals(model)))
    with pytest.raises(ConfigError, match=says):
        prepare_weights(cfg.architecture)


@pytest.mark.job
def test_your_own_model_trains_on_your_own_data(signals):
    from cfl_mpi.backends.simulate import simulate

    cfg = agreed_in_process(load_config(signals({"name": "my_signals:conv1d", "embedding_dim": 16})))
    prepare_weights(cfg.architecture)
    assert cfg.sample_shape == (64,) and cfg.data.num_classes() == 2
    summary = simulate(cfg, agreed=True)
    assert summary["ari"] is None and summary["avg_acc"] > 0.6
