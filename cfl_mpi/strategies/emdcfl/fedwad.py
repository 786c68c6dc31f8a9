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

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ...channel import SERVER, Pending
from ...ot.fedwad import Measure, uniform_measure
from ...ot.wasserstein import unit_rows
from ...wire.messages import ProtocolError
from ..base import ServerRound, SiloRound
from ..fedwad.exchange import FedWaDParams, Job, job_key, run_jobs, serve
from ..fedwad.halves import FEDWAD_SOLVERS
from .measurement import Record, Reference, SendReady
from .messages import Projected, ReferenceReport
from .pairs import SERVE

__all__ = ["FedWaD"]


@dataclass(frozen=True)
class FedWaD:
    """FedWaD mode: each W1 by `iterations` FedWaD iterations on a support of `support` atoms
    (None: the larger of the two clouds), between measures of dimension `dim_r`; `p` = 2 for
    the squared Euclidean cost (its W1 is W2²), else 1; `normalised`: the clouds L2-normalised
    first (the chordal cost). `seed` draws every job's ξ(0) and times."""

    dim_r: int
    max_rows: int
    iterations: int
    support: int | None
    p: int
    normalised: bool
    seed: int

    @property
    def needs_every_peer(self) -> bool:
        return True  # a job needs both of its silos until it ends

    @property
    def silo_modules(self) -> tuple[str, ...]:
        return FEDWAD_SOLVERS  # the silos compute the interpolating measures' plans

    def params(self) -> FedWaDParams:
        return FedWaDParams(p=self.p, n_iter=self.iterations, dim=self.dim_r, max_support=self.support or self.max_rows)

    def silo_measure(self, points: np.ndarray) -> Measure:
        """A silo's projected embeddings as the uniform measure FedWaD compares."""
        x = np.asarray(points, dtype=np.float64)
        return uniform_measure(unit_rows(x) if self.normalised else x)

    def report(
        self,
        ctx: SiloRound,
        projected: Iterator[Projected | SendReady],
        roles: dict[int, int],
        reference: Callable[[], Reference],
        left: set[int],
    ) -> list[Pending]:
        """Silo c: report τ_c and noise, then hold μ = Z_{c|c}R for the jobs c>p of the partners
        it serves and ν = Z_{c|p}R for the jobs p>c of those it measures with; nothing stays in
        flight."""
        own = reference()
        assert own.tau is not None  # tau_projection: pair is a config error with FedWaD
        pairs = [item for item in projected if isinstance(item, Projected)]
        mine = {p.partner: p.own for p in pairs if p.own is not None}
        theirs = {p.partner: p.cross for p in pairs if p.cross is not None}
        n = next(iter({**mine, **theirs}.values())).shape[0]
        ctx.channel.send(SERVER, ReferenceReport(own.tau, own.noise, n), ctx.round)
        measures = {job_key(ctx.silo, p): self.silo_measure(z) for p, z in mine.items()}
        measures |= {job_key(p, ctx.silo): self.silo_measure(z) for p, z in theirs.items()}
        serve(ctx.channel, ctx.round, measures, self.params(), self.seed)
        return []

    def measure(self, ctx: ServerRound, partners: dict[int, list[tuple[int, int]]], record: Record) -> None:
        """Server: gather τ and noise of every silo with partners (one of each per silo and
        round), run the job of each direction (c, p) the plan asks for (c serves p: pairs.py),
        fill W."""
        busy = sorted(c for c, p in partners.items() if p)
        sizes = {}
        expect = ReferenceReport.expect(ctx.round, ranges={"n_samples": (2, self.max_rows)})
        for msg in ctx.channel.recv_each(busy, lambda _: expect):
            c, report = msg.sender, ReferenceReport.of(msg)
            record.tau[c], record.noise[c], sizes[c] = report.tau, report.noise, report.n_samples
        jobs = [
            Job(c, p, self.support or max(sizes[c], sizes[p])) for c in busy for p, role in partners[c] if role & SERVE
        ]
        params = self.params()
        estimates = run_jobs(ctx.channel, ctx.round, jobs, params, self.seed, ctx.cores)
        for job in jobs:
            w1 = estimates[job.key] ** params.p  # p = 2: W2² is W1 under the squared Euclidean cost
            record.W[job.mu, job.nu] = w1 - record.tau[job.mu]
        for c in busy:
            claim = (float(record.noise[c]), float(record.tau[c]))
            if record.stated.setdefault(c, claim) != claim:
                raise ProtocolError(
                    f"{ctx.channel.describe(c)} sent {ReferenceReport.KIND.name} of round "
                    f"{ctx.round} with noise and τ {claim}; it stated {record.stated[c]} "
                    "earlier in this round"
                )
