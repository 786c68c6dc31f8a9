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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from .data import REGISTRY as DATA_SETS
from .data import DataFacts, DataParams, RotatedData
from .settings import ConfigError, derived
from .strategies import REGISTRY, ConfigFacts, StrategyParams
from .strategies.emdcfl import EmdCflConfig
from .strategies.spec import SEED_LIMIT


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


# The torchvision models (EMD-CFL paper, Appendix D.2) and their embedding sizes dim(Z): the pooled features
# in front of the classifier. The simple CNN's embedding_dim is free (default 128).
TORCHVISION_MODELS = {
    "resnet18": 512,
    "resnet50": 2048,
    "efficientnet_b3": 1536,
    "vit_b_16": 768,
    "convnext_base": 1024,
}
IMAGENET_INPUT_SIZE = 224  # what the paper feeds the ImageNet models
MLP_HIDDEN = 200  # IFCA's rotated-MNIST network: 784-200-10
# Models whose forward is a function of their parameters and input alone: no buffers (BatchNorm's
# running statistics), no random layers (dropout, stochastic depth), which a stacked forward
# would share between silos (runtime.silo_training: batched).
BATCHABLE_MODELS = ("simple_cnn", "mlp")
BUILT_IN_MODELS = ("simple_cnn", "mlp", *TORCHVISION_MODELS)


# The network every silo trains; the embedding methods read its embedding Z (the pooled features).
@dataclass(frozen=True)
class ModelConfig:
    # simple_cnn: two convolutions and two fully connected layers (sizes below); mlp: IFCA's
    # fully connected network (the flattened image, one hidden ReLU layer of embedding_dim
    # units, the embedding, then the classes); the others are torchvision's models
    # (TORCHVISION_MODELS), fed 224x224 inputs by default. Your own: "package.module:factory",
    # a function of (input_shape, num_classes) that returns a cfl_mpi.models.SplitModel (set
    # embedding_dim to its embedding's size).
    name: Literal["simple_cnn", "mlp", "resnet18", "resnet50", "efficientnet_b3", "vit_b_16", "convnext_base"] | str = (
        "simple_cnn"
    )
    # simple_cnn, the EMD-CFL paper's (Appendix D.2): conv 64, conv 128, fc 128 (embedding), fc classes.
    channels: list[int] = field(default_factory=lambda: [64, 128])
    # simple_cnn's 2x2 max-pools: 1, after the second conv (the authors' network, the paper
    # configs), or 2, after each conv (4x cheaper; the default, for CPU runs and tests).
    pools: Literal[1, 2] = 2
    # dim(Z); null: 128 for the simple CNN, 200 for the MLP (IFCA's hidden layer), the model's
    # own size for torchvision models; your own model's must be given.
    embedding_dim: int = derived()
    # false: random initialisation; true: torchvision's ImageNet weights (torch's cache, or
    # downloaded by rank 0 / `python -m cfl_mpi.prepare`); a path: a weights file (a state
    # dict of the torchvision model, or of a cfl_mpi model), read with weights_only=True.
    pretrained: bool | str = False
    # Edge of the images the model is fed: batches are resized (bilinear) from data.image_size
    # on the device. null: 224 for the torchvision models (paper), data.image_size for the
    # simple CNN (which is built for that size and does not resize).
    input_size: int | None = None

    @property
    def own(self) -> bool:
        """A model of the user's own, named by its factory ("package.module:factory")."""
        return ":" in self.name

    def __post_init__(self) -> None:
        if self.embedding_dim is None and not self.own:
            object.__setattr__(
                self, "embedding_dim", TORCHVISION_MODELS.get(self.name, MLP_HIDDEN if self.name == "mlp" else 128)
            )
        if self.input_size is None and self.name in TORCHVISION_MODELS:
            object.__setattr__(self, "input_size", IMAGENET_INPUT_SIZE)


# The federated rounds and each silo's local training (SGD with momentum, training.py).
@dataclass(frozen=True)
class TrainConfig:
    # Federated rounds: in each, the participating silos train locally, then each cluster
    # averages their updates into its model.
    rounds: int = 10
    # Epochs of local training per silo and round (E in EMD-CFL's Algorithm 1).
    local_epochs: int = 10
    # Local SGD: its learning rate (lr), momentum and weight_decay (L2 penalty).
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-6
    # Mini-batch size of local training (and of the embeddings with strategy.embed_mode: train);
    # all: full-batch steps, each epoch one gradient step on the silo's whole training set
    # (IFCA's regime: local_epochs are then its τ local steps).
    batch_size: int | Literal["all"] = 64

    def batch(self, n: int) -> int:
        """The mini-batch size for a set of `n` samples."""
        return max(1, n) if self.batch_size == "all" else self.batch_size


@dataclass(frozen=True)
class AggregationConfig:
    """How each cluster's updates become its model (aggregation.py, every strategy)."""

    # fedavg: weighted by sample counts (the paper's, EMD-CFL Alg. 1 line 21); median and
    # trimmed_mean: coordinate-wise and unweighted (Yin et al. 2018); norm_clip: every update
    # clipped to norm clip_norm, then FedAvg (Sun et al. 2019).
    rule: Literal["fedavg", "median", "trimmed_mean", "norm_clip"] = "fedavg"
    # trimmed_mean: the fraction β of values cut at each end of every coordinate (⌊β·members⌋).
    trim: float = 0.1
    # norm_clip: the bound M on an update's norm; null: the cluster's median update norm.
    clip_norm: float | None = None
    # Check every update against the silo's start model and the other members of its cluster
    # before the rule (aggregation.screen_updates; decisions go to metrics.jsonl).
    screen: bool = True
    # An update whose norm exceeds norm_ratio times the cluster's median is rejected, or
    # scaled down to that bound ("clip"). A sample count is lowered to the silo's first
    # report and to count_ratio times the cluster's median.
    outliers: Literal["reject", "clip"] = "reject"
    norm_ratio: float = 4.0
    count_ratio: float = 2.0


@dataclass(frozen=True)
class ParticipationConfig:
    """Which silos train in a round (EMD-CFL paper, Appendix E.4: sampled at random each round).

    Give `fraction` (of the silos present) or `count`; neither: every silo, every round.
    The draw depends on (seed, round) only, so a resumed run draws the same silos.
    """

    # Fraction of the silos present that train in a round (rounded up, at least one).
    fraction: float | None = None
    # Number of silos that train in a round (all of those present if fewer).
    count: int | None = None


def participant_count(p: ParticipationConfig, present: int) -> int:
    """How many of the `present` silos train in a round (at least one)."""
    if p.count is not None:
        return min(p.count, present)
    if p.fraction is not None:
        return max(1, min(present, math.ceil(p.fraction * present)))
    return present


@dataclass(frozen=True)
class LateSilo:
    """A silo that is absent until `round`: it trains for the first time then and is
    clustered on arrival, without moving the silos already clustered."""

    # Index of the late silo (0 to silos - 1).
    silo: int
    # The round it first trains in (2 to train.rounds).
    round: int


@dataclass(frozen=True)
class FaultConfig:
    """Failure injection, to test that a failing or hostile silo cannot wreck the job. At the
    start of round `round`, silo `silo` raises (`raise`), exits without a word (`exit`) or
    stops answering (`hang`); or, from that round on, sends a hostile update: its model change
    sign-flipped and scaled with a huge sample count (`scaled_update`), finite but huge
    weights (`huge_weights`), the same update twice (`duplicate_update`), or an update's
    header whose payload never follows (`header_only`)."""

    # Index of the silo that fails (0 to silos - 1).
    silo: int
    # The round it fails in, or from which it sends hostile updates.
    round: int
    # What it does: one of the kinds described above.
    kind: Literal["raise", "exit", "hang", "scaled_update", "huge_weights", "duplicate_update", "header_only"] = "raise"


# How the MPI job runs: timeouts, checkpoints, silos per rank, devices, injected faults. Not part of the
# experiment: a resumed run may change it.
@dataclass(frozen=True)
class RuntimeConfig:
    # A peer that stays silent this long is treated as dead: the job fails cleanly. A silo
    # waits twice as long for the server, so that the server names a silent silo first.
    message_timeout_s: float = 1800.0
    # A header's payload follows it at once from an honest peer: one that has not arrived
    # this long after its header is a protocol error, not a slow peer.
    payload_timeout_s: float = 15.0
    # Longest sleep between two polls of a pending receive (back-off cap), so that a
    # waiting rank uses ~0 % CPU but still reacts within this delay.
    max_poll_sleep_ms: float = 20.0
    # Write the server's checkpoint (results folder, `checkpoint/`) after every round.
    checkpoint: bool = True
    # A failure to inject, for tests (runtime.fault); null: none.
    fault: FaultConfig | None = None
    # Silos hosted by each MPI rank after the server's (they share its device and torch):
    # the job then needs 1 + ceil(silos / silos_per_rank) ranks. null: one silo per rank,
    # or as many per rank as `mpirun -n` implies (blocks of consecutive silos).
    silos_per_rank: int | None = None
    # Where the silos compute: auto takes a GPU where torch sees one (silo ranks spread over a
    # node's GPUs by local rank), else the CPU; cpu never uses a GPU, even where one is present;
    # cuda stops the job before any work where a silo rank has none. The server never uses one.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # How a process's silos train: batched, as one computation (their parameters stacked, one
    # forward and backward a step over every silo's own mini-batch: torch.func's vmap), for
    # models without buffers or dropout (simple_cnn, mlp); one_by_one, one after another;
    # auto: batched where the silos compute on a GPU, where it is many times faster, one by
    # one on the CPU, where it is not (benchmarks/silo_batching.py). Each silo keeps its own
    # shuffle and update; batched weights equal one by one's up to float rounding, not bit
    # for bit (docs/SMALL_SILOS.md).
    silo_training: Literal["auto", "batched", "one_by_one"] = "auto"


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
    data: DataParams = field(default_factory=RotatedData)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # The federated method, chosen by strategy.name; its other keys depend on that choice.
    strategy: StrategyParams = field(default_factory=EmdCflConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
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
        return DataFacts(self.silos, self.seed, self.model.name in TORCHVISION_MODELS)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one model input a silo holds: (channels, height, width) or (features,)."""
        return self.data.sample_shape(self.model.name in TORCHVISION_MODELS)


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
    elif tp is StrategyParams:  # the registry's class for strategy.name
        return _strategy(value, where)
    elif tp is DataParams:  # the data sets' registry's class for data.name
        return _data_set(value, where)
    elif origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is not None and len(args) == 2 and type(None) in args:  # optional: the inner error is the useful one
            return _coerce(value, next(a for a in args if a is not type(None)), where)
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


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate(cfg: Config) -> None:
    """Value checks the types cannot express, each naming the field and the fix."""
    _check(cfg.silos >= 1, f"silos: must be at least 1, got {cfg.silos}")
    _check(0 <= cfg.seed < SEED_LIMIT, f"seed: must be an integer in [0, 2**64), got {cfg.seed}")
    for problem in cfg.data.problems(cfg.data_facts()):
        raise ConfigError(problem)
    _validate_model(cfg)
    for name in ("rounds", "local_epochs", "batch_size"):
        value = getattr(cfg.train, name)
        _check(value == "all" or value >= 1, f"train.{name}: must be at least 1, got {value}")
    _check(cfg.train.lr > 0, f"train.lr: must be positive, got {cfg.train.lr}")
    _check(0 <= cfg.train.momentum < 1, f"train.momentum: must lie in [0, 1), got {cfg.train.momentum}")
    _check(cfg.train.weight_decay >= 0, f"train.weight_decay: must be non-negative, got {cfg.train.weight_decay}")
    _validate_aggregation(cfg.aggregation)
    _validate_federation(cfg)
    facts = _facts(cfg)
    for problem in cfg.strategy.problems(facts):
        raise ConfigError(problem)
    _check(
        facts.known_clusters is not None or not REGISTRY[cfg.strategy.name].sees_truth,
        f"strategy.name: {cfg.strategy.name} trains the true clusters, and the data set knows none "
        "(give the manifest a group column, or choose another strategy)",
    )
    _check(cfg.runtime.message_timeout_s > 0, "runtime.message_timeout_s: must be positive")
    _check(cfg.runtime.payload_timeout_s > 0, "runtime.payload_timeout_s: must be positive")
    _check(
        cfg.runtime.silos_per_rank is None or 1 <= cfg.runtime.silos_per_rank <= cfg.silos,
        f"runtime.silos_per_rank: must lie between 1 and silos ({cfg.silos}) or be null, "
        f"got {cfg.runtime.silos_per_rank}",
    )
    _check(cfg.runtime.max_poll_sleep_ms > 0, "runtime.max_poll_sleep_ms: must be positive")
    _check(
        cfg.runtime.silo_training != "batched" or cfg.model.name in BATCHABLE_MODELS,
        f"runtime.silo_training: batched needs a model without buffers or dropout ({', '.join(BATCHABLE_MODELS)}); "
        f"{cfg.model.name} has them (set auto or one_by_one)",
    )


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


def _validate_aggregation(a: AggregationConfig) -> None:
    _check(0 <= a.trim < 0.5, f"aggregation.trim: must lie in [0, 0.5), got {a.trim}")
    _check(
        a.clip_norm is None or a.clip_norm > 0, f"aggregation.clip_norm: must be positive or null, got {a.clip_norm}"
    )
    _check(a.norm_ratio > 1, f"aggregation.norm_ratio: must be above 1 (the cluster median itself), got {a.norm_ratio}")
    _check(a.count_ratio >= 1, f"aggregation.count_ratio: must be at least 1, got {a.count_ratio}")


def _validate_federation(cfg: Config) -> None:
    """Participation, late silos and injected faults must fit the silos and rounds."""
    p = cfg.participation
    _check(p.fraction is None or p.count is None, "participation: give either fraction or count, not both (remove one)")
    _check(p.fraction is None or 0 < p.fraction <= 1, f"participation.fraction: must lie in (0, 1], got {p.fraction}")
    _check(
        p.count is None or 1 <= p.count <= cfg.silos,
        f"participation.count: must lie between 1 and silos ({cfg.silos}), got {p.count}",
    )
    seen: set[int] = set()
    for i, late in enumerate(cfg.late_silos):
        _check(
            0 <= late.silo < cfg.silos and late.silo not in seen,
            f"late_silos[{i}].silo: must be a distinct silo index in 0..{cfg.silos - 1}, got {late.silo}",
        )
        _check(
            2 <= late.round <= cfg.train.rounds,
            f"late_silos[{i}].round: must lie between 2 and train.rounds ({cfg.train.rounds}), got {late.round} "
            "(a silo present from the start needs no entry)",
        )
        seen.add(late.silo)
    _check(len(seen) < cfg.silos, "late_silos: at least one silo must be present in round 1 (remove one entry)")
    f = cfg.runtime.fault
    if f is not None:
        _check(0 <= f.silo < cfg.silos, f"runtime.fault.silo: must lie in 0..{cfg.silos - 1}, got {f.silo}")
        _check(
            1 <= f.round <= cfg.train.rounds,
            f"runtime.fault.round: must lie between 1 and train.rounds ({cfg.train.rounds}), got {f.round}",
        )


def _validate_model(cfg: Config) -> None:
    m = cfg.model
    _check(m.pretrained != "", "model.pretrained: give true, false or the path of a weights file")
    if m.own:
        _validate_own_model(m)
        return
    _check(
        m.name in BUILT_IN_MODELS,
        f"model.name: unknown model {m.name!r} (choose one of {', '.join(BUILT_IN_MODELS)}, "
        "or name your own as package.module:factory)",
    )
    if m.name in ("simple_cnn", "mlp"):  # built here, for the data's shape, with no published weights
        what = {"simple_cnn": "the simple CNN", "mlp": "the MLP"}[m.name]
        _check(
            m.name != "simple_cnn" or (len(m.channels) == 2 and all(c > 0 for c in m.channels)),
            f"model.channels: the simple CNN takes two positive widths, got {m.channels}",
        )
        _check(m.embedding_dim > 0, f"model.embedding_dim: must be positive, got {m.embedding_dim}")
        _check(
            m.pretrained is not True,
            f"model.pretrained: torchvision has no weights for {what} (use false or a weights file)",
        )
    else:
        native = TORCHVISION_MODELS[m.name]
        assert m.input_size is not None  # ModelConfig sets it for every torchvision model
        _check(
            m.embedding_dim == native,
            f"model.embedding_dim: {m.name}'s embedding has {native} dimensions, got {m.embedding_dim} "
            f"(remove the key or set it to {native})",
        )
        _check(m.input_size >= 32, f"model.input_size: {m.name} needs at least 32, got {m.input_size}")
        if m.name == "vit_b_16":
            _check(m.input_size % 16 == 0, f"model.input_size: vit_b_16 needs a multiple of 16, got {m.input_size}")
            _check(
                m.pretrained is False or m.input_size == IMAGENET_INPUT_SIZE,
                f"model.input_size: vit_b_16's weights are for {IMAGENET_INPUT_SIZE}x{IMAGENET_INPUT_SIZE} "
                f"inputs, got {m.input_size} (set it to {IMAGENET_INPUT_SIZE} or pretrained: false)",
            )
    if not cfg.data.per_silo_files or getattr(cfg.data, "input_shape", None) is not None:
        for problem in model_fit_problems(m, cfg.sample_shape):
            raise ConfigError(problem)


def _validate_own_model(m: ModelConfig) -> None:
    """What can be checked of the user's model without importing it (torch, on every rank): its
    module can be found; the factory itself is called and checked at the start of the job."""
    import importlib.util

    module, _, factory = m.name.partition(":")
    _check(
        bool(module) and factory.isidentifier(),
        f"model.name: {m.name!r} is not package.module:factory (e.g. my_models.signals:build)",
    )
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or cannot be imported
        found = False
    _check(found, f"model.name: module {module} not found (install it, or add its folder to PYTHONPATH)")
    _check(
        m.embedding_dim is not None and m.embedding_dim > 0,
        f"model.embedding_dim: give the size of {m.name}'s embedding (its output per example)",
    )
    _check(
        m.pretrained is not True, "model.pretrained: torchvision has no weights for your own model (false or a file)"
    )


def model_fit_problems(m: ModelConfig, shape: tuple[int, ...]) -> list[str]:
    """Why the model cannot take examples of `shape` (what the data set holds, or what the silos
    agreed on before the first round); empty when it can."""
    size = "x".join(map(str, shape))
    if m.own:  # checked by calling it at the start of the job (models.check_model)
        return []
    if m.name in ("simple_cnn", "mlp") and m.input_size is not None and m.input_size != shape[-1]:
        what = {"simple_cnn": "the simple CNN", "mlp": "the MLP"}[m.name]
        return [
            f"model.input_size: {what} is built for data.image_size ({shape[-1]}), "
            f"got {m.input_size} (set data.image_size instead)"
        ]
    if m.name == "mlp":
        return []
    if len(shape) != 3 or shape[1] != shape[2]:
        return [f"model.name: {m.name} takes square images (channels x size x size), the data's examples are {size}"]
    if m.name == "simple_cnn":
        return []
    return [] if shape[0] == 3 else [f"model.name: {m.name} takes 3-channel images, the data's examples are {size}"]


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
            f"{world_size} (start it with -n {cfg.silos + 1}, or run python -m cfl_mpi.simulate for one process)"
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


def check_resumable(cfg: Config, out: Path) -> None:
    """`--resume DIR` continues the same experiment: the config must match the one saved in
    DIR (NOT_THE_EXPERIMENT may differ); names the first differing field. Without a saved
    config.yaml the checkpoint's config digest decides (runtime/checkpoint.py)."""
    saved_path = out / "config.yaml"
    if not saved_path.is_file():
        return
    try:
        saved = read_yaml(saved_path.read_text()) or {}
    except yaml.YAMLError:
        raise ConfigError(
            f"--resume: {saved_path} is not valid YAML (the run's saved config was damaged; "
            f"start afresh with --out {out} --overwrite)"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(f"--resume: {saved_path} does not hold a config (start afresh with --out {out} --overwrite)")
    now = read_yaml(yaml.safe_dump(experiment_dict(cfg), sort_keys=False))
    for section in sorted(set(saved) | set(now)):
        if section in NOT_THE_EXPERIMENT:
            continue
        old, new = saved.get(section), now.get(section)
        if old != new:
            field_name = section
            if isinstance(old, dict) and isinstance(new, dict):
                field_name += "." + next(k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
            raise ConfigError(
                f"{field_name}: differs from the run being resumed in {out} "
                f"(resume with the config and --set options it was started with)"
            )
