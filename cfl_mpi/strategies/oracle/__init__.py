"""the Oracle: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in halves.py, beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..spec import StrategyParams, StrategySpec

if TYPE_CHECKING:
    from ..base import Halves


@dataclass(frozen=True)
class OracleConfig(StrategyParams):
    """Oracle: the true clusters of the data partition, the upper bound every method aims at."""

    name: Literal["oracle"] = "oracle"


def halves() -> Halves:
    """Its server and silo halves (halves.py), imported when the runtime asks: they load torch."""
    from .halves import HALVES

    return HALVES


SPEC = StrategySpec(OracleConfig, "Oracle", halves, sees_truth=True)
