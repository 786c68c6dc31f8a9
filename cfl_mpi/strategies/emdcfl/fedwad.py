"""EMD-CFL's FedWaD mode (``distance: fedwad``): W without the server seeing an embedding.

The direct mode sends the server Z_{c|c}R and Z_{c|c'}R. Here every silo keeps them: for the
pair (c, c'), W[c][c'] = W1(Z_{c|c}R, Z_{c'|c}R) − τ_c (EMD-CFL paper, Algorithm 1, line 16) is
the FedWaD job "c>c'" with μ = Z_{c|c}R on silo c and ν = Z_{c'|c}R on silo c' (FedWaD paper,
Algorithm 1; :mod:`cfl_mpi.strategies.shared.fedwad_exchange`). A silo first sends the server its
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

from ...channel import SERVER, Alternative, Pending, wait_all
from ...ot.fedwad import Measure, uniform_measure
from ...ot.wasserstein import unit_rows
from ...wire.messages import Message, ProtocolError
from ..base import ServerRound, SiloRound
from ..fedwad.halves import FEDWAD_SOLVERS
from ..shared.fedwad_exchange import FedWaDParams, Job, job_key, run_jobs, serve
from .measurement import Record, Reference, SendReady
from .messages import PartnerLeft, Projected, ReferenceReport
from .pairs import MEASURE, SERVE

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
        n = own.z_own.shape[0]  # every cloud's rows (none where every partner left first)
        ctx.channel.send(SERVER, ReferenceReport(own.tau, own.noise, n), ctx.round)
        measures = {job_key(ctx.silo, p): self.silo_measure(z) for p, z in mine.items()}
        measures |= {job_key(p, ctx.silo): self.silo_measure(z) for p, z in theirs.items()}
        serve(ctx.channel, ctx.round, measures, self.params(), self.seed)
        return []

    def measure(self, ctx: ServerRound, partners: dict[int, list[tuple[int, int]]], record: Record) -> None:
        """Server: gather τ and noise of every silo with partners (one of each per silo and
        round), run the job of each direction (c, p) the plan asks for (c serves p: pairs.py),
        fill W. A silo that left the federation (in training, or with a `Leave` in place of
        its report or of a FedWaD reply) is awaited no more: its partners are told
        (`PartnerLeft`), let its jobs go, and its pairs stay unmeasured."""
        busy = sorted(c for c, p in partners.items() if p)
        left: set[int] = set()
        notices: list[Pending] = []

        def partner_left(x: int) -> None:
            left.add(x)
            notices.extend(
                ctx.channel.isend(c, PartnerLeft(x), ctx.round)
                for c in busy
                if c not in left and x in dict(partners[c])
            )

        def take_leave(msg: Message) -> None:
            assert ctx.leaving is not None
            ctx.leaving.take(msg)
            partner_left(msg.sender)

        for x in [c for c in busy if c not in ctx.participants]:  # left in training
            partner_left(x)
        instead = None if ctx.leaving is None else Alternative(ctx.leaving.kind, ctx.leaving.expect, take_leave)
        sizes = {}
        expect = ReferenceReport.expect(ctx.round, ranges={"n_samples": (2, self.max_rows)})
        for msg in ctx.channel.recv_each([c for c in busy if c not in left], lambda _: expect, instead):
            c, report = msg.sender, ReferenceReport.of(msg)
            record.tau[c], record.noise[c], sizes[c] = report.tau, report.noise, report.n_samples
        here = [c for c in busy if c not in left]
        jobs = [
            Job(c, p, self.support or max(sizes[c], sizes[p]))
            for c in here
            for p, role in partners[c]
            if role & SERVE and p not in left
        ]
        let_go = {c: [key for p, role in partners[c] if p in left for key in _keys(c, p, role)] for c in here}
        let_go = {c: keys for c, keys in let_go.items() if keys}
        params = self.params()
        estimates = run_jobs(ctx.channel, ctx.round, jobs, params, self.seed, ctx.cores, ctx.leaving, let_go)
        wait_all(notices)
        for job in jobs:
            if job.key not in estimates:  # a holder left during the exchange
                continue
            w1 = estimates[job.key] ** params.p  # p = 2: W2² is W1 under the squared Euclidean cost
            record.W[job.mu, job.nu] = w1 - record.tau[job.mu]
        for c in sizes:
            claim = (float(record.noise[c]), float(record.tau[c]))
            if record.stated.setdefault(c, claim) != claim:
                raise ProtocolError(
                    f"{ctx.channel.describe(c)} sent {ReferenceReport.KIND.name} of round "
                    f"{ctx.round} with noise and τ {claim}; it stated {record.stated[c]} "
                    "earlier in this round"
                )


def _keys(silo: int, partner: int, role: int) -> list[str]:
    """The FedWaD jobs `silo` holds with `partner` in `role`: μ where it serves, ν where it measures."""
    return [job_key(silo, partner)] * bool(role & SERVE) + [job_key(partner, silo)] * bool(role & MEASURE)
