"""the Oracle: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in halves.py, beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..spec import StrategyConfig, StrategySpec


@dataclass(frozen=True)
class OracleConfig(StrategyConfig):
    """Oracle: the true clusters of the data partition, the upper bound every method aims at."""

    name: Literal["oracle"] = "oracle"


SPEC = StrategySpec(OracleConfig, "Oracle", f"{__name__}.halves", sees_truth=True)
