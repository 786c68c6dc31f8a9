"""EMD-CFL's server half (Zhang, Williams, Toni: Clustered Federated Learning via Embedding
Distributions; Algorithm 1): plans the round's pairs, forms W[c][c'] = W1(Z_{c|c}R, Z_{c'|c}R)
− τ_c from the silos' projected embeddings (line 16) and extracts the clusters; with
`distance: fedwad` it gets each W1 by FedWaD instead (fedwad.py).

The round is planned before training, so that a silo starts its handshakes and ω swaps as
soon as it has trained rather than when the slowest silo has.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ...channel import Alternative, Pending, wait_all
from ...clustering.extraction import extract_clusters
from ...wire.messages import Expect, Message, ProtocolError
from ..base import RunFacts, ServerRound, Strategy, timed
from . import EmdCflConfig, fedwad
from .distances import pair_distances, projected_dim, solver_modules
from .messages import Embeddings, PartnerLeft, Plan, ReferenceReport
from .pairs import MEASURE, SERVE, Pair, partner_roles
from .plans import pair_plan


class EmdCfl(Strategy[EmdCflConfig]):
    """Server half: schedules unmeasured pairs, computes W from projected embeddings, clusters."""

    def __init__(self, params: EmdCflConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.dim_r = projected_dim(params, run.embedding_dim)
        c = run.silos
        self.W = np.full((c, c), np.nan)
        np.fill_diagonal(self.W, 0.0)
        # τ_c per silo, or τ_{c,c'} per ordered pair (`tau_projection: pair`)
        self.tau = np.full((c, c) if params.tau_projection == "pair" else c, np.nan)
        self.noise = np.full(c, np.nan)
        self.extraction: dict = {}
        self.partners: dict[int, list[tuple[int, int]]] = {}  # this stage's (partner, role) per silo
        self.placed = np.full(c, -1, dtype=np.int64)  # the staged plans' clusters so far (-1: not placed)
        self.plan = pair_plan(params, run, self.placed)
        self.more = False  # whether the round's plan has a stage after the one sent
        self.stated: dict[int, tuple[float, ...]] = {}
        self.artifacts = {"W": self.W, "tau": self.tau, "noise": self.noise}

    def modules(self) -> tuple[str, ...]:
        return (*super().modules(), *solver_modules(self.params))

    def initial_clusters(self) -> np.ndarray:
        return np.arange(self.run.silos, dtype=np.int64)  # M = I: every silo alone (line 3)

    def before_training(self, ctx: ServerRound) -> None:
        """Send the first stage of the round's pair plan before training, so a silo needs
        nobody else to start."""
        self.stated = {}  # (noise_c[, τ_c]) as silo c first stated them this round
        self.plan.start(ctx)
        directions, self.more = self.plan.stage(self.W, self.noise)
        self._send_plan(ctx, sorted(ctx.participants), directions, self.more)

    def _send_plan(self, ctx: ServerRound, silos: list[int], directions: list[Pair], more: bool) -> None:
        """Each silo's partners and roles for the `directions` (r, c) to measure (W[r][c]);
        `more`: another plan follows in this round. Silos with the same plan get it as one
        message (`isend_all`: once per rank): with many silos most plans of a stage are the
        same (no partners, or the same representatives)."""
        self.partners = partner_roles(silos, directions)
        alike: dict[tuple[tuple[int, int], ...], list[int]] = defaultdict(list)
        for silo in silos:
            alike[tuple(self.partners[silo])].append(silo)
        wait_all(
            [
                ctx.channel.isend_all(
                    group,
                    Plan(
                        np.asarray([p for p, _ in plan], dtype=np.int64),
                        np.asarray([r for _, r in plan], dtype=np.uint8),
                        int(more),
                    ),
                    ctx.round,
                )
                for plan, group in alike.items()
            ]
        )

    def after_training(self, ctx: ServerRound) -> np.ndarray:
        """Measure each stage's pairs and send the next stage the plan asks for, until none
        follows; then the plan's clusters (the last ones where the round measured nothing)."""
        more, seconds = self.more, []
        while True:
            start = time.monotonic()
            if any(self.partners.values()):
                self._measure(ctx, self.partners)
            if not more:
                break
            directions, more = self.plan.stage(self.W, self.noise)
            seconds.append(time.monotonic() - start)
            self._send_plan(ctx, sorted(ctx.participants), directions, more)
        if found := self.plan.clusters(ctx, self.W, self.noise, seconds, self.extraction):
            self.clusters, self.extraction = found
        return self.clusters

    def _measure(self, ctx: ServerRound, partners: dict[int, list[tuple[int, int]]]) -> None:
        """Receive every silo's projected embeddings, pair by pair, and fill W (line 16)."""
        s = self.params
        if s.distance == "fedwad":  # the embeddings stay on the silos
            fedwad.measure(ctx, s, self.run.seed, partners, self.dim_r, self.tau, self.noise, self.W)
            for c in sorted(c for c, p in partners.items() if p):  # one noise and τ per silo and round
                claim = (float(self.noise[c]), float(self.tau[c]))
                if self.stated.setdefault(c, claim) != claim:
                    raise ProtocolError(
                        f"{ctx.channel.describe(c)} sent {ReferenceReport.KIND.name} of round "
                        f"{ctx.round} with noise and τ {claim}; it stated {self.stated[c]} "
                        "earlier in this round"
                    )
            return
        todo = {silo: dict(p) for silo, p in partners.items() if p}  # partner → role, not received yet
        dim_r = self.dim_r
        # The pairs a message completes are measured at once, in batches on a pool of the
        # server's cores, while later embeddings are still arriving (the assignment solver
        # and BLAS release the GIL); each entry is computed as serially, so W is unchanged.
        solves: list[tuple[list[Pair], Future[tuple[np.ndarray, float, float]]]] = []
        left = {c for c in todo if c not in ctx.participants}  # silos that left in training
        with ThreadPoolExecutor(max_workers=max(1, ctx.cores), thread_name_prefix="w1") as pool:
            try:
                with timed(ctx.step_seconds, "receive"):
                    self._receive_pairs(ctx, todo, left, dim_r, pool, solves)
            except BaseException:  # a bad message ends the round: drop the solves not started
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            with timed(ctx.step_seconds, "w1_after_last_message"):
                for directions, solve in solves:
                    values, seconds, cpu_seconds = solve.result()
                    for (c, partner), value in zip(directions, values.tolist()):
                        if c in left or partner in left:  # a pair of a silo that left stays unmeasured
                            continue
                        self.W[c, partner] = value - self.tau[(c, partner) if self.tau.ndim == 2 else c]
                    for step, spent in (("w1_solves", seconds), ("w1_solves_cpu", cpu_seconds)):
                        ctx.step_seconds[step] = ctx.step_seconds.get(step, 0.0) + spent
        ctx.step_seconds["w1_pool_threads"] = max(1, ctx.cores)

    def _receive_pairs(
        self,
        ctx: ServerRound,
        todo: dict[int, dict[int, int]],
        left: set[int],
        dim_r: int,
        pool: ThreadPoolExecutor,
        solves: list[tuple[list[Pair], Future[tuple[np.ndarray, float, float]]]],
    ) -> None:
        """Receive the embeddings of every pair in `todo` (partner → the roles not received
        yet), record τ and noise, start the solves of the pairs each message completes, in
        as many batches as the pool has threads. A silo's message carries a batch: its own
        cloud for partners it serves (`served`, `own`, `tau`) and its cross cloud for partners
        it measures with (`measured`, `cross`), as its plan gave it the roles; a silo sends what
        is ready whenever it would otherwise wait (with many silos: one message a silo and
        stage, not one a pair, for the server to take).

        A silo that `left` (before this, or with a `Leave` in place of its embeddings) is
        awaited no more; each partner still owing its pairs with it is told (`PartnerLeft`)
        and then sends them, or names them skipped where it never had its key or ω; the pairs
        of a silo that left stay unmeasured."""
        # by direction (r, c): r's own cloud Z_{r|r}R, and c's cloud under r's model Z_{c|r}R
        owns: dict[Pair, np.ndarray] = {}
        crosses: dict[Pair, np.ndarray] = {}
        per_pair = self.tau.ndim == 2
        rows: dict[int, int] = {}  # each silo's cloud size, the same in all its clouds of the round
        told: dict[int, set[int]] = defaultdict(set)  # the partners each silo was told left
        notices: list[Pending] = []

        def expect(c: int) -> Expect:  # at most a cloud of each role per planned partner
            return Embeddings.expect(
                ctx.round, dim_r=dim_r, max_elements=max(1, len(todo[c])) * self.params.max_rows * dim_r
            )

        def partner_left(x: int) -> None:
            left.add(x)
            todo.pop(x, None)
            for c, roles in todo.items():
                if x in roles and x not in told[c]:
                    told[c].add(x)
                    notices.append(ctx.channel.isend(c, PartnerLeft(x), ctx.round))

        def take_leave(msg: Message) -> None:
            assert ctx.leaving is not None
            ctx.leaving.take(msg)
            partner_left(msg.sender)

        instead = None if ctx.leaving is None else Alternative(ctx.leaving.kind, ctx.leaving.expect, take_leave)
        for x in sorted(left):
            partner_left(x)
        while todo:
            if (msg := ctx.channel.recv_any_or(list(todo), expect, instead)) is None:
                continue  # a silo left
            c, clouds = msg.sender, Embeddings.of(msg)
            served, measured = clouds.served.tolist(), clouds.measured.tolist()
            self._check_batch(ctx, msg, todo[c], rows, clouds, told[c])
            for p in served:
                todo[c][p] &= ~SERVE
            for p in measured:
                todo[c][p] &= ~MEASURE
            for p in clouds.skipped.tolist():
                todo[c][p] = 0
            todo[c] = {p: role for p, role in todo[c].items() if role}
            if not todo[c]:
                del todo[c]
            if served:  # τ and the noise belong to the rows W[c][·] it serves
                self.noise[c] = clouds.noise
            for p, own, tau in zip(served, clouds.own, clouds.tau.tolist()):
                self.tau[(c, p) if per_pair else c] = tau
                if p not in left:
                    owns[(c, p)] = own
            for p, cross in zip(measured, clouds.cross):
                if p not in left:
                    crosses[(p, c)] = cross
            # W[r][c] compares r's data and c's data, both under r's model.
            done = [d for d in [(c, p) for p in served] + [(p, c) for p in measured] if d in owns and d in crosses]
            size = max(1, -(-len(done) // max(1, ctx.cores)))
            for batch in (done[i : i + size] for i in range(0, len(done), size)):
                solves.append(
                    (
                        batch,
                        pool.submit(
                            self._timed_distances, [owns.pop(d) for d in batch], [crosses.pop(d) for d in batch]
                        ),
                    )
                )
        wait_all(notices)

    def _check_batch(
        self,
        ctx: ServerRound,
        msg: Message,
        roles: dict[int, int],
        rows: dict[int, int],
        batch: Embeddings,
        told: set[int],
    ) -> None:
        """A batch from silo c (well-formed: its declaration) must hold clouds its plan asks
        for (`roles`: partner → roles not received yet), each of one size (at least 2 rows) in
        all its clouds of the round, and skip only partners it was `told` left; where it
        serves, the one noise, and the one τ unless τ is per pair, it states in all its
        messages of the round."""
        c, served, measured = msg.sender, batch.served.tolist(), batch.measured.tolist()
        per_pair = self.tau.ndim == 2

        def refuse(problem: str) -> ProtocolError:
            return ProtocolError(
                f"{msg.who} sent embeddings of round {ctx.round} with {problem}; partners not sent "
                f"yet (partner, roles: 1 serve, 2 measure): {sorted(roles.items())[:8]}"
            )

        if len(set(served)) != len(served) or not all(roles.get(p, 0) & SERVE for p in served):
            raise refuse(f"partners served {served[:8]}: one it does not serve or sent already")
        if len(set(measured)) != len(measured) or not all(roles.get(p, 0) & MEASURE for p in measured):
            raise refuse(f"partners measured {measured[:8]}: one it does not measure with or sent already")
        skipped = batch.skipped.tolist()
        if not all(p in told and p in roles for p in skipped):
            raise refuse(f"partners skipped {skipped[:8]}: one it was not told left, or sent already")
        sizes = {cloud.shape[1] for cloud in (batch.own, batch.cross) if len(cloud)}
        if not sizes:  # it only skips
            return
        size = rows.setdefault(c, min(sizes))
        if sizes != {size} or size < 2:
            raise refuse(f"clouds of {sorted(sizes)} rows, expected {size} (one size, at least 2, in all of the round)")
        if not per_pair and len(set(batch.tau.tolist())) > 1:
            raise refuse(f"τ {batch.tau[:8].tolist()} (one for all partners)")
        if not served:
            return
        claim = (batch.noise,) if per_pair else (batch.noise, float(batch.tau[0]))
        if self.stated.setdefault(c, claim) != claim:
            raise refuse(f"noise and τ {claim}, having stated {self.stated[c]} earlier in this round")

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"clusters": self.clusters, "W": self.W, "tau": self.tau, "noise": self.noise, "placed": self.placed}, {
            "extraction": self.extraction
        }

    def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        self.clusters = arrays["clusters"].astype(np.int64)
        for name in ("W", "tau", "noise", "placed"):  # in place: self.artifacts and the plan hold these arrays
            getattr(self, name)[...] = arrays[name]
        self.extraction = meta["extraction"]

    def _distances(self, owns: list[np.ndarray], crosses: list[np.ndarray]) -> np.ndarray:
        return pair_distances(owns, crosses, self.params)

    def _timed_distances(self, owns: list[np.ndarray], crosses: list[np.ndarray]) -> tuple[np.ndarray, float, float]:
        """(the batch's distances, the thread's wall and CPU seconds on them): the server's busy
        time, and how much of it computed (on a node whose cores the silos share, the rest
        waited for a core)."""
        start, cpu = time.monotonic(), time.thread_time()
        return self._distances(owns, crosses), time.monotonic() - start, time.thread_time() - cpu

    def report(self) -> dict:
        """How the clusters were extracted, and what the paper's rule at ε would have said."""
        paper = extract_clusters(self.W, rule="neighbourhoods", epsilon=self.params.epsilon)[0]
        return {
            "extraction": self.extraction,
            "paper_rule": {
                "epsilon": self.params.epsilon,
                "clusters": paper.tolist(),
                "n_clusters": int(paper.max()) + 1,
            },
        }
