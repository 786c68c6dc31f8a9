"""Every config mistake is one line naming the field and the fix."""

import dataclasses
import subprocess
import sys
import typing

import pytest
from config_files import write_config
from conftest import PROJECT_ROOT

from cfl_mpi.config import Config, ConfigError, check_world, load_config, read_yaml
from cfl_mpi.data import REGISTRY as DATA_SETS
from cfl_mpi.strategies import REGISTRY
from cfl_mpi.strategies.emdcfl import EmdCflConfig


def check_data(cfg):
    cfg.data.check(cfg.data_facts())


PROJECT_CONFIG = PROJECT_ROOT / "configs" / "digits.yaml"

BASE = """
name: t
silos: 4
data: {name: rotated_digits, rotations: [0, 180]}
train: {rounds: 2, local_epochs: 1}
strategy: {name: emdcfl, epsilon: 0.025}
"""


def test_valid_config_and_overrides(tmp_path):
    cfg = load_config(write_config(tmp_path, BASE), ["strategy.epsilon=0.05", "train.rounds=3", "out=/x"])
    assert isinstance(cfg.strategy, EmdCflConfig)
    assert cfg.strategy.epsilon == 0.05 and cfg.train.rounds == 3 and str(cfg.results_dir()) == "/x"
    assert cfg.data.rotations == [0.0, 180.0] and cfg.world_size == 5


@pytest.mark.parametrize(
    "override,field,words",
    [
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
        ("data.silo_images=1", "data.silo_images", "at least 2 images"),
        ("runtime.device=gpu", "runtime.device", "expected one of 'auto', 'cpu', 'cuda'"),
        ("runtime.stop_after_round=3", "runtime.stop_after_round", "between 1 and train.rounds (2)"),
        ("runtime={checkpoint: false, stop_after_round: 1}", "runtime.stop_after_round", "runtime.checkpoint true"),
    ],
)
def test_errors_name_the_field(tmp_path, override, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, BASE), [override])
    message = str(err.value)
    assert message.startswith(field + ":") and words in message and "\n" not in message


def test_runtime_device_is_checked_without_torch():
    """Every rank validates the config before any work: asking for a GPU must not load torch there."""
    code = (
        "import sys; from cfl_mpi.config import load_config; "
        "cfg = load_config('configs/digits.yaml', ['runtime.device=cuda']); "
        "print(cfg.runtime.device, 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["cuda", "False"], proc.stderr[-2000:]
    assert load_config(PROJECT_CONFIG).runtime.device == "auto"


def test_fedavg_has_no_epsilon(tmp_path):
    with pytest.raises(ConfigError, match=r"^strategy.epsilon: unknown key"):
        load_config(write_config(tmp_path, BASE.replace("name: emdcfl", "name: fedavg")))
    # Switching strategy on the command line drops the file's settings of the old one.
    assert load_config(write_config(tmp_path, BASE), ["strategy.name=fedavg"]).strategy.name == "fedavg"
    cfg = load_config(
        write_config(tmp_path, BASE.replace("emdcfl, epsilon: 0.025", "fedavg")),
        ["strategy.name=emdcfl", "strategy.epsilon=0.5"],
    )
    assert cfg.strategy.epsilon == 0.5


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write_config(tmp_path, "a: [1, 2\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_rank_count_gives_the_silos_per_rank():
    cfg = Config(silos=8)
    assert cfg.world_size == 9 and check_world(cfg, 9) == 8  # one silo per rank
    assert check_world(cfg, 5) == 4 and check_world(cfg, 2) == 1  # blocks derived from -n
    for too_many_or_few in (10, 1):
        with pytest.raises(ConfigError, match=rf"^silos: .*2 to 9 ranks.*mpirun -n 9.*has {too_many_or_few} "):
            check_world(cfg, too_many_or_few)
    fixed = load_config(PROJECT_CONFIG, ["runtime.silos_per_rank=3"])
    assert fixed.world_size == 4 and check_world(fixed, 4) == 3
    with pytest.raises(ConfigError, match=r"^runtime.silos_per_rank: 8 silos at 3 per rank need 4 ranks.*has 9"):
        check_world(fixed, 9)
    with pytest.raises(ConfigError, match=r"^runtime.silos_per_rank: must lie between 1 and silos \(8\)"):
        load_config(PROJECT_CONFIG, ["runtime.silos_per_rank=9"])


def test_missing_data_folder(tmp_path):
    cfg = load_config(
        write_config(tmp_path, BASE),
        ["data.name=rotated_mnist", f"data.root={tmp_path / 'none'}", "data.download=false"],
    )
    with pytest.raises(ConfigError, match=r"^data.root: MNIST files .* not found"):
        check_data(cfg)


# ------------------------------------------------------------------ numbers: YAML 1.2 floats, finite only


def float_fields():
    """(overrides that select the section, dotted field, is a list) for every float field of the config."""
    for name, tp in typing.get_type_hints(Config).items():
        classes = (
            [(spec.params, [f"strategy.name={key}"]) for key, spec in REGISTRY.items()]
            if name == "strategy"
            else [(cls, [f"data.name={key}"]) for cls, key in {c: k for k, c in DATA_SETS.items()}.items()]
            if name == "data"
            else [(a, []) for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)]
        )
        for cls, select in classes:
            for field, hint in typing.get_type_hints(cls).items():
                if hint == list[float]:
                    yield select, f"{name}.{field}", True
                elif hint is float or float in typing.get_args(hint):
                    yield select, f"{name}.{field}", False


FLOATS = list(float_fields())


def test_the_catalogue_covers_every_float_field():
    names = {field for _, field, _ in FLOATS}
    assert {
        "train.lr",
        "train.weight_decay",
        "train.momentum",
        "strategy.epsilon",
        "strategy.beta",
        "runtime.message_timeout_s",
        "runtime.max_poll_sleep_ms",
        "data.rotations",
        "participation.fraction",
        "strategy.eps1",
    } <= names


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1" * 400])
@pytest.mark.parametrize("select,field,is_list", FLOATS, ids=[f for _, f, _ in FLOATS])
def test_non_finite_numbers_are_refused_in_every_float_field(tmp_path, select, field, is_list, value):
    text = f"[0, {value}]" if is_list else value
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, BASE), [*select, f"{field}={text}"])
    message = str(err.value)
    assert message.startswith(f"{field}{'[1]' if is_list else ''}: must be a finite number, got ")
    assert "\n" not in message and len(message) < 120


@pytest.mark.parametrize(
    "text,value",
    [("1e-3", 0.001), ("1E3", 1000.0), ("-2e+5", -2e5), (".5e2", 50.0), ("1.0e-3", 0.001), ("3", 3), ("0.025", 0.025)],
)
def test_yaml_1_2_floats_are_numbers(tmp_path, text, value):
    assert read_yaml(text) == value and type(read_yaml(text)) is type(value)
    assert load_config(write_config(tmp_path, BASE), [f"strategy.epsilon={text}"]).strategy.epsilon == value
    from_file = load_config(write_config(tmp_path, BASE.replace("epsilon: 0.025", f"epsilon: {text}")))
    assert from_file.strategy.epsilon == value


def test_strings_that_look_like_numbers_stay_strings():
    assert read_yaml("1e3x") == "1e3x" and read_yaml("'1e-3'") == "1e-3" and read_yaml("inf") == "inf"


@pytest.mark.parametrize(
    "override,field,words",
    [
        ("train.lr=inf", "train.lr", "expected a number, got 'inf'"),
        ("seed=18446744073709551616", "seed", "[0, 2**64)"),
        ("seed=-1", "seed", "[0, 2**64)"),
        ("data.rotations=[0,90", "--set data.rotations", "not a valid YAML value"),
        ("train.rounds=1e3", "train.rounds", "expected an integer, got 1000.0"),
    ],
)
def test_number_errors_name_the_field(tmp_path, override, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, BASE), [override])
    assert str(err.value).startswith(field + ":") and words in str(err.value) and "\n" not in str(err.value)


def test_silo_images_only_for_rotated_sets_and_within_the_pool(tmp_path):
    backdoor = BASE.replace("rotated_digits, rotations: [0, 180]", "backdoor_mnist, root: /x").replace(
        "silos: 4", "silos: 3"
    )
    with pytest.raises(ConfigError, match=r"^data.silo_images: unknown key \(valid keys here: name, group_clusters"):
        load_config(write_config(tmp_path, backdoor), ["data.silo_images=100"])
    cfg = load_config(write_config(tmp_path, BASE), ["data.silo_images=1439"])  # digits: 1,438 training-pool images
    with pytest.raises(ConfigError, match=r"^data.silo_images: 1439 images per silo, but .* holds 1438 "):
        check_data(cfg)
    check_data(load_config(write_config(tmp_path, BASE), ["data.silo_images=1438"]))
