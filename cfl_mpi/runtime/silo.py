"""A silo: trains on its own shard and takes part in its strategy's exchanges, as the server's
CONTROL message for each round says (control.py). It talks through its channel only, so the
same code runs one silo per MPI rank, several per rank, or all in the simulator."""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

from ..algorithms import REGISTRY
from ..algorithms.base import EVAL, MODEL, UPDATE, SiloRound
from ..channel import SERVER, Channel
from ..config import Config
from ..data import build_silo_data, num_classes
from ..wire.messages import Expect, ProtocolError
from .compute import ComputePool
from .control import ACTIONS, STOP, TRAIN, WAIT, control_expect, hello_expect

__all__ = ["InjectedExit", "InjectedFault", "run_silo"]


class InjectedFault(RuntimeError):
    """The failure `runtime.fault` asked for."""


class InjectedExit(BaseException):
    """`runtime.fault` kind `exit`: the silo dies without a word. Its host ends the process
    (MPI), or the simulator reports the silo gone; nobody may catch it on the way."""


HOSTILE_UPDATES = ("scaled_update", "huge_weights", "duplicate_update", "header_only")
SCALE = 10.0  # `scaled_update`: -SCALE times the honest change ...
CLAIMED_SAMPLES = 1 << 30  # ... claimed on a billion examples, to outweigh every honest member
HUGE = 1e30  # `huge_weights`: finite in float32, ruinous in any average


def fault_of(cfg: Config, silo: int, round: int) -> str | None:
    """The `runtime.fault` kind that silo `silo` plays in round `round`, if any: a failure in
    its round only, a hostile update in that round and every later one (it stays hostile)."""
    f = cfg.runtime.fault
    if f is None or f.silo != silo:
        return None
    return f.kind if f.round == round or (f.kind in HOSTILE_UPDATES and f.round < round) else None


def inject_fault(cfg: Config, silo: int, round: int, channel: Channel) -> None:
    kind = fault_of(cfg, silo, round)
    if kind is None or kind in HOSTILE_UPDATES:
        return
    if kind == "exit":
        raise InjectedExit(f"silo {silo} exits without a word in round {round} (runtime.fault)")
    if kind == "hang":
        while not channel.closed():  # alive but silent: the peers' message timeout must catch it
            time.sleep(0.5)
        return
    raise InjectedFault(f"silo {silo} fails in round {round} (runtime.fault)")


def run_silo(cfg: Config, channel: Channel, device: Any, silo: int, compute: ComputePool) -> None:
    """The silo's rounds until the server says stop; it computes on `compute` (compute.py)."""
    import torch

    from ..models import build_model, load_arrays, state_arrays
    from ..training import evaluate, to_device, train_local

    data = build_silo_data(cfg, silo)
    # weights come from the server; torch runs on the compute workers only (compute.py)
    model = compute(lambda: build_model(cfg, num_classes(cfg), load_weights=False).to(device))
    # the sets training and evaluation use every round, on the device once (where they fit)
    x_train, y_train, x_test, y_test = (compute(to_device, a, device)
                                        for a in (data.x_train, data.y_train, data.x_test, data.y_test))
    backdoor_set = None if data.x_backdoor is None else (compute(to_device, data.x_backdoor, device),
                                                         compute(to_device, data.y_backdoor, device))
    spec = REGISTRY[cfg.strategy.name]
    protocol = spec.silo(cfg)
    template = state_arrays(model)

    def receive_model(round: int) -> None:
        msg = channel.recv(SERVER, Expect.like(MODEL, round, template, {"cluster": int}))
        compute(load_arrays, model, protocol.decode_model(msg.arrays, round))

    t = channel.recv(SERVER, hello_expect()).meta["next_round"]
    reported: Counter[str] = Counter()
    while True:
        control = channel.recv(SERVER, control_expect(t))
        action = control.meta["action"]
        if action not in ACTIONS:
            raise ProtocolError(f"{control.who} sent control of round {t} with unknown action {action!r}")
        if action == STOP:
            return
        if action != WAIT:
            inject_fault(cfg, silo, t, channel)
            if control.meta["model"]:
                receive_model(t - 1)
        if action == TRAIN:
            ctx = SiloRound(t, silo, channel, model, data, device, cfg.silos, first=bool(control.meta["first"]),
                            compute=compute)
            protocol.before_training(ctx)
            seed = int(np.random.SeedSequence([cfg.seed, silo, t]).generate_state(1)[0])
            fault = fault_of(cfg, silo, t)
            start = {k: v.copy() for k, v in state_arrays(model).items()} if fault == "scaled_update" else {}
            compute(train_local, model, x_train, y_train, cfg.train, torch.Generator().manual_seed(seed), device)
            trained, n_samples = hostile_update(state_arrays(model), len(data.y_train), fault, start)
            send_update(channel, t, protocol.encode_update(trained, t), n_samples, fault)
            protocol.after_training(ctx)
        if action != WAIT:
            steps = ctx.step_seconds if action == TRAIN else {}
            receive_model(t)
            accuracy, loss = compute(evaluate, model, x_test, y_test, device)
            backdoor = {} if backdoor_set is None else \
                {"backdoor_acc": compute(evaluate, model, *backdoor_set, device)[0]}
            sent = np.array([channel.sent_bytes[k.name] - reported[k.name] for k in spec.all_kinds], dtype=np.int64)
            reported = Counter(channel.sent_bytes)
            timings = {"step_seconds": np.array([steps.get(k, 0.0) for k in protocol.steps])} if protocol.steps else {}
            channel.send(SERVER, EVAL, t, {"sent_bytes": sent, **timings}, accuracy=accuracy, loss=loss,
                         n_test=len(data.y_test), wait_wall_s=channel.waits.wall_s,
                         wait_cpu_s=channel.waits.cpu_s, **backdoor)
        t += 1



def hostile_update(arrays: dict[str, np.ndarray], n_samples: int, fault: str | None,
                   start: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """The trained model and sample count, or what a hostile silo (`runtime.fault`) claims."""
    floating = [k for k, v in arrays.items() if np.issubdtype(v.dtype, np.floating)]
    if fault == "scaled_update":  # θ' = s − SCALE·(θ − s): the honest change reversed and magnified
        return {**arrays, **{k: (start[k] - SCALE * (arrays[k] - start[k])).astype(arrays[k].dtype)
                             for k in floating}}, CLAIMED_SAMPLES
    if fault == "huge_weights":
        return {**arrays, **{k: np.full_like(arrays[k], HUGE) for k in floating}}, n_samples
    return arrays, n_samples


def send_update(channel: Channel, round: int, arrays: dict[str, np.ndarray], n_samples: int,
                fault: str | None) -> None:
    """Send the update to the server; a hostile silo withholds its payload or sends it twice."""
    if fault == "header_only":
        channel.send_header_only(SERVER, UPDATE, round, arrays, n_samples=n_samples)
        return
    channel.send(SERVER, UPDATE, round, arrays, n_samples=n_samples)
    if fault == "duplicate_update":
        channel.send(SERVER, UPDATE, round, arrays, n_samples=n_samples)
