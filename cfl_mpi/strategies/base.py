"""The strategy interface: strategies decide *what* is computed and exchanged, a channel
decides *how* it travels (as Flower's Strategy, and pfl-research's algorithm and backend).

A strategy has a server half (`Strategy`) and, when it needs silos to do more than train,
a silo half (`SiloProtocol`). Each receives its own frozen parameters (the strategy's
`strategy:` section) and `RunFacts`, never the whole config. Both halves are called at the
same points of every round:
`before_training` at its start (e.g. IFCA hands out its K models) and `after_training`
right after the silos sent their weight updates; then the server half `aggregate`s the
updates into what every silo continues from. They talk only through `ctx.channel`, which
addresses silos by index and the server as `SERVER`: no rank, no MPI.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import numpy as np

from ..aggregation.rules import AggregationConfig, ClusterSums, Decision, DpNoise, LocalWork, cluster_averages
from ..channel import Alternative, Channel
from ..privacy.dp import PrivacyConfig
from ..wire.messages import Expect, Kind, Message
from ..wire.round import ROUND_KINDS
from .spec import StrategyConfig

if TYPE_CHECKING:  # torch-side types; the server half never needs them (nor, off secure rounds, masked sums)
    from ..aggregation.masked_sums import MaskedSums
    from ..data import SiloData
    from ..models.split_model import SplitModel

Model = dict[str, np.ndarray]
T = TypeVar("T")
P = TypeVar("P", bound=StrategyConfig)


@dataclass(frozen=True)
class RunFacts:
    """What a strategy half knows of the run besides its own parameters (runtime/halves.py
    builds it from the config; a half never sees the whole `Config`)."""

    silos: int
    seed: int
    late_joins: tuple[tuple[int, int], ...]  # (silo, round) of each late silo, in joining order
    aggregation: AggregationConfig  # the rule `Strategy.aggregate` applies inside a cluster
    # train.local_epochs, batch_size (None: all, full-batch steps) and momentum: what a sample
    # count claims
    local_work: LocalWork
    embedding_dim: int  # dim(Z), the embedding g's output
    input_dim: int  # values in one model input (channels × pixels)
    num_classes: int
    # clusters in the data partition: the number a strategy looks for where its config leaves
    # it unset (IFCA's k, FedWaD clustering's clusters; EMD-CFL's experiments give K this way)
    true_clusters: int | None  # None: the data set knows no groups (config.py then requires the number)
    # k models drawn one after another from the run's torch seed, the first θ(0) (torch: call
    # it only where a model is needed)
    initial_models: Callable[[int], list[Model]]
    # client-level differential privacy of the cluster models `Strategy.aggregate` makes
    privacy: PrivacyConfig = PrivacyConfig()

    def join_round(self, silo: int) -> int:
        """The first round `silo` takes part in (1 unless it is a late silo)."""
        return next((r for c, r in self.late_joins if c == silo), 1)

    def cluster_count(self, given: int | None) -> int:
        """`given`, else the number of true clusters (the config check requires one of them)."""
        count = given or self.true_clusters
        assert count is not None, "the config check requires a number of clusters where the data knows none"
        return count


@dataclass
class ServerRound:
    """What the server knows when a strategy is asked for the round's clusters."""

    round: int
    channel: Channel
    participants: list[int]  # silos training this round (partial participation)
    updates: dict[int, Model]  # silo index → trained weights (empty before training)
    n_samples: dict[int, int]
    # silo index → the weights it starts this round's training from: θ(0) in round 1, then
    # what `aggregate` gave it at the end of the last round. A strategy that hands a silo
    # another model in `before_training` records it here.
    start_models: dict[int, Model] = field(default_factory=dict)
    first: set[int] = field(default_factory=set)  # participants training for the first time
    # the sample count each silo reported first (kept by the server across rounds and resumes:
    # the screening's bound), and what `aggregate` decided about each update this round
    first_counts: dict[int, int] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    # Where the strategy's clusters are `settled` and the rule `streams`: the updates summed
    # as they arrived, in place of `updates` (which then stays empty)
    sums: ClusterSums | MaskedSums | None = None
    cores: int = 1  # cores the server's process may use for its own computations (e.g. W1 solves)
    step_seconds: dict[str, float] = field(default_factory=dict)  # the strategy's own breakdown, recorded
    facts: dict[str, Any] = field(
        default_factory=dict
    )  # JSON facts of the strategy's round, recorded (e.g. a pair plan)
    # With runtime.on_silo_failure: drop, a silo may send `Leave` in place of a message the
    # strategy awaits: its kind, and the runtime's take, which drops the silo (None: abort)
    leaving: Alternative | None = None


class AheadOfUpdate(NamedTuple):
    """What a strategy takes from each participant ahead of its update (`Strategy.ahead_of_update`):
    how it is read from a silo, and what takes it (which may raise a ProtocolError)."""

    expect: Callable[[int], Expect]
    take: Callable[[Message], None]


class InlineCompute:
    """`SiloRound.compute` of a silo that computes in its own thread (unit tests); the runtime's
    is a `runtime.compute.ComputePool`, with the same two calls."""

    def __call__(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        return fn(*args, **kwargs)

    def batched(self, key: Hashable, fn: Callable[[list[Any]], list[T]], item: object, limit: int) -> T:
        return fn([item])[0]


@dataclass
class SiloRound:
    """What a silo offers its half of a strategy: its model, data and a line to its peers."""

    round: int
    silo: int
    channel: Channel
    model: SplitModel
    data: SiloData
    device: Any
    silos: int  # silos in the run: peers are 0..silos-1
    first: bool = False  # this silo's first training round (e.g. PACFL's one-off signature)
    # `compute(fn, *args)` runs a torch computation (never a wait) and returns its result, and
    # `compute.batched(key, fn, item, limit)` one that silos queuing the same key share: on the
    # process's few compute workers (runtime/compute.py)
    compute: Any = field(default_factory=InlineCompute)
    # wall seconds of the protocol's `steps` this round, reported to the server with the evaluation
    step_seconds: dict[str, float] = field(default_factory=dict)


@contextmanager
def timed(seconds: dict[str, float], step: str) -> Iterator[None]:
    """Adds the wall time of the block to `seconds[step]` (the round's per-step breakdown)."""
    start = time.monotonic()
    try:
        yield
    finally:
        seconds[step] = seconds.get(step, 0.0) + time.monotonic() - start


class Strategy(ABC, Generic[P]):
    """Server half of a clustering algorithm: keeps the silo → cluster assignment."""

    #: extra arrays for the results folder (e.g. the distance matrix), filled as it learns
    artifacts: dict[str, np.ndarray]

    def __init__(self, params: P, run: RunFacts) -> None:
        self.params = params
        self.run = run
        self.artifacts = {}
        self.clusters = self.initial_clusters()

    @abstractmethod
    def initial_clusters(self) -> np.ndarray:
        """Assignment before any round (int64, length = silos)."""

    def before_training(self, ctx: ServerRound) -> None:
        """Start of a round, before the silos train (`ctx.updates` is still empty)."""
        return None

    def after_training(self, ctx: ServerRound) -> np.ndarray:
        """Update and return the assignment used to aggregate this round's updates."""
        return self.clusters

    def settled(self, ctx: ServerRound) -> bool:
        """Whether this round's updates are aggregated under `self.clusters` as it stands
        once `before_training` returned (or, for a silo, once its `ahead_of_update` message
        was taken) and nothing but `aggregate` reads them: the server may then sum each update
        as it arrives and hold none (`ServerRound.sums`). False keeps every update until
        `after_training`, which may cluster by them."""
        return False

    def ahead_of_update(self, ctx: ServerRound) -> AheadOfUpdate | None:
        """A message every participant sends after `before_training` and before its update,
        which the server takes in the same receive as the updates (`Channel.recv_in_turn`):
        a silo's update then need not wait in its rank for every other silo's message."""
        return None

    def aggregate(self, ctx: ServerRound) -> dict[int, Model]:
        """What every silo continues from: each cluster's updates screened and aggregated by
        the config's `aggregation` rule (weighted FedAvg by default, Alg. 1, line 21); a
        cluster without participants keeps its members' models."""
        if ctx.sums is not None:
            models, decisions = ctx.sums.averages(self.clusters, ctx.first_counts)
        else:
            models, decisions = cluster_averages(
                self.run.aggregation,
                ctx.round,
                self.clusters,
                ctx.updates,
                ctx.n_samples,
                ctx.start_models,
                ctx.first_counts,
                self.run.local_work,
                self._dp_noise(ctx) if self.run.privacy.on else None,
            )
        ctx.decisions += decisions
        return models

    def _dp_noise(self, ctx: ServerRound) -> Callable[[int], DpNoise]:
        """Cluster k's DP noise of the round: W its members drawn to train (`dp_fedavg`)."""
        drawn = self.clusters[ctx.participants]

        def noise(k: int) -> DpNoise:
            rng = self.run.privacy.noise_generator(self.run.seed, ctx.round, k)
            return DpNoise(self.run.privacy, int(np.sum(drawn == k)), rng)

        return noise

    def modules(self) -> tuple[str, ...]:
        """The modules this half calls into during its rounds beyond what every rank loads
        (scipy's solvers, POT, scikit-learn): the runtime imports them when the party starts
        (runtime/halves.py), so that no timed phase of a round waits on an import. A trimmed
        mean is the one aggregation rule that needs one."""
        return ("scipy.stats",) if self.run.aggregation.rule == "trimmed_mean" else ()

    def report(self) -> dict[str, Any]:
        """JSON-serialisable facts about how the clusters were found."""
        return {}

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Everything the strategy learnt, as arrays and JSON facts, for the checkpoint."""
        return {"clusters": self.clusters}, {}

    def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Continue from `state_dict()`'s output (resume)."""
        self.clusters = arrays["clusters"].astype(np.int64)


class SiloProtocol(Generic[P]):
    """Silo half of a strategy; the default does nothing beyond training."""

    # Timed steps of `after_training` (SiloRound.step_seconds), in the order the silo reports them.
    steps: tuple[str, ...] = ()

    def __init__(self, params: P, run: RunFacts) -> None:
        self.params = params
        self.run = run

    def modules(self) -> tuple[str, ...]:
        """As `Strategy.modules`: what this half calls into in its rounds, loaded at the start."""
        return ()

    def before_training(self, ctx: SiloRound) -> None:
        """Start of a round; may load another model into `ctx.model` to train from."""
        return None

    def after_training(self, ctx: SiloRound) -> None:
        return None

    def encode_update(self, arrays: dict[str, np.ndarray], round: int) -> dict[str, np.ndarray]:
        """The weights as sent to the server (CFL's optional transform P); same names and shapes."""
        return arrays

    def decode_model(self, arrays: dict[str, np.ndarray], round: int) -> dict[str, np.ndarray]:
        """A model received from the runtime (round 0: θ(0)), back in the silo's own space."""
        return arrays


@dataclass(frozen=True)
class Halves:
    """Both halves of a strategy and the message kinds it adds to a round (a strategy
    module's `HALVES`, which its `strategies.StrategySpec` points to)."""

    server: type[Strategy]
    silo: type[SiloProtocol] = SiloProtocol
    kinds: tuple[Kind, ...] = ()

    @property
    def all_kinds(self) -> tuple[Kind, ...]:
        """Every kind a run of this strategy sends, in the order metrics count them."""
        return ROUND_KINDS + self.kinds
