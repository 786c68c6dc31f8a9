"""EMD-CFL's FedWaD mode (``distance: fedwad``): W without the server seeing an embedding.

The direct mode sends the server Z_{c|c}R and Z_{c|c'}R. Here every silo keeps them: for the
pair (c, c'), W[c][c'] = W1(Z_{c|c}R, Z_{c'|c}R) − τ_c (emd-cfl.txt Alg. 1, line 16) is the
FedWaD job "c>c'" with μ = Z_{c|c}R on silo c and ν = Z_{c'|c}R on silo c' (fedwad.txt,
Algorithm 1; :mod:`cfl_mpi.ot.fedwad_protocol`). A silo first sends the server its τ_c, its
noise scale and its sample size (``fedwad_distance``, no arrays), then serves FedWaD requests.

Ground cost: FedWaD interpolates along straight lines, so the cost must be Euclidean.
``chordal`` (L2-normalised embeddings, Euclidean cost, the cosine geometry) and ``euclidean``
run FedWaD with p = 1, which estimates W1 itself; ``sqeuclidean`` runs it with p = 2 and
squares the estimate, since W1 under the squared Euclidean cost is W2². τ and the noise are
computed on the silo with the same cost, so W means the same as in the direct mode with that
ground cost, up to FedWaD's error (an over-estimate: the result is an upper bound, Eq. 3).
"""
from __future__ import annotations

import numpy as np
from sklearn.preprocessing import normalize

from ..config import Config, EmdCflConfig
from ..ot.fedwad import Measure, uniform_measure
from ..ot.fedwad_protocol import FedWaDParams, Job, job_key, run_jobs, serve
from ..wire.messages import Expect, Kind, ProtocolError
from .base import ServerRound, SiloRound

__all__ = ["measure", "serve_pairs", "silo_measure"]

_META = {"tau": float, "noise": float, "n_samples": int}


def fedwad_params(cfg: Config, dim: int) -> FedWaDParams:
    s: EmdCflConfig = cfg.strategy
    return FedWaDParams(p=2 if s.ground_cost == "sqeuclidean" else 1, n_iter=s.fedwad_iterations, dim=dim,
                        max_support=s.fedwad_support or s.sample_cap)


def silo_measure(points: np.ndarray, s: EmdCflConfig) -> Measure:
    """A silo's projected embeddings as the uniform measure FedWaD compares (chordal: normalised)."""
    x = np.asarray(points, dtype=np.float64)
    return uniform_measure(normalize(x) if s.ground_cost == "chordal" else x)


def serve_pairs(ctx: SiloRound, cfg: Config, own: dict[int, np.ndarray], cross: dict[int, np.ndarray],
                tau: float, noise: float) -> None:
    """Silo c: report τ_c and noise, then hold μ = Z_{c|c}R for jobs c>p and ν = Z_{c|p}R for p>c."""
    s: EmdCflConfig = cfg.strategy
    n = next(iter(own.values())).shape[0]
    ctx.transport.send(ctx.server_rank, Kind.FEDWAD_DISTANCE, ctx.round, None, tau=tau, noise=noise, n_samples=n)
    measures = {}
    for p in own:
        measures[job_key(ctx.silo, p)] = silo_measure(own[p], s)
        measures[job_key(p, ctx.silo)] = silo_measure(cross[p], s)
    dim = next(iter(own.values())).shape[1]
    serve(ctx.transport, ctx.round, ctx.server_rank, measures, fedwad_params(cfg, dim))


def measure(ctx: ServerRound, cfg: Config, partners: dict[int, list[int]], dim: int,
            tau: np.ndarray, noise: np.ndarray, W: np.ndarray) -> None:
    """Server: gather τ and noise of every silo with partners, run both jobs of each pair, fill W."""
    s: EmdCflConfig = cfg.strategy
    rank_to_silo = {r: i for i, r in enumerate(ctx.silo_ranks)}
    busy = sorted(c for c, p in partners.items() if p)
    sizes = {}
    for msg in ctx.transport.recv_each([ctx.silo_ranks[c] for c in busy],
                                       lambda r: Expect(Kind.FEDWAD_DISTANCE, ctx.round, (), _META)):
        c = rank_to_silo[msg.sender]
        if msg.meta["noise"] < 0 or not 2 <= msg.meta["n_samples"] <= s.sample_cap:
            raise ProtocolError(f"rank {msg.sender} sent fedwad_distance of round {ctx.round} with noise "
                                f"{msg.meta['noise']} and n_samples {msg.meta['n_samples']}; expected noise >= 0 "
                                f"and 2 <= n_samples <= {s.sample_cap}")
        tau[c], noise[c], sizes[c] = msg.meta["tau"], msg.meta["noise"], msg.meta["n_samples"]
    jobs = [Job(c, p, s.fedwad_support or max(sizes[c], sizes[p])) for c in busy for p in partners[c]]
    params = fedwad_params(cfg, dim)
    estimates = run_jobs(ctx.transport, ctx.round, ctx.silo_ranks, jobs, params, cfg.seed)
    for job in jobs:
        w1 = estimates[job.key] ** params.p  # p = 2: W2² is W1 under the squared Euclidean cost
        W[job.mu, job.nu] = w1 - tau[job.mu]
