"""EMD-CFL's direct measurement (the paper's, Algorithm 1, lines 15-16): each silo sends the
server its projected clouds, Z_{c|c}R where it serves a partner and Z_{c|c'}R where it
measures with one, with τ and its noise; the server forms W[c][c'] = d(Z_{c|c}R, Z_{c'|c}R) − τ
by the run's pair distance (distances.py) as each message completes pairs.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...channel import SERVER, Alternative, Pending, wait_all
from ...wire.messages import Expect, Message, ProtocolError
from ..base import ServerRound, SiloRound, timed
from .classes import MIN_ROWS, matched_rows, to_full_sample
from .distances import PairDistance
from .measurement import Record, Reference, SendReady
from .messages import Embeddings, PartnerLeft, Projected
from .pairs import MEASURE, SERVE, Pair


@dataclass(frozen=True)
class Served:
    """A silo's own cloud for a partner it serves, and where classes are matched, the labels of
    its rows and its validation cloud through the pair's R, with theirs."""

    cloud: np.ndarray
    labels: np.ndarray | None = None
    val: np.ndarray | None = None
    val_labels: np.ndarray | None = None


@dataclass(frozen=True)
class Measured:
    """A silo's cloud under a partner's model, and where classes are matched, its rows' labels."""

    cloud: np.ndarray
    labels: np.ndarray | None = None


@dataclass(frozen=True)
class Direct:
    """The clouds travel to the server, which measures them with `distance`; `dim_r` and
    `max_rows` bound what it accepts. `classes`: the run's number of classes where W compares
    the silos class by class (classes.py; the silos then send each row's label), else None;
    `seed` draws the matched rows."""

    distance: PairDistance
    dim_r: int
    max_rows: int
    classes: int | None = None
    seed: int = 0

    @property
    def silo_modules(self) -> tuple[str, ...]:
        return ()  # the server solves every pair

    def report(
        self,
        ctx: SiloRound,
        projected: Iterator[Projected | SendReady],
        roles: dict[int, int],
        reference: Callable[[], Reference],
        left: set[int],
    ) -> list[Pending]:
        """The pairs' projected clouds to the server (it measures meanwhile): those ready go as
        one message whenever `projected` would wait (SEND_READY), so the server takes a message
        a silo and stage where their ω all arrive together, and gets the early pairs early
        where they do not; the last names the partners (of `roles`) whose pairs it skips
        because they left."""
        pending, ready, sent = [], [], set()
        for item in projected:
            if isinstance(item, Projected):
                ready.append(item)
                sent.add(item.partner)
            elif ready:
                pending.append(ctx.channel.isend(SERVER, Embeddings.batch(ready, self.dim_r), ctx.round))
                ready = []
        skipped = sorted(set(roles) - sent)
        assert set(skipped) <= left, "only a partner that left is skipped"
        if ready or skipped:
            pending.append(ctx.channel.isend(SERVER, Embeddings.batch(ready, self.dim_r, skipped), ctx.round))
        return pending

    def measure(self, ctx: ServerRound, partners: dict[int, list[tuple[int, int]]], record: Record) -> None:
        """Receive every silo's projected embeddings, pair by pair, and fill W (line 16)."""
        todo = {silo: dict(p) for silo, p in partners.items() if p}  # partner → role, not received yet
        # The pairs a message completes are measured at once, in batches on a pool of the
        # server's cores, while later embeddings are still arriving (the assignment solver
        # and BLAS release the GIL); each entry is computed as serially, so W is unchanged.
        solves: list[tuple[list[Pair], Future[tuple[np.ndarray, np.ndarray | None, float, float]]]] = []
        left = {c for c in todo if c not in ctx.participants}  # silos that left in training
        with ThreadPoolExecutor(max_workers=max(1, ctx.cores), thread_name_prefix="w1") as pool:
            try:
                with timed(ctx.step_seconds, "receive"):
                    self._receive_pairs(ctx, todo, left, record, pool, solves)
            except BaseException:  # a bad message ends the round: drop the solves not started
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            with timed(ctx.step_seconds, "w1_after_last_message"):
                for directions, solve in solves:
                    values, taus, seconds, cpu_seconds = solve.result()
                    for k, (c, partner) in enumerate(directions):
                        if c in left or partner in left:  # a pair of a silo that left stays unmeasured
                            continue
                        if taus is None:
                            record.W[c, partner] = values[k] - record.tau[(c, partner) if record.tau.ndim == 2 else c]
                        elif np.isnan(values[k]):  # no class in common: the pair stays unmeasured
                            record.unmatched.add((c, partner))
                        else:
                            record.W[c, partner], record.tau[c, partner] = values[k], taus[k]
                    for step, spent in (("w1_solves", seconds), ("w1_solves_cpu", cpu_seconds)):
                        ctx.step_seconds[step] = ctx.step_seconds.get(step, 0.0) + spent
        ctx.step_seconds["w1_pool_threads"] = max(1, ctx.cores)

    def _receive_pairs(
        self,
        ctx: ServerRound,
        todo: dict[int, dict[int, int]],
        left: set[int],
        record: Record,
        pool: ThreadPoolExecutor,
        solves: list[tuple[list[Pair], Future[tuple[np.ndarray, np.ndarray | None, float, float]]]],
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
        owns: dict[Pair, Served] = {}
        crosses: dict[Pair, Measured] = {}
        per_pair = record.tau.ndim == 2
        rows: dict[int, int] = {}  # each silo's cloud size, the same in all its clouds of the round
        told: dict[int, set[int]] = defaultdict(set)  # the partners each silo was told left
        notices: list[Pending] = []

        def expect(c: int) -> Expect:  # at most a cloud of each role per planned partner
            return Embeddings.expect(
                ctx.round, dim_r=self.dim_r, max_elements=max(1, len(todo[c])) * self.max_rows * self.dim_r
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
            self._check_batch(ctx, msg, todo[c], rows, clouds, told[c], record)
            if c in rows:
                record.rows[c] = rows[c]
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
                record.noise[c] = clouds.noise
            matched = self.classes is not None
            for k, (p, own, tau) in enumerate(zip(served, clouds.own, clouds.tau.tolist())):
                if not matched:  # matched: τ is taken on each pair's matched rows
                    record.tau[(c, p) if per_pair else c] = tau
                if p not in left:
                    labelled = (clouds.own_labels[k], clouds.val[k], clouds.val_labels[k]) if matched else ()
                    owns[(c, p)] = Served(own, *labelled)
            for k, (p, cross) in enumerate(zip(measured, clouds.cross)):
                if p not in left:
                    crosses[(p, c)] = Measured(cross, clouds.cross_labels[k]) if matched else Measured(cross)
            # W[r][c] compares r's data and c's data, both under r's model.
            done = [d for d in [(c, p) for p in served] + [(p, c) for p in measured] if d in owns and d in crosses]
            size = max(1, -(-len(done) // max(1, ctx.cores)))
            for batch in (done[i : i + size] for i in range(0, len(done), size)):
                solves.append(
                    (
                        batch,
                        pool.submit(
                            self._timed_distances,
                            ctx.round,
                            batch,
                            [owns.pop(d) for d in batch],
                            [crosses.pop(d) for d in batch],
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
        record: Record,
    ) -> None:
        """A batch from silo c (well-formed: its declaration) must hold clouds its plan asks
        for (`roles`: partner → roles not received yet), each of one size (at least 2 rows) in
        all its clouds of the round, and skip only partners it was `told` left; where it
        serves, the one noise, and the one τ unless τ is per pair, it states in all its
        messages of the round."""
        c, served, measured = msg.sender, batch.served.tolist(), batch.measured.tolist()
        per_pair = record.tau.ndim == 2

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
        if problem := self._labels_problem(batch):
            raise refuse(problem)
        if not served:
            return
        claim = (batch.noise,) if per_pair else (batch.noise, float(batch.tau[0]))
        if record.stated.setdefault(c, claim) != claim:
            raise refuse(f"noise and τ {claim}, having stated {record.stated[c]} earlier in this round")

    def _labels_problem(self, batch: Embeddings) -> str | None:
        """Labels where classes are matched (one per row: the message checked the shapes), each
        a class of the run, and none where they are not."""
        labels = (batch.own_labels, batch.val_labels, batch.cross_labels)
        if self.classes is None:
            return "labels, where the run does not match classes" if any(a.size for a in labels) else None
        if (len(batch.served) and not batch.own_labels.size) or (len(batch.measured) and not batch.cross_labels.size):
            return "clouds without their rows' labels (the run matches classes)"
        if any(a.size and a.max() >= self.classes for a in labels):
            return f"a label beyond the run's {self.classes} classes"
        if len(batch.served) and not 2 <= batch.val.shape[1] <= self.max_rows:
            return f"validation clouds of {batch.val.shape[1]} rows (2 to {self.max_rows})"
        return None

    def _distances(
        self, round: int, directions: list[Pair], owns: list[Served], crosses: list[Measured]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The batch's W1 (τ not subtracted; None for τ), or where classes are matched, its
        entries W[c][c'] and their τ, both from the pair's matched rows, the entries rescaled to
        the silo's full sample (classes.py); NaN where the pair shares under MIN_ROWS rows."""
        if self.classes is None:
            return self.distance.between([o.cloud for o in owns], [x.cloud for x in crosses]), None
        firsts, seconds, factors = [], [], []
        for (c, partner), own, cross in zip(directions, owns, crosses):
            assert own.labels is not None and own.val is not None and own.val_labels is not None
            assert cross.labels is not None
            rng = np.random.default_rng([self.seed, round, c, partner])
            a, b, v = matched_rows(own.labels, cross.labels, own.val_labels, rng)
            if len(a) < MIN_ROWS:
                factors.append(math.nan)
                continue
            firsts += [own.cloud[a], own.cloud[a]]
            seconds += [cross.cloud[b], own.val[v]]
            factors.append(to_full_sample(len(a), len(own.cloud), len(own.val)))
        measured = iter(self.distance.between(firsts, seconds).tolist() if firsts else [])
        entries, taus = np.full(len(owns), math.nan), np.full(len(owns), math.nan)
        for k, factor in enumerate(factors):
            if not math.isnan(factor):
                w1, tau = next(measured), next(measured)
                entries[k], taus[k] = (w1 - tau) / factor, tau
        return entries, taus

    def _timed_distances(
        self, round: int, directions: list[Pair], owns: list[Served], crosses: list[Measured]
    ) -> tuple[np.ndarray, np.ndarray | None, float, float]:
        """(the batch's distances and τ, the thread's wall and CPU seconds on them): the
        server's busy time, and how much of it computed (on a node whose cores the silos share,
        the rest waited for a core)."""
        start, cpu = time.monotonic(), time.thread_time()
        values, taus = self._distances(round, directions, owns, crosses)
        return values, taus, time.monotonic() - start, time.thread_time() - cpu
