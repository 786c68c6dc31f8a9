"""Every strategy by name: the one registry that config parsing, the runtime, `compare`,
`reproduce` and the plots read. A new strategy is a package with its parameters and `SPEC`
in `__init__.py` and its halves in `halves.py`, plus one line here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import cfl, emdcfl, fedavg, fedwad, ifca, oracle, pacfl
from .spec import ConfigFacts, Cut, Pairwise, PairwiseView, StrategyConfig, StrategySpec

REGISTRY: dict[str, StrategySpec] = {
    spec.name: spec for spec in (emdcfl.SPEC, pacfl.SPEC, cfl.SPEC, ifca.SPEC, fedavg.SPEC, oracle.SPEC, fedwad.SPEC)
}


def label(name: str) -> str:
    """How tables, legends and titles name the strategy (its name when it is not registered)."""
    spec = REGISTRY.get(name)
    return spec.label if spec else name


def defaults() -> list[str]:
    """The strategies compare and reproduce run unless told otherwise, in registry order."""
    return [name for name, spec in REGISTRY.items() if spec.default]


def pairwise() -> dict[str, Pairwise]:
    """Every pairwise matrix a strategy may leave in its artifacts, by artifact name."""
    return {name: how for spec in REGISTRY.values() for name, how in spec.pairwise.items()}


def pairwise_view(name: str, artifacts: Mapping[str, Any], strategy: Any = None) -> PairwiseView:
    """Matrix `name` of a run's artifacts as the rule of the strategy that leaves it sees it,
    under the run's strategy settings (a params object or config.yaml's dict); as it is, with
    no cut, without settings or where the run's strategy is another."""
    owner = next(spec for spec in REGISTRY.values() if name in spec.pairwise)
    how = owner.pairwise[name]
    run_name = strategy.get("name") if isinstance(strategy, Mapping) else getattr(strategy, "name", None)
    if how.view is None or run_name != owner.name:
        return PairwiseView(None, None, how.label)
    return how.view(artifacts, strategy)


__all__ = [
    "REGISTRY",
    "ConfigFacts",
    "Cut",
    "Pairwise",
    "PairwiseView",
    "StrategyConfig",
    "StrategySpec",
    "defaults",
    "label",
    "pairwise",
    "pairwise_view",
]
