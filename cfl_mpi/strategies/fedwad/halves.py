"""FedWaD clustering: the FedWaD paper's own use in FL ("Boosting FL methods", §4 and
Appendix D.7 of Rakotomamonjy, Nadjahi, Ralaivola, "Federated
Wasserstein Distance", ICLR 2024), one shot before round 1's training.

Every pair of silos (a, b) gets D[a][b] = Wp(μ_a, μ_b), the FedWaD estimate (Algorithm 1,
:mod:`cfl_mpi.strategies.shared.fedwad_exchange`) between samples of their local data, in input space or in
the embedding space of the common θ(0) (a fixed random feature map, like the paper's
untrained autoencoder for CIFAR-10). The data never leave the silos. The server turns D into
an affinity and runs scikit-learn's spectral clustering with K clusters (the paper's
"affinity" setting, which did best in its Tables 2-5); FedAvg runs inside the clusters.

With ``runtime.on_silo_failure: drop`` a silo may be out before the exchange (its data could
not be read) or leave during it (a ``Leave`` in place of a reply): the others let its jobs go
(``op: abandon``), the pairs among them are measured as ever, and the spectral clustering runs
on those silos alone, the silo that left in a cluster of its own. Beyond the paper, whose
clients all answer.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ...clustering.labels import relabel_by_first_appearance
from ...ot.fedwad import uniform_measure
from ..base import Halves, RunFacts, ServerRound, SiloProtocol, SiloRound, Strategy
from ..shared.fedwad_exchange import FEDWAD_KINDS, FedWaDParams, Job, run_jobs, serve
from . import FedWaDClusteringConfig

__all__ = ["FedWaDClustering", "FedWaDClusteringSilo", "clusters_of", "spectral_clusters"]

FEDWAD_SOLVERS = ("cfl_mpi.ot.solvers",)  # FedWaD's plans: POT's simplex, scipy's assignment


def clusters_of(D: np.ndarray, k: int, seed: int, measured: list[int]) -> tuple[np.ndarray, float]:
    """`spectral_clusters` of the silos `measured` (every pair among them measured) and, after
    them, each other silo in a cluster of its own (one that left before its pairs were
    measured); labels renumbered by first appearance, σ that of the measured silos."""
    labels = np.arange(len(D), dtype=np.int64) + len(measured)  # the others: one cluster each
    labels[measured], sigma = spectral_clusters(D[np.ix_(measured, measured)], k, seed)
    return relabel_by_first_appearance(labels), sigma


def spectral_clusters(D: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, float]:
    """Labels of spectral clustering on the affinity exp(−D²/σ²), and σ.

    σ is the median off-diagonal distance: the affinity then spreads over (0, 1) whatever the
    scale of D (raw pixels or embeddings, W1 or W2), with no parameter to tune; the paper only
    says "after rescaling". Labels are renumbered by first appearance.
    """
    c = D.shape[0]
    if k >= c:
        return np.arange(c, dtype=np.int64), 0.0
    off = D[~np.eye(c, dtype=bool)]
    sigma = float(np.median(off)) or 1.0
    if k == 1:
        return np.zeros(c, dtype=np.int64), sigma
    affinity = np.exp(-np.square(D / sigma))
    from sklearn.cluster import SpectralClustering

    labels = SpectralClustering(n_clusters=k, affinity="precomputed", random_state=seed).fit_predict(affinity)
    return relabel_by_first_appearance(labels), sigma


def pair_jobs(s: FedWaDClusteringConfig, silos: int) -> list[Job]:
    """One job per pair a < b: μ is silo a's sample, ν silo b's."""
    return [Job(a, b, s.max_support) for a in range(silos) for b in range(a + 1, silos)]


def fedwad_params(s: FedWaDClusteringConfig, run: RunFacts) -> FedWaDParams:
    dim = run.embedding_dim if s.space == "embedding" else run.input_dim
    return FedWaDParams(p=s.p, n_iter=s.iterations, dim=dim, max_support=s.max_support)


class FedWaDClustering(Strategy[FedWaDClusteringConfig]):
    """Server half: drives every pair's FedWaD job before round 1 trains, then clusters D."""

    def __init__(self, params: FedWaDClusteringConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.D = np.full((run.silos, run.silos), np.nan)
        np.fill_diagonal(self.D, 0.0)
        self.sigma = float("nan")
        self.artifacts = {"D": self.D}

    def modules(self) -> tuple[str, ...]:
        return (*super().modules(), *FEDWAD_SOLVERS, "sklearn.cluster")

    def initial_clusters(self) -> np.ndarray:
        return np.arange(self.run.silos, dtype=np.int64)  # nobody measured yet

    def before_training(self, ctx: ServerRound) -> None:
        """Every pair's FedWaD job among the round's participants; a silo out of the round (its
        data unreadable at the start) is measured with nobody, and its partners let its jobs
        go. One that leaves during the exchange (`ctx.leaving`, which takes it out of
        `ctx.participants`) ends its jobs there. D is clustered over the silos left."""
        if ctx.round != 1:
            return
        s = self.params
        here = set(ctx.participants)
        jobs, let_go = [], defaultdict(list)
        for job in pair_jobs(s, self.run.silos):
            if {job.mu, job.nu} <= here:
                jobs.append(job)
            for holder, other in ((job.mu, job.nu), (job.nu, job.mu)):
                if holder in here and other not in here:
                    let_go[holder].append(job.key)
        params = fedwad_params(s, self.run)
        estimates = run_jobs(ctx.channel, ctx.round, jobs, params, self.run.seed, ctx.cores, ctx.leaving, let_go)
        for job in jobs:
            if job.key in estimates:  # else a holder left during the exchange
                self.D[job.mu, job.nu] = self.D[job.nu, job.mu] = estimates[job.key]
        k = self.run.cluster_count(s.clusters)
        self.clusters, self.sigma = clusters_of(self.D, k, self.run.seed, sorted(ctx.participants))

    def settled(self, ctx: ServerRound) -> bool:
        return True  # clustered before round 1 trains, once

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"clusters": self.clusters, "D": self.D}, {"sigma": self.sigma}

    def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        self.clusters = arrays["clusters"].astype(np.int64)
        self.D[...] = arrays["D"]
        self.sigma = meta["sigma"]

    def report(self) -> dict:
        s = self.params
        return {
            "fedwad": {
                "space": s.space,
                "p": s.p,
                "iterations": s.iterations,
                "clusters": self.run.cluster_count(s.clusters),
                "sigma": self.sigma,
            }
        }


class FedWaDClusteringSilo(SiloProtocol[FedWaDClusteringConfig]):
    """Silo half: before round 1 trains, holds a sample of its data for every pair it is in."""

    def modules(self) -> tuple[str, ...]:
        return FEDWAD_SOLVERS

    def before_training(self, ctx: SiloRound) -> None:
        if ctx.round != 1:
            return
        s = self.params
        x = ctx.data.x_train
        rng = np.random.default_rng([self.run.seed, 13, ctx.silo])
        sample = x[np.sort(rng.choice(len(x), min(s.sample_cap, len(x)), replace=False))]
        if s.space == "embedding":
            from ...training.local import embed  # torch: silo side only

            points = ctx.compute(embed, ctx.model.embedding, sample, ctx.device)  # g of θ(0): nothing trained yet
        else:
            points = sample.reshape(len(sample), -1)
        mine = uniform_measure(points)
        measures = {job.key: mine for job in pair_jobs(s, self.run.silos) if ctx.silo in (job.mu, job.nu)}
        serve(ctx.channel, ctx.round, measures, fedwad_params(s, self.run), self.run.seed)


HALVES = Halves(FedWaDClustering, FedWaDClusteringSilo, FEDWAD_KINDS)
