"""FedAvg: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in halves.py, beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..spec import StrategyConfig, StrategySpec


@dataclass(frozen=True)
class FedAvgConfig(StrategyConfig):
    """FedAvg (McMahan et al. 2017): every silo in one cluster, the baseline without clustering."""

    name: Literal["fedavg"] = "fedavg"


SPEC = StrategySpec(FedAvgConfig, "FedAvg", f"{__name__}.halves", clusters=False)
