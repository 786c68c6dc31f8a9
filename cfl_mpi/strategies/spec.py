"""What the rest of cfl_mpi knows about a strategy: one `StrategySpec` per name.

Config parsing, `compare`, `reproduce`, the plots and the runtime all read the spec; none
keeps a list of strategies of its own. The spec is light (dataclasses, no numpy): its
halves are imported only by the job that runs them, so parsing a config or tabulating a
comparison never loads torch or a strategy's halves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# torch.manual_seed takes seeds below 2**64 (numpy's SeedSequence any non-negative integer).
SEED_LIMIT = 2**64


class Cut(NamedTuple):
    """Where a strategy's rule cuts its pairwise matrix: below `value`, silos may share a cluster."""

    value: float
    label: str  # its tick label on the colour bar, e.g. "cut 3.5" or "cut β = 600°"


class PairwiseView(NamedTuple):
    """A pairwise matrix in the units its rule cuts, for one run's settings."""

    noise: Any  # per-row divisors (a numpy array) or None
    cut: Cut | None
    label: str  # what the colours are, in words, with the run's cut


# (the run's artifacts by name, its strategy settings: a params object or config.yaml's dict)
ViewOf = Callable[[Mapping[str, Any], Any], PairwiseView]


class Pairwise(NamedTuple):
    """How to show a pairwise matrix a strategy leaves in its artifacts."""

    label: str  # colour-bar label
    similarity: bool = False  # higher is closer
    directed: bool = False  # row = whose model, column = whose data (EMD-CFL's W)
    view: ViewOf | None = None  # in its rule's units with the run's cut; None: as it is, no cut


def setting(strategy: Any, params: type[StrategyConfig], key: str) -> Any:
    """A strategy setting from its params object or from config.yaml's dict (the params'
    default where the dict lacks it)."""
    if isinstance(strategy, Mapping):
        return strategy.get(key, getattr(params, key))
    return getattr(strategy, key)


class ConfigFacts(NamedTuple):
    """The facts of a config a strategy's parameters are checked against (`problems`)."""

    silos: int
    embedding_dim: int
    first_round: int  # silos training in round 1 (late silos and sampling left out)
    all_from_start: bool  # every silo trains in every round from round 1
    # clusters in the data's known grouping, or None where the data set knows none (a
    # strategy that takes its number of clusters from it must then be given one)
    known_clusters: int | None = None


class StrategyConfig:
    """Base of a strategy's frozen parameters (its `strategy:` section of the config)."""

    name: str

    def problems(self, facts: ConfigFacts) -> Iterator[str]:
        """One config-error line per value the types cannot rule out (`strategy.<key>: …`)."""
        return iter(())


@dataclass(frozen=True)
class StrategySpec:
    """One strategy: its parameters, its halves, and how tables and plots show it."""

    params: type[StrategyConfig]  # a frozen dataclass; its `name` default is the registry key
    label: str  # in tables, legends and titles, e.g. "EMD-CFL"
    # The module whose `HALVES` are its server and silo halves and the message kinds they add
    # (its package's halves.py: f"{__name__}.halves"), imported by the runtime only: they load
    # torch, which parsing a config or tabulating a comparison never needs.
    halves: str
    clusters: bool = True  # False: it keeps every silo in one model, its ARI is shown as "-"
    default: bool = True  # run by compare and reproduce unless --methods names others
    pairwise: Mapping[str, Pairwise] = field(default_factory=dict)  # artifacts it leaves, by name
    # Whether its server half is told the true clusters: the Oracle's, no other.
    sees_truth: bool = False
    # Whether it aggregates its own models (IFCA's k), not through `Strategy.aggregate`'s rule.
    own_aggregation: bool = False
    # Whether its server reads each silo's update besides aggregating it (CFL's cosine
    # similarities): secure aggregation, which shows the server only sums, cannot run it.
    reads_updates: bool = False
    # Whether its silos read their validation sets (EMD-CFL's τ and noise): `data.val_fraction:
    # auto` then holds out what they need on small sites, else the usual 10 %.
    validation: bool = False

    @property
    def name(self) -> str:
        return self.params.name
