"""Who does what in a round: presence (late silos) and sampling (partial participation), which
the control message tells each silo (wire/round.py).

Every silo gets one small control message per round, so that the server alone decides the
course of the run: which silos train, which only evaluate the model of their cluster, which
are not there yet, and when to stop (end of the run, or SIGTERM). A silo waiting for its
first round therefore also hears from the server every round and never mistakes a long wait
for a dead peer.
"""

from __future__ import annotations

import numpy as np

from ..config import Config
from ..config.runtime import participant_count


def present(cfg: Config, round: int) -> list[int]:
    """Silos that have arrived by `round`."""
    return [c for c in range(cfg.silos) if cfg.join_round(c) <= round]


def participants(cfg: Config, round: int) -> list[int]:
    """The silos that train in `round`: every silo arriving now, plus a random sample of the
    others drawn from (seed, round) alone, so a resumed run draws the same silos."""
    here = present(cfg, round)
    arriving = [c for c in here if cfg.join_round(c) == round > 1]
    others = [c for c in here if c not in arriving]
    wanted = participant_count(cfg.participation, len(here))
    rng = np.random.default_rng([cfg.seed, 5, round])
    more = rng.choice(others, size=min(max(wanted - len(arriving), 0), len(others)), replace=False)
    return sorted(arriving + [int(c) for c in more])
