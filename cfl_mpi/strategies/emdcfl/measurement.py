"""How W's entries reach the server: the third of EMD-CFL's parts, beside the pair plan
(plans.py: which pairs) and the pair distance (distances.py: what a pair's entry is).

`Direct` (direct.py) is the paper's: each silo sends the server its projected clouds and the
server measures the distance. `FedWaD` (fedwad.py) keeps the clouds on the silos and the
server gets each W1 by FedWaD. Each has a silo half (`report`: what a silo does with its
projected clouds) and a server half (`measure`: fill W for a stage's pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ...channel import Pending
    from ..base import ServerRound, SiloRound
    from .messages import Projected


class SendReady:
    """Yielded among `Projected`s where the next one waits on a partner: what is ready goes."""


SEND_READY = SendReady()


@dataclass
class Reference:
    """A silo's side of the rows W[c][·] it serves: its sample embedded by its own model, its
    reference and its noise (the unit row c is cut in)."""

    z_own: np.ndarray  # Z_{c|c}
    z_val: np.ndarray  # Z^val_{c|c}
    tau: float | None  # τ_c, or None when it is taken per pair (`tau_projection: pair`)
    noise: float


@dataclass
class Record:
    """What the server has measured: W, τ (per silo, or per ordered pair: a C × C array), each
    silo's noise, the (noise[, τ]) each silo first stated this round, which its later
    messages of the round must repeat, and the rows of its clouds (its sample)."""

    W: np.ndarray
    tau: np.ndarray
    noise: np.ndarray
    stated: dict[int, tuple[float, ...]] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)  # each silo's sample size, where its clouds came
    unmatched: set[tuple[int, int]] = field(default_factory=set)  # directions with no class in common


class Measurement(Protocol):
    """The two halves of measuring a stage's pairs."""

    @property
    def silo_modules(self) -> tuple[str, ...]:
        """What its silo half solves with, loaded before round 1."""

    def report(
        self,
        ctx: SiloRound,
        projected: Iterator[Projected | SendReady],
        roles: dict[int, int],
        reference: Callable[[], Reference],
        left: set[int],
    ) -> list[Pending]:
        """Silo half: the stage's projected clouds (`projected`, for the partners of `roles`;
        none for those that `left`) on their way; the sends still in flight. `reference` gives
        the silo's τ and noise (computed once a round, when first asked)."""

    def measure(self, ctx: ServerRound, partners: dict[int, list[tuple[int, int]]], record: Record) -> None:
        """Server half: each silo's (partner, role) of the stage measured into `record`."""
