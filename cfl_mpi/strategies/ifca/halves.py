"""IFCA (Ghosh, Chung, Yin, Ramchandran, NeurIPS 2020): K cluster models, assignment by loss.

Every round, before training, the server sends each silo all K cluster models (`model`
messages of that round, `cluster` = k, `clusters` = K); the silo evaluates each on its own
training data, sends the K losses (`losses`) and trains the one of lowest loss, as
IFCA's clients estimate their identity themselves. The server takes each silo's losses as
they come, in the same receive as the updates (`ahead_of_update`: a silo's update, which
follows its losses, need not wait for every other silo's losses), assigns it with
`ifca_assign`, checks that it chose what its losses say, and averages each cluster's updates
into its model (FedAvg per cluster, `aggregate`). A cluster nobody
joined keeps its model. The models evaluated at the end of a round are the silos' cluster
models.

Initialisation (`strategy.init`):
- "random": K models drawn one after another from the run's torch seed (model 0 is θ(0)),
  as the authors' code does.
- "silos" (default): round 1 trains from θ(0) like every method; then the server picks K
  of the trained silo models by farthest-first traversal of the loss table (the first at
  random from the seed; each next one the model of the silo worst served by those picked
  so far) and the silos join the one of lowest loss. With random models the silos' losses
  barely differ, so the first assignment is noise and an unused model never wins again;
  seeding from trained models is k-means++'s deterministic cousin (Gonzalez 1985) in loss
  space, at the cost of one IFCA round of messages.
"""

from __future__ import annotations

import time

import numpy as np

from ...channel import SERVER, wait_all
from ...wire.messages import Message, ProtocolError
from ...wire.payload import Payload, array, scalar, state
from ...wire.round import HUGE_LOSS, StartModel
from ..base import AheadOfUpdate, Halves, Model, RunFacts, ServerRound, SiloProtocol, SiloRound, Strategy
from . import IfcaConfig
from .assign import ifca_assign


class ClusterModel(Payload, kind=StartModel.KIND):
    """server → silo: cluster model k of K before training, or seed candidate k of K in the
    seeding round (init "silos"); a model message of its own round."""

    weights: dict[str, np.ndarray] = state()
    cluster: int = scalar(int, 0, np.inf)
    clusters: int = scalar(int, 1, np.inf)


class Losses(Payload, kind="losses"):
    """silo → server: the losses of the K cluster models on its training data, and the cluster
    it chose (the one of lowest loss: the server checks)."""

    losses: np.ndarray = array("float64", "k")
    cluster: int = scalar(int, 0, np.inf)


class CandidateLoss(Payload, kind=Losses.KIND):
    """silo → server, in the seeding round: the loss of seed candidate k on its training data."""

    losses: np.ndarray = array("float64", 1)
    candidate: int = scalar(int, 0, np.inf)


class Ifca(Strategy[IfcaConfig]):
    """Server half: holds the K models, sends them out, assigns from the loss table."""

    def __init__(self, params: IfcaConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.k = run.cluster_count(params.k)  # as EMD-CFL's experiments give it (Appendix D.3)
        self.models: list[Model] | None = None
        self.losses = np.full((run.silos, self.k), np.nan)
        self.seeds: list[int] = []
        self.artifacts = {"losses": self.losses}
        self.broadcasts: list = []  # the round's K models on their way to the silos
        self.broadcast_at = 0.0

    def initial_clusters(self) -> np.ndarray:
        return np.zeros(self.run.silos, dtype=np.int64)  # everyone trains from θ(0) until assigned

    def before_training(self, ctx: ServerRound) -> None:
        """IFCA's identity estimation starts: the K models to every participant; each silo's
        losses come back ahead of its update (`ahead_of_update`)."""
        s = self.params
        if self.models is None:
            if s.init == "silos" and ctx.round == 1:
                return  # round 1 trains from θ(0); the models are seeded after training
            self.models = self.run.initial_models(self.k)  # torch: init random, or no silo was left to seed from
        self.broadcasts = [p for k, m in enumerate(self.models) for p in self._broadcast(ctx, m, k)]
        self.broadcast_at = time.monotonic()

    def ahead_of_update(self, ctx: ServerRound) -> AheadOfUpdate | None:
        if not self.broadcasts:
            return None  # the seeding round: no models yet
        expect = Losses.expect(ctx.round, k=self.k)
        return AheadOfUpdate(lambda _: expect, lambda msg: self._assign(ctx, msg))

    def settled(self, ctx: ServerRound) -> bool:
        return self.models is not None  # each silo by its losses; init "silos" seeds round 1 from the updates

    def after_training(self, ctx: ServerRound) -> np.ndarray:
        wait_all(self.broadcasts)
        self.broadcasts = []
        if self.models is None:
            self._seed(ctx)
        return self.clusters

    def aggregate(self, ctx: ServerRound) -> dict[int, Model]:
        """FedAvg per cluster, which becomes that cluster's model for the next round."""
        models = super().aggregate(ctx)
        for c in ctx.participants:  # those that sent an update (the server drops any that left)
            self._cluster_models()[self.clusters[c]] = models[c]
        return models

    def _cluster_models(self) -> list[Model]:
        """The K models, which exist from the end of round 1 (init silos) or its start (random)."""
        assert self.models is not None, "IFCA's cluster models are read before they were made"
        return self.models

    def _broadcast(self, ctx: ServerRound, model: Model, k: int) -> list:
        """Model k to every participant: once per rank, shared there (Channel.isend_all)."""
        return [ctx.channel.isend_all(ctx.participants, ClusterModel(model, k, self.k), ctx.round)]

    def _assign(self, ctx: ServerRound, msg: Message) -> None:
        """One silo's identity: its K losses, the argmin its cluster (which it must have
        chosen too), that cluster's model what its update is measured against."""
        c, reply = msg.sender, Losses.of(msg)
        self.losses[c] = reply.losses
        self.clusters[c] = chosen(reply.losses)
        if reply.cluster != self.clusters[c]:
            raise ProtocolError(
                f"{ctx.channel.describe(c)} sent losses of round {ctx.round} and chose cluster "
                f"{reply.cluster}, but its losses {self.losses[c].tolist()} put it in cluster "
                f"{self.clusters[c]}"
            )
        ctx.start_models[c] = self._cluster_models()[self.clusters[c]]
        ctx.step_seconds["identity"] = time.monotonic() - self.broadcast_at  # until the last silo's losses

    def _seed(self, ctx: ServerRound) -> None:
        """init "silos": farthest-first traversal of the trained silo models in loss space.

        With `runtime.on_silo_failure: drop` a silo may leave here (a `Leave` in place of a
        loss: `ctx.leaving` takes it out of `ctx.participants`). The traversal goes on over the
        silos left and reads no loss on a candidate whose silo left; such a seed is then replaced
        by the model of the silo left that the other seeds serve worst (the traversal's next
        pick, measured in round 2's identity step as every model is), and the update of a silo
        that left joins no cluster (it keeps its label, as one that leaves in any round does).
        With fewer silos left than k, a model seeds several clusters.
        """
        here = ctx.participants  # the silos left
        trained, picked = list(here), []
        expect = CandidateLoss.expect(ctx.round)
        for k in range(self.k):
            if not here:
                break
            if k == 0:
                picked.append(here[int(np.random.default_rng([self.run.seed, 43]).integers(len(here)))])
            else:
                picked.append(self._farthest(here, picked, [j for j, c in enumerate(picked) if c in here]))
            pending = self._broadcast(ctx, ctx.updates[picked[k]], k)
            for msg in ctx.channel.recv_each(list(here), lambda _: expect, ctx.leaving):
                reply = CandidateLoss.of(msg)
                if reply.candidate != k:
                    raise ProtocolError(
                        f"{msg.who} sent losses of round {ctx.round} for candidate "
                        f"{reply.candidate}, expected candidate {k}"
                    )
                self.losses[msg.sender, k] = reply.losses[0]
            wait_all(pending)
        for c in set(trained) - set(here):
            del ctx.updates[c], ctx.n_samples[c]
        if not here:
            return  # every silo left: no model to seed from (round 2 draws them, as init random does)
        measured = [j for j, c in enumerate(picked) if c in here]
        for j in sorted(set(range(self.k)) - set(measured)):  # its silo left
            picked[j] = self._farthest(here, picked, measured)
        self.seeds = picked
        self.models = [ctx.updates[c] for c in picked]
        table = np.full((len(here), self.k), np.nan)  # NaN: no loss counts (ifca_assign)
        table[:, measured] = self.losses[here][:, measured]
        self.clusters[here] = ifca_assign(table)

    def _farthest(self, here: list[int], seeds: list[int], candidates: list[int]) -> int:
        """The traversal's next pick: the silo of `here` worst served by the `candidates` (the
        greatest of its lowest losses on them), not one of the `seeds` unless all are."""
        served = self.losses[here][:, candidates].min(axis=1, initial=np.inf)
        served[[i for i, c in enumerate(here) if c in seeds]] = -np.inf
        return here[int(np.argmax(served))]

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {"clusters": self.clusters, "losses": self.losses}
        for k, model in enumerate(self.models or []):
            arrays.update({f"model{k}/{name}": a for name, a in model.items()})
        return arrays, {"seeds": self.seeds, "has_models": self.models is not None}

    def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        self.clusters = arrays["clusters"].astype(np.int64)
        self.losses[...] = arrays["losses"]
        self.seeds = meta["seeds"]
        self.models = None
        if meta["has_models"]:
            self.models = [
                {name.split("/", 1)[1]: a for name, a in arrays.items() if name.startswith(f"model{k}/")}
                for k in range(self.k)
            ]

    def report(self) -> dict:
        return {"ifca": {"k": self.k, "init": self.params.init, "seed_silos": self.seeds}}


class IfcaSilo(SiloProtocol[IfcaConfig]):
    """Silo half: evaluates the cluster models on its training data, trains the best one."""

    def _models(self, ctx: SiloRound, what: str):
        """Receive the round's models 0..K-1 in order, yielding (k, arrays)."""
        from ...models.build import state_template

        expect = ClusterModel.expect(ctx.round, like=state_template(ctx.model))
        k, total = 0, None
        while total is None or k < total:
            msg = ctx.channel.recv(SERVER, expect)
            model = ClusterModel.of(msg)
            total = model.clusters if total is None else total
            if model.cluster != k or model.clusters != total or not 1 <= total <= ctx.silos:
                raise ProtocolError(
                    f"{msg.who} sent {what} {model.cluster} of {model.clusters} in round "
                    f"{ctx.round}, expected number {k} of {total} (at most {ctx.silos})"
                )
            yield k, model.weights
            k += 1

    def _loss(self, ctx: SiloRound, arrays: dict[str, np.ndarray]) -> float:
        """The silo's training loss under one model (the seeding round's candidates)."""
        job = (ctx.model, [arrays], ctx.data.x_train, ctx.data.y_train)
        return float(ctx.compute(identity_losses, [job], ctx.device)[0][0])

    def _seeding_round(self, ctx: SiloRound) -> bool:
        return ctx.round == 1 and self.params.init == "silos"

    def before_training(self, ctx: SiloRound) -> None:
        if self._seeding_round(ctx):
            return
        models = [arrays for _, arrays in self._models(ctx, "cluster model")]
        # The silos of a process get the K models as the same arrays (Channel.isend_all): those
        # that queue their losses together share one call, which loads each model once for all.
        shared = tuple(id(next(iter(arrays.values()))) for arrays in models)
        table = ctx.compute.batched(
            ("ifca_losses", ctx.round, shared),
            lambda jobs: identity_step(jobs, ctx.device),
            (ctx.model, models, ctx.data.x_train, ctx.data.y_train),
            IDENTITY_BATCH,
        )
        ctx.channel.send(SERVER, Losses(table, chosen(table)), ctx.round)  # and trains that model

    def after_training(self, ctx: SiloRound) -> None:
        if not self._seeding_round(ctx):
            return
        for k, arrays in self._models(ctx, "seed candidate"):
            ctx.channel.send(SERVER, CandidateLoss(np.array([self._loss(ctx, arrays)]), k), ctx.round)


# Silos whose identity step one call computes at most: their losses in turn, each model
# loaded once for them (a worker takes a batch up as soon as it is free, so a large limit
# leaves no worker idle).
IDENTITY_BATCH = 4096


def chosen(losses: np.ndarray) -> int:
    """The cluster a silo's losses choose: IFCA's argmin, as the server assigns."""
    return int(ifca_assign(losses[None, :])[0])


def identity_step(jobs: list[tuple], device) -> list[np.ndarray]:
    """`identity_losses`, then each silo's model holding the cluster model its losses choose
    (the one it trains): in the same call, not one more hand-off to a worker per silo."""
    from ...models.build import hold_arrays

    table = identity_losses(jobs, device)
    for (model, models, _, _), losses in zip(jobs, table):
        hold_arrays(model, models[chosen(losses)], device)
    return table


def identity_losses(jobs: list[tuple], device) -> list[np.ndarray]:
    """IFCA's identity step for a batch of silos (model, the K models' arrays, x, y), each
    silo's training loss under each model as `evaluate` computes it alone (the same bits), each
    model loaded once into the worker's scratch model; a non-finite loss is HUGE_LOSS."""
    from ...models.build import load_arrays, scratch_copy
    from ...training.local import evaluate

    scratch = scratch_copy(jobs[0][0])
    table = np.empty((len(jobs), len(jobs[0][1])))
    for k, arrays in enumerate(jobs[0][1]):  # one set of models: the batch's key names them
        load_arrays(scratch, arrays)
        for i, (_, _, x, y) in enumerate(jobs):
            table[i, k] = evaluate(scratch, x, y, device)[1]
    table[~np.isfinite(table)] = HUGE_LOSS
    return list(table)


HALVES = Halves(Ifca, IfcaSilo, (Losses.KIND,))
