"""`runtime.fault`: a silo that fails or turns hostile on purpose, so that tests can show a
failing or hostile silo cannot wreck the job. The silo loop asks this seam at four points
(the round's start, the trained update, the update's send, after it); for every silo that is not the
configured one each answer is the honest one."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..channel import SERVER, Channel
from ..config.runtime import HOSTILE_UPDATES, FaultConfig
from ..wire.round import Update

__all__ = ["HOSTILE_UPDATES", "LATER_IN_THE_ROUND", "InjectedExit", "InjectedFault", "SiloFaults"]

LASTING = (*HOSTILE_UPDATES, "slow")  # kinds played from their round on, not in it alone
LATER_IN_THE_ROUND = ("raise_after_update", "raise_after_shares")  # failures after training
SCALE = 10.0  # `scaled_update`: -SCALE times the honest change ...
CLAIMED_SAMPLES = 1 << 30  # ... claimed on a billion examples, to outweigh every honest member
HUGE = 1e30  # `huge_weights`: finite in float32, ruinous in any average


class InjectedFault(RuntimeError):
    """The failure `runtime.fault` asked for."""


class InjectedExit(BaseException):
    """`runtime.fault` kind `exit`: the silo dies without a word. Its host ends the process
    (MPI), or the simulator reports the silo gone; nobody may catch it on the way."""


class SiloFaults:
    """What `fault` makes silo `silo` do; nothing unless it names this silo."""

    def __init__(self, fault: FaultConfig | None, silo: int) -> None:
        self.fault = fault if fault is not None and fault.silo == silo else None
        self.silo = silo
        self._start: dict[str, np.ndarray] = {}

    def kind(self, round: int) -> str | None:
        """The kind this silo plays in `round`: a failure in its round only, a hostile update or
        a straggler's delay in that round and every later one."""
        f = self.fault
        if f is None:
            return None
        return f.kind if f.round == round or (f.kind in LASTING and f.round < round) else None

    def at_start_up(self) -> None:
        """`unreadable_data`: raise where the silo reads its data, as a file gone or damaged would."""
        if self.fault is not None and self.fault.kind == "unreadable_data":
            raise OSError(f"silo {self.silo} cannot read its data (runtime.fault)")

    def at_round_start(self, round: int, channel: Channel) -> None:
        """Raise, exit without a word, hang (alive but silent: the peers' timeout must catch it),
        or start late."""
        kind = self.kind(round)
        if kind is None or kind in HOSTILE_UPDATES or kind in ("nan_loss", "unreadable_data", *LATER_IN_THE_ROUND):
            return
        if kind == "out_of_memory":
            import torch

            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory: silo {self.silo} in round {round} tried to allocate 2.00 GiB (runtime.fault)"
            )
        if kind == "exit":
            raise InjectedExit(f"silo {self.silo} exits without a word in round {round} (runtime.fault)")
        if kind == "slow":
            time.sleep(self.fault.delay_s)  # type: ignore[union-attr]  # kind() is None without a fault
            return
        if kind == "hang":
            while not channel.closed():
                time.sleep(0.5)
            return
        raise InjectedFault(f"silo {self.silo} fails in round {round} (runtime.fault)")

    def before_training(
        self,
        round: int,
        arrays: Callable[[], dict[str, np.ndarray]],
        load: Callable[[dict[str, np.ndarray]], None],
    ) -> None:
        """Keep the model training starts from (`arrays()`, read only here: a GPU model would be
        copied to the host), which `scaled_update` reverses the change from; for `nan_loss`,
        `load` NaN weights into it, so that every loss of the round is NaN."""
        kind = self.kind(round)
        self._start = {k: v.copy() for k, v in arrays().items()} if kind == "scaled_update" else {}
        if kind == "nan_loss":
            load(
                {k: np.full_like(v, np.nan) if np.issubdtype(v.dtype, np.floating) else v for k, v in arrays().items()}
            )

    def after_update(self, round: int) -> None:
        """`raise_after_update`: raise once the update has left, before the strategy's exchanges."""
        if self.kind(round) == "raise_after_update":
            raise InjectedFault(f"silo {self.silo} fails after its update of round {round} (runtime.fault)")

    def after_shares(self, round: int) -> None:
        """`raise_after_shares`: raise once the key shares of a secure round are dealt."""
        if self.kind(round) == "raise_after_shares":
            raise InjectedFault(f"silo {self.silo} fails after dealing its key shares of round {round} (runtime.fault)")

    def update(self, round: int, arrays: dict[str, np.ndarray], n_samples: int) -> tuple[dict[str, np.ndarray], int]:
        """The trained model and sample count, or what a hostile silo claims instead."""
        kind = self.kind(round)
        floating = [k for k, v in arrays.items() if np.issubdtype(v.dtype, np.floating)]
        if kind == "scaled_update":  # θ' = s − SCALE·(θ − s): the honest change reversed and magnified
            start = self._start
            return {
                **arrays,
                **{k: (start[k] - SCALE * (arrays[k] - start[k])).astype(arrays[k].dtype) for k in floating},
            }, CLAIMED_SAMPLES
        if kind == "huge_weights":
            return {**arrays, **{k: np.full_like(arrays[k], HUGE) for k in floating}}, n_samples
        return arrays, n_samples

    def send_update(self, channel: Channel, round: int, arrays: dict[str, np.ndarray], n_samples: int) -> None:
        """Send the update to the server; a hostile silo withholds its payload or sends it twice."""
        kind = self.kind(round)
        if kind == "header_only":
            channel.send_header_only(SERVER, Update.KIND, round, arrays, n_samples=n_samples)
            return
        channel.send(SERVER, Update(arrays, n_samples), round)
        if kind == "duplicate_update":
            channel.send(SERVER, Update(arrays, n_samples), round)
