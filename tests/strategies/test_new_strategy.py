"""The seam holds: a new strategy — here a toy soft clustering with a message kind of its own,
a model per silo and a pairwise matrix — is one registry entry (`strategies.REGISTRY`): the
config takes its section, the simulator runs it without a change to the runtime, the channels
or the wire, and compare's table and the heat maps show it by its label."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest
from jobs import simulate_job

from cfl_mpi import strategies
from cfl_mpi.aggregation.rules import fedavg
from cfl_mpi.channel import SERVER
from cfl_mpi.experiments import compare
from cfl_mpi.strategies import Pairwise, StrategyConfig, StrategySpec
from cfl_mpi.strategies.base import Halves, Model, RunFacts, ServerRound, SiloProtocol, SiloRound, Strategy
from cfl_mpi.wire.messages import ArraySpec, Expect, ProtocolError, message_kind

LOSS = message_kind("toy_loss")  # silo → server: its training loss under its own new model


@dataclass(frozen=True)
class ToySoftConfig(StrategyConfig):
    name: Literal["toy_soft"] = "toy_soft"
    temperature: float = 0.5


class ToySoft(Strategy[ToySoftConfig]):
    """Every silo continues from its own mixture of all updates, weighted by softmax(−|loss_c −
    loss_c'| / temperature): soft clusters, a model per silo."""

    def __init__(self, params: ToySoftConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.artifacts["M"] = np.zeros((run.silos, run.silos))  # row c: the weights of c's mixture

    def initial_clusters(self) -> np.ndarray:
        return np.arange(self.run.silos, dtype=np.int64)

    def after_training(self, ctx: ServerRound) -> np.ndarray:
        expect = Expect(LOSS, ctx.round, (ArraySpec("loss", "float64", (1,)),))
        self.losses = {
            m.sender: float(m.arrays["loss"][0]) for m in ctx.channel.recv_each(ctx.participants, lambda _: expect)
        }
        if any(v < 0 for v in self.losses.values()):
            raise ProtocolError("a loss is negative")
        return self.clusters

    def aggregate(self, ctx: ServerRound) -> dict[int, Model]:
        silos = sorted(ctx.updates)
        loss = np.array([self.losses[c] for c in silos])
        out = {}
        for c in range(self.run.silos):
            if c not in ctx.updates:
                out[c] = ctx.start_models[c]
                continue
            weights = np.exp(-np.abs(loss - self.losses[c]) / self.params.temperature)
            self.artifacts["M"][c, silos] = weights / weights.sum()
            out[c] = fedavg([ctx.updates[s] for s in silos], list(weights))
        return out


class ToySoftSilo(SiloProtocol):
    def after_training(self, ctx: SiloRound) -> None:
        from cfl_mpi.training.local import evaluate

        loss = evaluate(ctx.model, ctx.data.x_train, ctx.data.y_train, ctx.device)[1]
        ctx.channel.send(SERVER, LOSS, ctx.round, {"loss": np.array([loss])})


HALVES = Halves(ToySoft, ToySoftSilo, (LOSS,))
TOY = StrategySpec(
    ToySoftConfig,
    "Toy soft clustering",
    __name__,  # the module holding its HALVES
    pairwise={"M": Pairwise("mixing weight of silo c' in c's model", similarity=True)},
)


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(strategies.REGISTRY, "toy_soft", TOY)  # the one place a strategy is registered


@pytest.mark.job
def test_a_soft_clustering_strategy_runs_without_touching_the_runtime(toy_registered, tmp_path):
    summary, records = simulate_job(
        "configs/digits.yaml",
        tmp_path,
        "strategy.name=toy_soft",
        "silos=4",
        "data.rotations=[0,180]",
        "train.rounds=2",
        "train.local_epochs=1",
        "model.channels=[16,32]",
    )
    assert summary["strategy"] == "toy_soft" and len(records) == 2
    assert all(r["bytes"]["toy_loss"] > 0 for r in records)  # its own kind, counted like the runtime's
    assert all(0.0 <= a <= 1.0 for r in records for a in r["accuracy"])
    assert records[-1]["avg_acc"] > 0.5  # the silos learnt from their mixtures
    assert (tmp_path / "M.npy").exists() and (tmp_path / "distances.png").exists()  # the run's own heat map

    table = compare.markdown_table([compare.summarise("toy_soft", [summary])], "toy")
    assert "| Toy soft clustering |" in table and "| - |" not in table  # its label; it clusters: an ARI
    assert compare.heatmaps(tmp_path, {"toy_soft": tmp_path}) == [tmp_path / "heatmap_toy_soft.png"]
    assert "toy_soft" in compare.parse_args(["c.yaml"]).methods.split(",")  # compared by default
