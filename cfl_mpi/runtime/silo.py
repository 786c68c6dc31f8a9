"""A silo: trains on its own shard and takes part in its strategy's exchanges, as the server's
`Control` message for each round says (wire/round.py). It talks through its channel only, so the
same code runs one silo per MPI rank, several per rank, or all in the simulator."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..channel import SERVER, Channel, ChannelClosed, Notice, PeerTimeout
from ..config import Config
from ..data import SiloData
from ..strategies.base import SiloRound
from ..wire.messages import Message, ProtocolError, all_finite
from ..wire.round import (
    HUGE_LOSS,
    MAX_WHY,
    STOP,
    TRAIN,
    WAIT,
    BackdoorEvaluation,
    Control,
    Dropped,
    Evaluation,
    Hello,
    Leave,
    StartModel,
)
from .compute import ComputePool
from .control import participants, present
from .faults import SiloFaults
from .halves import halves, silo_half
from .timeline import mark

if TYPE_CHECKING:
    from ..training.local import SiloSet

__all__ = ["run_silo"]


def run_silo(
    cfg: Config, channel: Channel, device: Any, silo: int, compute: ComputePool, mates: Sequence[int] = ()
) -> None:
    """The silo's rounds until the server says stop; it computes on `compute` (compute.py),
    where `runtime.silo_training: batched` trains and evaluates it with its `mates` (the
    process's silos) that do so in the round. With `runtime.on_silo_failure: drop` a failure
    of its own (an exception of its data, training or evaluation, or weights that diverged)
    makes it `leave` instead of raising."""
    try:
        _run_silo(cfg, channel, device, silo, compute, set(mates) | {silo})
    finally:
        compute.withdraw(silo)  # its mates no longer wait for it to compute with them


def _run_silo(cfg: Config, channel: Channel, device: Any, silo: int, compute: ComputePool, mates: set[int]) -> None:
    import torch

    from ..models.build import (
        build_model,
        hold_arrays,
        load_arrays,
        shares_weights,
        skeleton_model,
        state_arrays,
        state_template,
    )
    from ..training.batched import LocalTraining, batches_silos, train_together
    from ..training.local import SiloSet, train_local

    leaving = cfg.runtime.on_silo_failure == "drop"
    if leaving:  # the server may drop this silo, should a message of its break the protocol
        channel.notices[Dropped.KIND.name] = Notice(Dropped.expect(0), dropped)
    faults = SiloFaults(cfg.runtime.fault, silo)

    try:
        faults.at_start_up()
        data = cfg.data.build(silo, cfg.data_facts())
        mark("data")
        # weights come from the server (runtime.silo_models: shared, the received arrays
        # themselves); torch runs on the compute workers only (compute.py)
        arch = cfg.architecture
        shared = cfg.runtime.silo_models == "shared"
        model = compute(lambda: skeleton_model(arch) if shared else build_model(arch, load_weights=False).to(device))
        training_set = compute(SiloSet, data.train_images, data.y_train, device)
    except Exception as err:  # noqa: BLE001 - its data or model failed: with drop, it leaves
        if not leaving:
            raise
        compute.withdraw(silo)
        leave_at_start(channel, err)
        return
    together = batches_silos(cfg.runtime.silo_training, cfg.model.name, device)
    targets = cfg.data.backdoor_targets(cfg.silos)

    def evaluating(t: int, backdoor: bool) -> list[int]:
        """The process's silos that evaluate in round t (on their backdoor test set: targets only)."""
        return [c for c in present(cfg, t) if c in mates and (targets[c] or not backdoor)]

    evaluation = SiloEvaluation(data, device, compute, silo, evaluating if together else None)
    mark("model")
    protocol = silo_half(cfg)
    mark("strategy")
    kinds = halves(cfg).all_kinds
    template = state_template(model)

    def train(t: int, generator: torch.Generator) -> None:
        """Local training: alone, or with the process's silos that train in round t, as one
        computation (`runtime.silo_training`, training/batched.py)."""
        if together:
            compute.together(
                ("local_training", t),
                lambda jobs: train_together(jobs, cfg.train, device),
                LocalTraining(model, *training_set.tensors(), generator),
                silo,
                lambda: [c for c in participants(cfg, t) if c in mates],
            )
        else:
            compute(lambda: train_local(model, *training_set.tensors(), cfg.train, generator, device))

    def received_model(round: int) -> dict[str, np.ndarray]:
        weights = StartModel.of(channel.recv(SERVER, StartModel.expect(round, like=template))).weights
        return protocol.decode_model(weights, round)

    def diverged(arrays: dict[str, np.ndarray]) -> bool:
        return not all(all_finite(a) for a in arrays.values() if np.issubdtype(a.dtype, np.floating))

    def take_part(t: int, control: Control) -> dict[str, float]:
        """Round t's training, update and strategy exchanges; the seconds of the strategy's steps.
        A model that shares its weights then holds those it started from again: the trained
        ones go once they have left."""
        ctx = SiloRound(t, silo, channel, model, data, device, cfg.silos, first=bool(control.first), compute=compute)
        protocol.before_training(ctx)
        start = model.state_dict() if shares_weights(model) else None  # the shared arrays it trains from
        seed = int(np.random.SeedSequence([cfg.seed, silo, t]).generate_state(1)[0])
        faults.before_training(t, lambda: state_arrays(model), lambda arrays: compute(load_arrays, model, arrays))
        train(t, torch.Generator().manual_seed(seed))
        trained, n_samples = faults.update(t, state_arrays(model), len(data.y_train))
        if leaving and diverged(trained):
            raise FloatingPointError(f"training diverged in round {t}: its weights hold NaN or inf (a NaN or inf loss)")
        faults.send_update(channel, t, protocol.encode_update(trained, t), n_samples)
        faults.after_update(t)
        protocol.after_training(ctx)
        if start is not None:
            model.load_state_dict(start, assign=True)  # no computation: on the silo thread
        return ctx.step_seconds

    reported: Counter[str] = Counter()

    def play(t: int, control: Control) -> None:
        """Round t as `control` says: train (with the strategy's exchanges) and evaluate."""
        action = control.action
        if action == WAIT:
            return
        faults.at_round_start(t, channel)
        if control.model:
            compute(hold_arrays, model, received_model(t - 1), device)
        steps = take_part(t, control) if action == TRAIN else {}
        weights = received_model(t)  # held by the model as the evaluation's first step
        sent = np.array([channel.sent_bytes[k.name] - reported[k.name] for k in kinds], dtype=np.int64)
        reported.clear()
        reported.update(channel.sent_bytes)
        timings = np.array([steps.get(k, 0.0) for k in protocol.steps], dtype=np.float64)
        waited = (channel.waits.wall_s, channel.waits.cpu_s)
        channel.send(SERVER, evaluation.report(t, model, weights, sent, timings, *waited), t)

    try:
        t = Hello.of(channel.recv(SERVER, Hello.expect(0))).next_round
        mark("hello")
        while True:
            control = Control.of(channel.recv(SERVER, Control.expect(t)))
            if control.action == STOP:
                return
            try:
                play(t, control)
            except (ChannelClosed, PeerTimeout, ProtocolError, Expelled):
                raise  # the federation's trouble, not this silo's own
            except Exception as err:  # noqa: BLE001 - its own computation failed: with drop, it leaves
                if not leaving:
                    raise
                compute.withdraw(silo)
                leave(channel, t, err)
                return
            t += 1
    except Expelled:
        return  # the server named it and why; the rank's other silos go on


class Expelled(Exception):
    """The server dropped this silo (`Dropped`): it stops."""


def dropped(msg: Message) -> NoReturn:
    raise Expelled(Dropped.of(msg).why)


def leave_at_start(channel: Channel, err: Exception) -> None:
    """A silo that could not start (its data unreadable, say) leaves in the first round the
    server asks anything of it."""
    t = Hello.of(channel.recv(SERVER, Hello.expect(0))).next_round
    while (action := Control.of(channel.recv(SERVER, Control.expect(t))).action) == WAIT:
        t += 1
    if action == STOP:
        return
    leave(channel, t, err)


def leave(channel: Channel, round: int, err: Exception) -> None:
    """Tell the server why this silo leaves the federation (`Leave`, in place of what the
    server awaits from it), then take what was already on its way to it and the server's
    control each round (it now waits), until STOP."""
    channel.send(SERVER, Leave(f"{type(err).__name__}: {err}"[:MAX_WHY]), round)
    while True:
        kind, t = channel.next_kind(SERVER)
        if kind != Control.KIND.name:
            channel.take_as_declared(SERVER)
        elif Control.of(channel.recv(SERVER, Control.expect(t))).action == STOP:
            return


class SiloEvaluation:
    """What a silo reports of the model it continues from: accuracy and loss on its test set,
    and, for a backdoor data set's target silos, the accuracy on the backdoored test images;
    alone, or as one computation with the process's silos that evaluate in the round
    (`together(round, backdoor)`, training/batched.py)."""

    def __init__(
        self,
        data: SiloData,
        device: Any,
        compute: ComputePool,
        silo: int = 0,
        together: Callable[[int, bool], list[int]] | None = None,
    ) -> None:
        from ..training.local import SiloSet

        self.compute, self.device, self.n_test = compute, device, len(data.y_test)
        self.silo, self.together = silo, together
        self.test = compute(SiloSet, data.test_images, data.y_test, device)
        self.backdoor = None
        if data.backdoor_images is not None and data.y_backdoor is not None:
            self.backdoor = compute(SiloSet, data.backdoor_images, data.y_backdoor, device)

    def report(
        self,
        round: int,
        model: Any,
        weights: dict[str, np.ndarray],
        sent: np.ndarray,
        timings: np.ndarray,
        wait_wall_s: float,
        wait_cpu_s: float,
    ) -> Evaluation:
        """The round's `Evaluation` of `model` once `weights` are loaded into it (in the same
        computation), with the bytes sent, the timed steps and the waits."""
        accuracy, loss = self._evaluate(round, model, self.test, weights=weights)
        loss = loss if math.isfinite(loss) else HUGE_LOSS  # a diverged model is reported, not a crash
        known = (sent, timings, accuracy, loss, self.n_test, wait_wall_s, wait_cpu_s)
        if self.backdoor is None:
            return Evaluation(*known)
        return BackdoorEvaluation(*known, backdoor_acc=self._evaluate(round, model, self.backdoor, backdoor=True)[0])

    def _evaluate(
        self,
        round: int,
        model: Any,
        labelled: SiloSet,
        backdoor: bool = False,
        weights: dict[str, np.ndarray] | None = None,
    ) -> tuple[float, float]:
        from ..training.batched import Evaluation as EvaluationJob
        from ..training.batched import evaluate_each, evaluate_together

        job = EvaluationJob(model, *labelled.tensors(), weights)
        key = ("evaluation", round, backdoor)
        if (mates := self.together) is not None:
            return self.compute.together(
                key, lambda jobs: evaluate_together(jobs, self.device), job, self.silo, lambda: mates(round, backdoor)
            )
        result = self.compute.batched(key, lambda jobs: evaluate_each(jobs, self.device), job, EVALUATION_BATCH)
        if isinstance(result, Exception):
            raise result
        return result


# Silos whose evaluations one call computes at most, one after another (a worker takes a batch
# up as soon as it is free: the limit only bounds one call's length).
EVALUATION_BATCH = 4096
