"""A silo: trains on its own shard and takes part in its strategy's exchanges, as the server's
`Control` message for each round says (wire/round.py). It talks through its channel only, so the
same code runs one silo per MPI rank, several per rank, or all in the simulator."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

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
from .halves import message_kinds, silo_half
from .timeline import mark

if TYPE_CHECKING:
    import torch

    from ..training.local import SiloSet
    from .secure import SiloMasking

__all__ = ["run_silo", "shuffle_seed"]


def shuffle_seed(run_seed: int, silo: int, round: int) -> int:
    """The seed of a silo's mini-batch order in a round (its own stream: the same whichever
    silos train beside it, one by one or batched)."""
    return int(np.random.SeedSequence([run_seed, silo, round]).generate_state(1)[0])


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
    leaving = cfg.runtime.on_silo_failure == "drop"
    if leaving:  # the server may drop this silo, should a message of its break the protocol
        channel.notices[Dropped.KIND.name] = Notice(Dropped.expect(0), dropped)
    faults = SiloFaults(cfg.runtime.fault, silo)
    try:
        own = start_silo(cfg, silo, device, compute, faults)
    except Exception as err:  # noqa: BLE001 - its data or model failed: with drop, it leaves
        if not leaving:
            raise
        compute.withdraw(silo)
        leave_at_start(channel, err)
        return
    SiloRounds(cfg, channel, device, silo, compute, mates, faults, own).run()


class SiloStart(NamedTuple):
    """What a silo starts from: its data, its model and its training set on its device."""

    data: SiloData
    model: Any  # a SplitModel
    training_set: SiloSet


def start_silo(cfg: Config, silo: int, device: Any, compute: ComputePool, faults: SiloFaults) -> SiloStart:
    """Its data, model and training set. The weights come from the server (runtime.silo_models:
    shared, the received arrays themselves); torch runs on the compute workers only (compute.py)."""
    from ..models.build import build_model, skeleton_model
    from ..training.local import SiloSet

    faults.at_start_up()
    data = cfg.data.build(silo, cfg.data_facts())
    mark("data")
    arch = cfg.architecture
    shared = cfg.runtime.silo_models == "shared"
    model = compute(lambda: skeleton_model(arch) if shared else build_model(arch, load_weights=False).to(device))
    return SiloStart(data, model, compute(SiloSet, data.train_images, data.y_train, device))


class SiloRounds:
    """A started silo's rounds, as the server's `Control` says each round: wait, train (with its
    strategy's exchanges) and send its update, evaluate; until STOP, or until it leaves (drop)."""

    def __init__(
        self,
        cfg: Config,
        channel: Channel,
        device: Any,
        silo: int,
        compute: ComputePool,
        mates: set[int],
        faults: SiloFaults,
        own: SiloStart,
    ) -> None:
        from ..models.build import state_template
        from ..training.batched import batches_silos

        self.cfg, self.channel, self.device, self.silo = cfg, channel, device, silo
        self.compute, self.mates, self.faults = compute, mates, faults
        self.data, self.model, self.training_set = own
        self.leaving = cfg.runtime.on_silo_failure == "drop"
        self.together = batches_silos(cfg.runtime.silo_training, cfg.model.name, device)
        self.targets = cfg.data.backdoor_targets(cfg.silos)
        self.evaluation = SiloEvaluation(own.data, device, compute, silo, self.evaluating if self.together else None)
        mark("model")
        self.protocol = silo_half(cfg)
        mark("strategy")
        self.kinds = message_kinds(cfg)
        self.masking: SiloMasking | None = None
        if cfg.aggregation.secure:
            from .secure import SiloMasking  # cryptography's ciphers: only where rounds are secure

            self.masking = SiloMasking(cfg.aggregation, cfg.seed, cfg.silos, silo, cfg.privacy)
        self.template = state_template(own.model)
        self.reported: Counter[str] = Counter()  # the bytes sent by kind, as of the last report

    def run(self) -> None:
        channel = self.channel
        try:
            t = Hello.of(channel.recv(SERVER, Hello.expect(0))).next_round
            mark("hello")
            while True:
                control = Control.of(channel.recv(SERVER, Control.expect(t)))
                if control.action == STOP:
                    return
                try:
                    self.play(t, control)
                except (ChannelClosed, PeerTimeout, ProtocolError, Expelled):
                    raise  # the federation's trouble, not this silo's own
                except Exception as err:  # noqa: BLE001 - its own computation failed: with drop, it leaves
                    if not self.leaving:
                        raise
                    self.compute.withdraw(self.silo)
                    leave(channel, t, err)
                    return
                t += 1
        except Expelled:
            return  # the server named it and why; the rank's other silos go on

    def play(self, t: int, control: Control) -> None:
        """Round t as `control` says: train (with the strategy's exchanges) and evaluate."""
        from ..models.build import hold_arrays

        action, channel = control.action, self.channel
        if action == WAIT:
            return
        self.faults.at_round_start(t, channel)
        if control.model:
            self.compute(hold_arrays, self.model, self.received_model(t - 1), self.device)
        steps = self.take_part(t, control) if action == TRAIN else {}
        weights = self.received_model(t)  # held by the model as the evaluation's first step
        sent = np.array([channel.sent_bytes[k.name] - self.reported[k.name] for k in self.kinds], dtype=np.int64)
        self.reported.clear()
        self.reported.update(channel.sent_bytes)
        timings = np.array([steps.get(k, 0.0) for k in self.protocol.steps], dtype=np.float64)
        waited = (channel.waits.wall_s, channel.waits.cpu_s)
        channel.send(SERVER, self.evaluation.report(t, self.model, weights, sent, timings, *waited), t)

    def take_part(self, t: int, control: Control) -> dict[str, float]:
        """Round t's training, update and strategy exchanges; the seconds of the strategy's steps.
        A model that shares its weights then holds those it started from again: the trained
        ones go once they have left."""
        import torch

        from ..models.build import load_arrays, shares_weights, state_arrays
        from ..training.local import SiloSet

        cfg, model, silo, faults, compute = self.cfg, self.model, self.silo, self.faults, self.compute
        first = bool(control.first)
        if not first and self.data.lent is not None:  # clustered: the lent validation rows train
            self.data = self.data.clustered()
            self.training_set = compute(SiloSet, self.data.train_images, self.data.y_train, self.device)
        ctx = SiloRound(t, silo, self.channel, model, self.data, self.device, cfg.silos, first=first, compute=compute)
        self.protocol.before_training(ctx)
        start = model.state_dict() if shares_weights(model) else None  # the shared arrays it trains from
        clips = self.masking is not None and self.masking.keeps_start
        clip_from = {k: a.copy() for k, a in state_arrays(model).items()} if clips else None  # training moves them
        faults.before_training(t, lambda: state_arrays(model), lambda arrays: compute(load_arrays, model, arrays))
        self.train(t, torch.Generator().manual_seed(shuffle_seed(cfg.seed, silo, t)))
        trained, n_samples = faults.update(t, state_arrays(model), len(self.data.y_train))
        if self.leaving and diverged(trained):
            raise FloatingPointError(f"training diverged in round {t}: its weights hold NaN or inf (a NaN or inf loss)")
        if self.masking is None:
            faults.send_update(self.channel, t, self.protocol.encode_update(trained, t), n_samples)
            faults.after_update(t)
            self.protocol.after_training(ctx)
        else:  # the server sets up the masks once the round's clusters are known
            self.protocol.after_training(ctx)
            update = self.protocol.encode_update(trained, t)
            self.masking.send(self.channel, t, update, clip_from, n_samples, lambda: faults.after_shares(t))
        if start is not None:
            model.load_state_dict(start, assign=True)  # no computation: on the silo thread
        return ctx.step_seconds

    def train(self, t: int, generator: torch.Generator) -> None:
        """Local training: alone, or with the process's silos that train in round t, as one
        computation (`runtime.silo_training`, training/batched.py)."""
        from ..training.batched import LocalTraining, train_together
        from ..training.local import train_local

        cfg, device, tensors = self.cfg, self.device, self.training_set.tensors()
        if self.together:
            self.compute.together(
                ("local_training", t),
                lambda jobs: train_together(jobs, cfg.train, device),
                LocalTraining(self.model, *tensors, generator),
                self.silo,
                lambda: [c for c in participants(cfg, t) if c in self.mates],
            )
        else:
            self.compute(lambda: train_local(self.model, *tensors, cfg.train, generator, device))

    def evaluating(self, t: int, backdoor: bool) -> list[int]:
        """The process's silos that evaluate in round t (on their backdoor test set: targets only)."""
        return [c for c in present(self.cfg, t) if c in self.mates and (self.targets[c] or not backdoor)]

    def received_model(self, round: int) -> dict[str, np.ndarray]:
        msg = self.channel.recv(SERVER, StartModel.expect(round, like=self.template))
        return self.protocol.decode_model(StartModel.of(msg).weights, round)


def diverged(arrays: dict[str, np.ndarray]) -> bool:
    return not all(all_finite(a) for a in arrays.values() if np.issubdtype(a.dtype, np.floating))


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
