"""Run configuration: YAML validated into frozen, typed dataclasses before any MPI work.

Every mistake a user can make in a config (unknown key, wrong type, bad value, missing
data) becomes one `ConfigError` line that names the dotted field and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ..aggregation.rules import AggregationConfig
from ..data import REGISTRY as DATA_SETS
from ..data import DataConfig, DataFacts, RotatedData
from ..models.params import TORCHVISION_MODELS, Architecture, ModelConfig
from ..privacy.dp import PrivacyConfig, noise_multiplier_for
from ..settings import ConfigError
from ..strategies import REGISTRY, ConfigFacts, StrategyConfig
from ..strategies.emdcfl import EmdCflConfig
from ..strategies.spec import SEED_LIMIT
from ..training.params import TrainConfig
from .runtime import (
    HOSTILE_UPDATES,
    LateSilo,
    ParticipationConfig,
    RuntimeConfig,
    late_silo_problems,
    participant_count,
)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading YAML 1.2's floats too.

    PyYAML follows YAML 1.1, whose floats need a dot and a signed exponent (1.0e-3), so
    `lr: 1e-3` or `--set train.lr=1e-3` would arrive as the string "1e-3". YAML 1.2 (core
    schema) reads every form `[-+]?(.d+ | d+(.d*)?)([eE][-+]?d+)?` as a float; the resolver
    below adds the exponent forms 1.1 misses. Integers still resolve first (1e3 is a float).
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def yaml_hints(cls: type) -> dict[str, Any]:
    """`cls`'s field types as YAML gives them: a derived field's type or null."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("derived"):
            hints[f.name] = hints[f.name] | None
    return hints


def read_yaml(text: str) -> Any:
    """Parse YAML text the way every config, `--set` value and saved config is read."""
    return yaml.load(text, Loader=_Loader)


# A run: the top-level keys of its YAML file and one section per part (data, model, train, ...).
@dataclass(frozen=True)
class Config:
    # Name of the run: printed, in plot titles, and part of the default results folder (out).
    name: str = "run"
    # Seed of the run's random draws (data split, initial model, batches, participation).
    seed: int = 0
    # Number of silos (federated clients); data says how they are grouped into true clusters.
    silos: int = 8
    # The data set, chosen by data.name; its other keys depend on that choice.
    data: DataConfig = field(default_factory=RotatedData)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # The federated method, chosen by strategy.name; its other keys depend on that choice.
    strategy: StrategyConfig = field(default_factory=EmdCflConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    participation: ParticipationConfig = field(default_factory=ParticipationConfig)
    late_silos: list[LateSilo] = field(default_factory=list)
    # Results folder; `--out` overrides it. Default: runs/<name>_<strategy>_s<seed>.
    out: str | None = None

    @property
    def world_size(self) -> int:
        """Ranks the job needs: the server's, and one per block of `runtime.silos_per_rank` silos
        (one per silo by default)."""
        return 1 + -(-self.silos // (self.runtime.silos_per_rank or 1))

    def join_round(self, silo: int) -> int:
        """The first round silo `silo` takes part in (1 unless it is a late silo)."""
        return next((late.round for late in self.late_silos if late.silo == silo), 1)

    def results_dir(self) -> Path:
        return Path(self.out or f"runs/{self.name}_{self.strategy.name}_s{self.seed}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def data_facts(self) -> DataFacts:
        """What the data set is built for besides its own section."""
        return DataFacts(
            self.silos, self.seed, self.model.name in TORCHVISION_MODELS, REGISTRY[self.strategy.name].validation
        )

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one model input a silo holds: (channels, height, width) or (features,)."""
        return self.data.sample_shape(self.model.name in TORCHVISION_MODELS)

    @property
    def architecture(self) -> Architecture:
        """What the silos' model is built from (models/build.py)."""
        return Architecture(self.model, self.sample_shape, self.data.num_classes())


# --------------------------------------------------------------------------- parsing


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the type hint `tp`; return it converted (int→float only)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif tp is StrategyConfig:  # the registry's class for strategy.name
        return _strategy(value, where)
    elif tp is DataConfig:  # the data sets' registry's class for data.name
        return _data_set(value, where)
    elif origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is not None and len(args) == 2 and type(None) in args:  # optional: the inner error is the useful one
            return _coerce(value, next(a for a in args if a is not type(None)), where)
        if float in args and isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite(value, where)  # a number or "auto": a number's own error is the useful one
        for arg in args:
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                continue
    elif origin is list:
        if isinstance(value, list):
            (item,) = typing.get_args(tp)
            return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass(tp, value, where)
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite(value, where)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def _finite(value: int | float, where: str) -> float:
    """Every float field must be finite: none of them has a meaning for inf or NaN (a
    learning rate, a decay, a threshold, an angle, a fraction or a timeout that is infinite
    trains NaN weights, merges or splits everything, or waits forever on a dead peer)."""
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range, e.g. 10**400
        number = math.inf
    if not math.isfinite(number):
        text = repr(value) if len(repr(value)) <= 24 else repr(value)[:20] + "..."
        raise ConfigError(f"{where}: must be a finite number, got {text}")
    return number


def _dataclass(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of {cls.__name__} fields, got {value!r}")
    hints = yaml_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in value if k not in names]
    if unknown:
        key = f"{where}.{unknown[0]}" if where else str(unknown[0])
        raise ConfigError(f"{key}: unknown key (valid keys here: {', '.join(names)})")
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [k for k in required if k not in value]
    if missing:
        key = f"{where}.{missing[0]}" if where else missing[0]
        raise ConfigError(f"{key}: missing (required fields here: {', '.join(required)})")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in value.items()}
    return cls(**kwargs)


def _strategy(value: Any, where: str) -> Any:
    if not isinstance(value, dict) or "name" not in value:
        raise ConfigError(f"{where}.name: missing (choose one of {', '.join(REGISTRY)})")
    spec = REGISTRY.get(value["name"])
    if spec is None:
        raise ConfigError(f"{where}.name: unknown strategy {value['name']!r} (choose one of {', '.join(REGISTRY)})")
    return _dataclass(spec.params, value, where)


def _data_set(value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping with a name (one of {', '.join(DATA_SETS)}), got {value!r}")
    name = value.get("name", RotatedData.name)
    cls = DATA_SETS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(f"{where}.name: unknown data set {name!r} (choose one of {', '.join(DATA_SETS)})")
    return _dataclass(cls, value, where)


def _privacy_problems(cfg: Config) -> Iterator[str]:
    """What `privacy.dp` covers: DP-FedAvg of every cluster, within the budget a silo that
    trains every round would spend."""
    if not cfg.privacy.on:
        return
    if cfg.aggregation.rule != "fedavg":
        yield (
            f"privacy.dp: noises DP-FedAvg's clipped sum, not aggregation.rule {cfg.aggregation.rule} "
            "(set aggregation.rule: fedavg)"
        )
    if REGISTRY[cfg.strategy.name].own_aggregation:
        yield f"privacy.dp: {cfg.strategy.name} aggregates its own models, which DP-FedAvg does not cover"
    if cfg.privacy.dp == "distributed" and not cfg.aggregation.secure:
        yield (
            "privacy.dp: distributed noise is sound only where the server reads sums (set aggregation.secure: "
            "true and aggregation.screen: false, or privacy.dp: central)"
        )
    budget, rounds = cfg.privacy.epsilon, cfg.train.rounds
    if budget is not None and (spent := cfg.privacy.spent(rounds)) > budget:
        z = noise_multiplier_for(budget, rounds, cfg.privacy.delta)
        yield (
            f"privacy.epsilon: noise_multiplier {cfg.privacy.noise_multiplier:g} spends ε = {spent:.3g} in "
            f"{rounds} rounds, over {budget:g} (set privacy.noise_multiplier to {z:g} or more)"
        )


def _secure_problems(cfg: Config) -> Iterator[str]:
    """What `aggregation.secure` covers: clusters whose server reads sums, never one update."""
    if not cfg.aggregation.secure:
        return
    spec = REGISTRY[cfg.strategy.name]
    if spec.reads_updates or spec.own_aggregation:
        yield (
            f"aggregation.secure: {cfg.strategy.name}'s server reads each silo's update (to cluster or pick its "
            "models), which secure aggregation hides (choose emdcfl, pacfl, fedwad, fedavg or oracle)"
        )
    if cfg.privacy.dp == "central":
        yield (
            "aggregation.secure: privacy.dp central adds its noise to updates the server reads in the clear "
            "(set privacy.dp: distributed, where the silos add it)"
        )
    fault = cfg.runtime.fault
    if fault is not None and (fault.kind in HOSTILE_UPDATES or fault.kind == "raise_after_update"):
        yield f"runtime.fault.kind: {fault.kind} plays with a plain update, which aggregation.secure masks"


def _fault_problems(cfg: Config) -> Iterator[str]:
    fault = cfg.runtime.fault
    if fault is not None and fault.kind == "raise_after_shares" and not cfg.aggregation.secure:
        yield "runtime.fault.kind: raise_after_shares fails in a secure round (set aggregation.secure: true)"


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate(cfg: Config) -> None:
    """Value checks the types cannot express, each naming the field and the fix."""
    _check(cfg.silos >= 1, f"silos: must be at least 1, got {cfg.silos}")
    _check(0 <= cfg.seed < SEED_LIMIT, f"seed: must be an integer in [0, 2**64), got {cfg.seed}")
    for problem in cfg.data.problems(cfg.data_facts()):
        raise ConfigError(problem)
    for problem in cfg.model.problems():
        raise ConfigError(problem)
    if not cfg.data.per_silo_files or cfg.data.input_shape is not None:
        for problem in cfg.model.fit_problems(cfg.sample_shape):
            raise ConfigError(problem)
    for name in ("rounds", "local_epochs", "batch_size"):
        value = getattr(cfg.train, name)
        _check(value == "all" or value >= 1, f"train.{name}: must be at least 1, got {value}")
    _check(cfg.train.lr > 0, f"train.lr: must be positive, got {cfg.train.lr}")
    _check(0 <= cfg.train.momentum < 1, f"train.momentum: must lie in [0, 1), got {cfg.train.momentum}")
    _check(cfg.train.weight_decay >= 0, f"train.weight_decay: must be non-negative, got {cfg.train.weight_decay}")
    for problem in cfg.aggregation.problems():
        raise ConfigError(problem)
    for problem in (*cfg.privacy.problems(), *_privacy_problems(cfg), *_secure_problems(cfg), *_fault_problems(cfg)):
        raise ConfigError(problem)
    federation = (
        *cfg.participation.problems(cfg.silos),
        *late_silo_problems(cfg.late_silos, cfg.silos, cfg.train.rounds),
        *([] if cfg.runtime.fault is None else cfg.runtime.fault.problems(cfg.silos, cfg.train.rounds)),
    )
    for problem in federation:
        raise ConfigError(problem)
    facts = _facts(cfg)
    for problem in cfg.strategy.problems(facts):
        raise ConfigError(problem)
    _check(
        facts.known_clusters is not None or not REGISTRY[cfg.strategy.name].sees_truth,
        f"strategy.name: {cfg.strategy.name} trains the true clusters, and the data set knows none "
        "(give the manifest a group column, or choose another strategy)",
    )
    for problem in cfg.runtime.problems(cfg.silos, cfg.model.name, cfg.train.rounds):
        raise ConfigError(problem)


def _facts(cfg: Config) -> ConfigFacts:
    """What a strategy's parameters are checked against (participation and late silos valid)."""
    p = cfg.participation
    present = cfg.silos - len(cfg.late_silos)
    truth = cfg.data.true_clusters(cfg.silos)
    return ConfigFacts(
        cfg.silos,
        cfg.model.embedding_dim,
        participant_count(p, present),
        p.fraction is None and p.count is None and not cfg.late_silos,
        None if truth is None else len(set(truth.tolist())),
    )


def _apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one `--set a.b.c=value`; the value is parsed as YAML (so 0.05 is a number).

    `--set strategy.name=X` starts a fresh strategy section; later `--set strategy.k=v` fill it;
    so does `--set data.name=X` for a data set of another kind.
    """
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment}: expected key=value, e.g. --set train.rounds=2")
    key, text = assignment.split("=", 1)
    try:
        value = read_yaml(text) if text else ""
    except yaml.YAMLError:
        raise ConfigError(f"--set {key}: {text!r} is not a valid YAML value (check its brackets and quotes)") from None
    node = raw
    parts = key.strip().split(".")
    if parts == ["strategy", "name"]:  # another strategy: the file's settings of the old one no longer apply
        raw["strategy"] = {"name": value}
        return
    section = raw.get("data")
    old = DATA_SETS.get(section.get("name", RotatedData.name)) if isinstance(section, dict) else None
    if parts == ["data", "name"] and isinstance(value, str) and DATA_SETS.get(value) is not old:
        raw["data"] = {"name": value}  # another kind of data set: the old one's keys no longer apply
        return
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read, override and validate a YAML config; raise ConfigError with a one-line message."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config: file {path} not found (give the path of a YAML file, e.g. configs/digits.yaml)")
    try:
        raw = read_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config: {path} is not valid YAML{where} (fix the syntax)") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {path} must hold a mapping of sections (data, model, train, strategy, ...)")
    for assignment in overrides:
        _apply_override(raw, assignment)
    cfg = _dataclass(Config, raw, "")
    _validate(cfg)
    return cfg


def check_world(cfg: Config, world_size: int) -> int:
    """The silo ranks a job of `world_size` ranks runs the config on (ConfigError if none fits).

    With `runtime.silos_per_rank` the rank count is fixed; without it any count from 2 (all
    silos on one rank) to silos + 1 (one silo per rank) works, in blocks of consecutive silos.
    """
    k = cfg.runtime.silos_per_rank
    if k is not None and world_size != cfg.world_size:
        raise ConfigError(
            f"runtime.silos_per_rank: {cfg.silos} silos at {k} per rank need {cfg.world_size} ranks "
            f"(mpirun -n {cfg.world_size}) but the job has {world_size} (start it with -n {cfg.world_size}, "
            f"or remove runtime.silos_per_rank to derive it from -n)"
        )
    if not 2 <= world_size <= cfg.silos + 1:
        raise ConfigError(
            f"silos: the config asks for {cfg.silos} silos, so the job needs 2 to {cfg.silos + 1} ranks "
            f"(the server and one rank per silo, or per block of silos: mpirun -n {cfg.silos + 1}) but it has "
            f"{world_size} (start it with -n {cfg.silos + 1}, "
            "or run python -m cfl_mpi.backends.simulate for one process)"
        )
    return world_size - 1


# Sections a resumed run may change: timeouts and faults are not the experiment, and the
# results folder may have moved.
NOT_THE_EXPERIMENT = ("runtime", "out")


def experiment_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config without NOT_THE_EXPERIMENT, as plain YAML/JSON types."""
    return {k: v for k, v in cfg.to_dict().items() if k not in NOT_THE_EXPERIMENT}


def config_digest(cfg: Config) -> str:
    """SHA-256 of the experiment's resolved config (canonical JSON): the checkpoint records
    it, so a resume with another experiment's config is refused even without config.yaml."""
    text = json.dumps(experiment_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
