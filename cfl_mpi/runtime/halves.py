"""The halves of the config's strategy, built from its parameters and the run's facts: the
one place that turns a `Config` into what a strategy half may know (`RunFacts`)."""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import TypeVar

import numpy as np

from ..config import Config
from ..strategies import REGISTRY
from ..strategies.base import Halves, Model, RunFacts, SiloProtocol, Strategy
from ..wire.messages import Kind


def run_facts(cfg: Config) -> RunFacts:
    def initial_models(k: int) -> list[Model]:
        from ..models.build import seeded_states  # torch: only where a strategy asks for models

        return seeded_states(cfg.architecture, cfg.seed, k)

    truth = cfg.data.true_clusters(cfg.silos)
    late = tuple(sorted(((x.silo, x.round) for x in cfg.late_silos), key=lambda x: (x[1], x[0])))
    return RunFacts(
        cfg.silos,
        cfg.seed,
        late,
        cfg.aggregation,
        dataclasses.replace(cfg.train.work(), growth=cfg.data.lent_rows(cfg.data_facts())),
        cfg.model.embedding_dim,
        math.prod(cfg.sample_shape),
        cfg.data.num_classes(),
        None if truth is None else len(np.unique(truth)),
        initial_models,
        cfg.privacy,
    )


def halves(cfg: Config) -> Halves:
    """The halves of the config's strategy and the message kinds they add (its `HALVES`)."""
    module = REGISTRY[cfg.strategy.name].halves
    found = importlib.import_module(module).HALVES
    assert isinstance(found, Halves), f"{module}.HALVES is not a Halves"
    return found


def message_kinds(cfg: Config) -> tuple[Kind, ...]:
    """Every kind a run of the config sends, in the order metrics count them: the strategy's,
    and secure aggregation's where it is on (declared in a module only such runs import)."""
    if not cfg.aggregation.secure:
        return halves(cfg).all_kinds
    from ..wire.secure import SECURE_KINDS

    return halves(cfg).all_kinds + SECURE_KINDS


def server_half(cfg: Config) -> Strategy:
    """The server half of the config's strategy, with the modules it needs in its rounds loaded;
    the true clusters are passed to a strategy whose spec says it sees them (the Oracle) only."""
    truth = {"truth": cfg.data.true_clusters(cfg.silos)} if REGISTRY[cfg.strategy.name].sees_truth else {}
    return loaded(halves(cfg).server(cfg.strategy, run_facts(cfg), **truth))


def silo_half(cfg: Config) -> SiloProtocol:
    """The silo half of the config's strategy (one per silo), its modules loaded."""
    return loaded(halves(cfg).silo(cfg.strategy, run_facts(cfg)))


H = TypeVar("H", Strategy, SiloProtocol)
# What any half may call into in its rounds that numpy loads only on first use: the seeded
# draws (np.random.default_rng) of the strategies.
EVERY_PARTY = ("numpy.random",)


def loaded(half: H) -> H:
    """`half`, once the modules it calls into during its rounds are imported: a party imports
    them as it starts, so that no round waits on an import (POT alone is seconds on a busy node)."""
    for name in (*EVERY_PARTY, *half.modules()):
        importlib.import_module(name)
    return half
