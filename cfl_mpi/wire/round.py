"""The messages of every round, whatever the strategy, each declared once (payload.py): the
server's control and models, a silo's weight update and evaluation. The runtime sends them;
a strategy that hands silos models of its own (IFCA) sends model messages too. A strategy's
own messages are declared by the strategy (`Halves.kinds`)."""

from __future__ import annotations

import math

import numpy as np

from .messages import Kind
from .payload import Payload, array, scalar, state

TRAIN = "train"  # train, take part in the strategy's exchanges, evaluate
EVALUATE = "evaluate"  # present but not sampled: evaluate the cluster model only
WAIT = "wait"  # not arrived yet (late silo)
STOP = "stop"  # the run is over (or was stopped): exit cleanly
ACTIONS = (TRAIN, EVALUATE, WAIT, STOP)
MAX_SAMPLES = 1 << 31  # no silo holds more examples than this: a larger count is a lie
MAX_WHY = 200  # characters of a reason (`Leave`, `Dropped`): a header's text holds up to 256
HUGE_LOSS = float(np.finfo(np.float64).max)  # a diverged model's loss, as the header takes it (no inf or NaN)


class Hello(Payload, kind="control"):
    """server → silo, first of a run (round 0): the round the run continues with (1, or k + 1
    after a resume)."""

    next_round: int = scalar(int, 1, 1 << 31)


class Control(Payload, kind=Hello.KIND):
    """server → silo, every round: what to do (`ACTIONS`), whether the model of the round
    before follows at once (the silo has none: its first round, or the first after arriving
    or after a resume), and whether it trains for the first time (strategies that collect a
    one-off summary)."""

    action: str = scalar(str)
    model: int = scalar(int, 0, 1)
    first: int = scalar(int, 0, 1)

    def problem(self) -> str | None:
        return None if self.action in ACTIONS else f"unknown action {self.action!r}"


class StartModel(Payload, kind="model"):
    """server → silo: the weights it trains from or evaluates, and its cluster (-1: none yet)."""

    weights: dict[str, np.ndarray] = state()
    cluster: int = scalar(int, -1, math.inf)


class Update(Payload, kind="update"):
    """silo → server: its trained weights and the number of examples they were trained on."""

    weights: dict[str, np.ndarray] = state()
    n_samples: int = scalar(int, 1, MAX_SAMPLES)


class Evaluation(Payload, kind="eval"):
    """silo → server, every round it is present: the accuracy and loss of the model it
    continues from on its test set, the bytes it sent of each kind the run counts (in
    `Halves.all_kinds` order), the wall seconds of its strategy's timed steps (`steps`) and
    how long it waited for messages, and the CPU it burnt doing so."""

    sent_bytes: np.ndarray = array("int64", "kinds")
    step_seconds: np.ndarray = array("float64", "steps")
    accuracy: float = scalar(float, 0.0, 1.0)
    loss: float = scalar(float, 0.0, math.inf)
    n_test: int = scalar(int, 1, MAX_SAMPLES)
    wait_wall_s: float = scalar(float, 0.0, math.inf)
    wait_cpu_s: float = scalar(float, 0.0, math.inf)

    def problem(self) -> str | None:
        if (self.step_seconds < 0).any() or (self.sent_bytes < 0).any():
            return f"step seconds {self.step_seconds.tolist()}, bytes {self.sent_bytes.tolist()} (at least 0)"
        return None


class BackdoorEvaluation(Evaluation, kind=Evaluation.KIND):
    """The evaluation of a target silo of a backdoor data set: with its accuracy on the
    backdoored test images."""

    backdoor_acc: float = scalar(float, 0.0, 1.0)


class Leave(Payload, kind="leave"):
    """silo → server, in place of the message the server awaits from it
    (`runtime.on_silo_failure: drop`): its own computation failed in this round, and why; it
    leaves the federation."""

    why: str = scalar(str)


class Dropped(Payload, kind="dropped"):
    """server → silo, in place of whatever the silo awaits from the server, and the server's
    last message to it (`runtime.on_silo_failure: drop`): a message of the silo's broke the
    protocol, so the server takes none of its messages any more; why. The silo stops; the
    other silos of its rank go on. Round 0: it may come in any round."""

    why: str = scalar(str)


ROUND_KINDS: tuple[Kind, ...] = (StartModel.KIND, Update.KIND, Evaluation.KIND, Hello.KIND)
