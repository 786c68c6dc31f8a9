"""The message kinds of every round, whatever the strategy (model broadcast, weight update,
evaluation, control): the runtime sends them, and a strategy that hands silos models of its
own (IFCA) sends `MODEL` too; a strategy's own kinds are declared in its halves
(`Halves.kinds`)."""
from __future__ import annotations

from .messages import Kind, message_kind

CONTROL = message_kind("control")  # server → silo: what to do in a round (train, evaluate, wait, stop)
MODEL = message_kind("model")      # server → silo: model weights to train from / evaluate
UPDATE = message_kind("update")    # silo → server: trained weights + sample count
EVAL = message_kind("eval")        # silo → server: test accuracy of the received model, bytes sent
ROUND_KINDS: tuple[Kind, ...] = (MODEL, UPDATE, EVAL, CONTROL)
