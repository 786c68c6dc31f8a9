"""Ranks 1..N: each silo trains on its own shard and takes part in its strategy's exchanges,
as the server's CONTROL message for each round says (control.py)."""
from __future__ import annotations

import os
import time

import numpy as np

from ..algorithms import REGISTRY
from ..algorithms.base import SiloRound
from ..config import Config
from ..data import build_silo_data, num_classes
from ..wire.messages import Expect, Kind, ProtocolError
from ..wire.transport import Transport
from .control import ACTIONS, STOP, TRAIN, WAIT, control_expect, hello_expect
from .placement import Placement, select_device


class InjectedFault(RuntimeError):
    """The failure `runtime.fault` asked for."""


def inject_fault(cfg: Config, silo: int, round: int) -> None:
    f = cfg.runtime.fault
    if f is None or f.silo != silo or f.round != round:
        return
    if f.kind == "exit":
        os._exit(3)  # dies without a word, as a killed process does
    if f.kind == "hang":
        while True:  # alive but silent: the peers' message timeout must catch it
            time.sleep(60)
    raise InjectedFault(f"silo {silo} fails in round {round} (runtime.fault)")


def run_silo(cfg: Config, transport: Transport, placement: Placement, silo: int) -> None:
    import torch

    from ..models import build_model, load_arrays, state_arrays
    from ..training import evaluate, train_local

    torch.set_num_threads(placement.threads)
    device = select_device(placement)
    data = build_silo_data(cfg, silo)
    model = build_model(cfg, num_classes(cfg), load_weights=False).to(device)  # weights come from the server
    protocol = REGISTRY[cfg.strategy.name].silo(cfg)
    template = state_arrays(model)
    silo_ranks = list(range(1, cfg.silos + 1))

    def receive_model(round: int) -> None:
        msg = transport.recv(0, Expect.like(Kind.MODEL, round, template, {"cluster": int}))
        load_arrays(model, protocol.decode_model(msg.arrays, round))

    t = transport.recv(0, hello_expect()).meta["next_round"]
    reported = {kind.label: 0 for kind in Kind}
    while True:
        control = transport.recv(0, control_expect(t))
        action = control.meta["action"]
        if action not in ACTIONS:
            raise ProtocolError(f"rank 0 sent control of round {t} with unknown action {action!r}")
        if action == STOP:
            return
        if action != WAIT:
            inject_fault(cfg, silo, t)
            if control.meta["model"]:
                receive_model(t - 1)
        if action == TRAIN:
            ctx = SiloRound(t, silo, transport, model, data, device, silo_ranks, first=bool(control.meta["first"]))
            protocol.before_training(ctx)
            seed = int(np.random.SeedSequence([cfg.seed, silo, t]).generate_state(1)[0])
            train_local(model, data.x_train, data.y_train, cfg.train, torch.Generator().manual_seed(seed), device)
            transport.send(0, Kind.UPDATE, t, protocol.encode_update(state_arrays(model), t),
                           n_samples=len(data.y_train))
            protocol.after_training(ctx)
        if action != WAIT:
            receive_model(t)
            accuracy, loss = evaluate(model, data.x_test, data.y_test, device)
            backdoor = {} if data.x_backdoor is None else {
                "backdoor_acc": evaluate(model, data.x_backdoor, data.y_backdoor, device)[0]}
            sent = np.array([transport.sent_bytes[k.label] - reported[k.label] for k in Kind], dtype=np.int64)
            reported = {k.label: transport.sent_bytes[k.label] for k in Kind}
            transport.send(0, Kind.EVAL, t, {"sent_bytes": sent}, accuracy=accuracy, loss=loss,
                           n_test=len(data.y_test), wait_wall_s=transport.waits.wall_s,
                           wait_cpu_s=transport.waits.cpu_s, **backdoor)
        t += 1
