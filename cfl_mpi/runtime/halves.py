"""The halves of the config's strategy, built from its parameters and the run's facts: the
one place that turns a `Config` into what a strategy half may know (`RunFacts`)."""
from __future__ import annotations

import importlib
from typing import TypeVar

import numpy as np

from ..config import Config
from ..data import input_channels, num_classes
from ..strategies import REGISTRY
from ..strategies.base import Model, RunFacts, SiloProtocol, Strategy


def run_facts(cfg: Config) -> RunFacts:
    def initial_models(k: int) -> list[Model]:
        from ..models import seeded_states  # torch: only where a strategy asks for models

        return seeded_states(cfg, num_classes(cfg), cfg.seed, k)

    late = tuple(sorted(((x.silo, x.round) for x in cfg.late_silos), key=lambda x: (x[1], x[0])))
    return RunFacts(cfg.silos, cfg.seed, late, cfg.aggregation,
                    None if cfg.train.batch_size == "all" else cfg.train.batch_size, cfg.model.embedding_dim,
                    input_channels(cfg) * cfg.data.image_size ** 2, num_classes(cfg), initial_models)


def server_half(cfg: Config, truth: np.ndarray) -> Strategy:
    """The server half of the config's strategy, with the modules it needs in its rounds loaded."""
    return loaded(REGISTRY[cfg.strategy.name].halves().server(cfg.strategy, run_facts(cfg), truth))


def silo_half(cfg: Config) -> SiloProtocol:
    """The silo half of the config's strategy (one per silo), its modules loaded."""
    return loaded(REGISTRY[cfg.strategy.name].halves().silo(cfg.strategy, run_facts(cfg)))


H = TypeVar("H", Strategy, SiloProtocol)


def loaded(half: H) -> H:
    """`half`, once the modules it calls into during its rounds are imported: a party imports
    them as it starts, so that no round waits on an import (POT alone is seconds on a busy node)."""
    for name in half.modules():
        importlib.import_module(name)
    return half
