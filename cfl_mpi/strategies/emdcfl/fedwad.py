"""EMD-CFL's FedWaD mode (``distance: fedwad``): W without the server seeing an embedding.

The direct mode sends the server Z_{c|c}R and Z_{c|c'}R. Here every silo keeps them: for the
pair (c, c'), W[c][c'] = W1(Z_{c|c}R, Z_{c'|c}R) − τ_c (EMD-CFL paper, Algorithm 1, line 16) is
the FedWaD job "c>c'" with μ = Z_{c|c}R on silo c and ν = Z_{c'|c}R on silo c' (FedWaD paper,
Algorithm 1; :mod:`cfl_mpi.strategies.fedwad.exchange`). A silo first sends the server its
τ_c, its noise scale and its sample size (``reference``, no arrays), then serves FedWaD requests.

Ground cost: FedWaD interpolates along straight lines, so the cost must be Euclidean.
``chordal`` (L2-normalised embeddings, Euclidean cost, the cosine geometry) and ``euclidean``
run FedWaD with p = 1, which estimates W1 itself; ``sqeuclidean`` runs it with p = 2 and
squares the estimate, since W1 under the squared Euclidean cost is W2². τ and the noise are
computed on the silo with the same cost, so W means the same as in the direct mode with that
ground cost, up to FedWaD's error (an over-estimate: the result is an upper bound, Eq. 3).
"""

from __future__ import annotations

import numpy as np

from ...channel import SERVER
from ...ot.fedwad import Measure, uniform_measure
from ...ot.wasserstein import unit_rows
from ..base import ServerRound, SiloRound
from ..fedwad.exchange import FedWaDParams, Job, job_key, run_jobs, serve
from . import EmdCflConfig
from .messages import ReferenceReport
from .pairs import SERVE

__all__ = ["measure", "serve_pairs", "silo_measure"]


def fedwad_params(s: EmdCflConfig, dim: int) -> FedWaDParams:
    return FedWaDParams(
        p=2 if s.ground_cost == "sqeuclidean" else 1,
        n_iter=s.fedwad_iterations,
        dim=dim,
        max_support=s.fedwad_max_support,
    )


def silo_measure(points: np.ndarray, s: EmdCflConfig) -> Measure:
    """A silo's projected embeddings as the uniform measure FedWaD compares (chordal: normalised)."""
    x = np.asarray(points, dtype=np.float64)
    if s.ground_cost == "chordal":
        x = unit_rows(x)
    return uniform_measure(x)


def serve_pairs(
    ctx: SiloRound,
    s: EmdCflConfig,
    seed: int,
    own: dict[int, np.ndarray],
    cross: dict[int, np.ndarray],
    tau: float,
    noise: float,
) -> None:
    """Silo c: report τ_c and noise, then hold μ = Z_{c|c}R for the jobs c>p of the partners
    it serves and ν = Z_{c|p}R for the jobs p>c of those it measures with."""
    n, dim = next(iter({**own, **cross}.values())).shape
    ctx.channel.send(SERVER, ReferenceReport(tau, noise, n), ctx.round)
    measures = {job_key(ctx.silo, p): silo_measure(z, s) for p, z in own.items()}
    measures |= {job_key(p, ctx.silo): silo_measure(z, s) for p, z in cross.items()}
    serve(ctx.channel, ctx.round, measures, fedwad_params(s, dim), seed)


def measure(
    ctx: ServerRound,
    s: EmdCflConfig,
    seed: int,
    partners: dict[int, list[tuple[int, int]]],
    dim: int,
    tau: np.ndarray,
    noise: np.ndarray,
    W: np.ndarray,
) -> None:
    """Server: gather τ and noise of every silo with partners, run the job of each direction
    (c, p) the plan asks for (c serves p: pairs.py), fill W."""
    busy = sorted(c for c, p in partners.items() if p)
    sizes = {}
    expect = ReferenceReport.expect(ctx.round, ranges={"n_samples": (2, s.max_rows)})
    for msg in ctx.channel.recv_each(busy, lambda _: expect):
        c, report = msg.sender, ReferenceReport.of(msg)
        tau[c], noise[c], sizes[c] = report.tau, report.noise, report.n_samples
    jobs = [
        Job(c, p, s.fedwad_support or max(sizes[c], sizes[p])) for c in busy for p, role in partners[c] if role & SERVE
    ]
    params = fedwad_params(s, dim)
    estimates = run_jobs(ctx.channel, ctx.round, jobs, params, seed, ctx.cores)
    for job in jobs:
        w1 = estimates[job.key] ** params.p  # p = 2: W2² is W1 under the squared Euclidean cost
        W[job.mu, job.nu] = w1 - tau[job.mu]
