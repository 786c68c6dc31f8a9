"""Who does what in a round: presence (late silos), sampling (partial participation) and the
CONTROL message that tells each silo.

Every silo gets one small CONTROL message per round, so that the server alone decides the
course of the run: which silos train, which only evaluate the model of their cluster, which
are not there yet, and when to stop (end of the run, or SIGTERM). A silo waiting for its
first round therefore also hears from the server every round and never mistakes a long wait
for a dead peer.
"""
from __future__ import annotations

import numpy as np

from ..config import Config, participant_count
from ..wire.messages import Expect
from ..wire.kinds import CONTROL

TRAIN = "train"          # train, take part in the strategy's exchanges, evaluate
EVALUATE = "evaluate"    # present but not sampled: evaluate the cluster model only
WAIT = "wait"            # not arrived yet (late silo)
STOP = "stop"            # the run is over (or was stopped): exit cleanly
ACTIONS = (TRAIN, EVALUATE, WAIT, STOP)

# Meta of a CONTROL: the action, whether MODEL (round t-1) follows at once (the silo has no
# current model: first round of the run, first round after arriving or after a resume), and
# whether it is the silo's first training round (strategies that collect a one-off summary).
CONTROL_META = {"action": str, "model": int, "first": int}
# The first message of a run: the round the run continues with (1, or k + 1 after a resume).
HELLO_META = {"next_round": int}


def control_expect(round: int) -> Expect:
    return Expect(CONTROL, round, (), CONTROL_META, bounds={"model": (0, 1), "first": (0, 1)})


def hello_expect() -> Expect:
    return Expect(CONTROL, 0, (), HELLO_META, bounds={"next_round": (1, 1 << 31)})


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
