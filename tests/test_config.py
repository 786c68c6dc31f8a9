"""Every config mistake is one line naming the field and the fix."""
import textwrap

import pytest

from cfl_mpi.config import Config, ConfigError, EmdCflConfig, check_world, load_config
from cfl_mpi.data import check_data

BASE = """
name: t
silos: 4
data: {name: rotated_digits, rotations: [0, 180]}
train: {rounds: 2, local_epochs: 1}
strategy: {name: emdcfl, epsilon: 0.025}
"""


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_valid_config_and_overrides(tmp_path):
    cfg = load_config(write(tmp_path, BASE), ["strategy.epsilon=0.05", "train.rounds=3", "out=/x"])
    assert isinstance(cfg.strategy, EmdCflConfig)
    assert cfg.strategy.epsilon == 0.05 and cfg.train.rounds == 3 and str(cfg.results_dir()) == "/x"
    assert cfg.data.rotations == [0.0, 180.0] and cfg.world_size == 5


@pytest.mark.parametrize("override,field,words", [
    ("train.epochs=3", "train.epochs", "unknown key"),
    ("bogus=1", "bogus", "unknown key"),
    ("strategy.epsilon=abc", "strategy.epsilon", "expected a number"),
    ("train.rounds=2.5", "train.rounds", "expected an integer"),
    ("train.rounds=0", "train.rounds", "at least 1"),
    ("strategy.name=kmeans", "strategy.name", "unknown strategy"),
    ("strategy.distance=fast", "strategy.distance", "one of 'exact', 'sinkhorn'"),
    ("strategy.proj_ratio=1.5", "strategy.proj_ratio", "(0, 1]"),
    ("silos=3", "silos", "multiple of 2"),
    ("data.val_fraction=1", "data.val_fraction", "between 0 and 1"),
    ("data.name=rotated_mnist", "data.root", "needs the folder"),
    ("strategy.tolerance=1", "strategy.tolerance", "valid keys here"),
    ("strategy.distance=fedwad", "strategy.ground_cost", "set ground_cost to chordal"),
    ("strategy.fedwad_iterations=0", "strategy.fedwad_iterations", "at least 1"),
    ("strategy.fedwad_support=100000", "strategy.fedwad_support", "sample_cap"),
])
def test_errors_name_the_field(tmp_path, override, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, BASE), [override])
    message = str(err.value)
    assert message.startswith(field + ":") and words in message and "\n" not in message


def test_fedavg_has_no_epsilon(tmp_path):
    with pytest.raises(ConfigError, match=r"^strategy.epsilon: unknown key"):
        load_config(write(tmp_path, BASE.replace("name: emdcfl", "name: fedavg")))
    # Switching strategy on the command line drops the file's settings of the old one.
    assert load_config(write(tmp_path, BASE), ["strategy.name=fedavg"]).strategy.name == "fedavg"
    cfg = load_config(write(tmp_path, BASE.replace("emdcfl, epsilon: 0.025", "fedavg")),
                      ["strategy.name=emdcfl", "strategy.epsilon=0.5"])
    assert cfg.strategy.epsilon == 0.5


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "a: [1, 2\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_rank_count_must_match():
    cfg = Config(silos=8)
    check_world(cfg, 9)
    with pytest.raises(ConfigError, match=r"^silos: .*mpirun -n 9.*has 5"):
        check_world(cfg, 5)


def test_missing_data_folder(tmp_path):
    cfg = load_config(write(tmp_path, BASE), ["data.name=rotated_mnist", f"data.root={tmp_path / 'none'}",
                                               "data.download=false"])
    with pytest.raises(ConfigError, match=r"^data.root: MNIST files .* not found"):
        check_data(cfg)
