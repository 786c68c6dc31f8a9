"""EMD-CFL (Zhang, Williams, Toni: Clustered Federated Learning via Embedding Distributions; Algorithm 1).

One-shot clustering after the first round of local training: every pair of silos (c, c')
not yet measured agrees on a secret projection R (X25519 + HKDF), swaps embedding models
ω directly, and sends the server its own projected embeddings under both models plus τ_c.
The server forms W[c][c'] = W1(Z_{c|c}R, Z_{c'|c}R) − τ_c (line 16) and extracts clusters.
With `distance: fedwad` the projected embeddings stay on the silos and the server gets each
W1 by FedWaD instead (fedwad.py).

The round is planned before training, so that a silo starts its handshakes and ω swaps as
soon as it has trained rather than when the slowest silo has; and a silo takes its partners'
ω in the order they come (`OmegaSwaps`), so that a late partner holds up only its own pair.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from ...channel import SERVER, Channel, Pending, wait_all
from ...clustering.extraction import extract_clusters
from ...privacy.handshake import PUBLIC_KEY_BYTES, new_private_key, pair_seed, projection_matrix, public_bytes
from ...wire.messages import ArraySpec, Expect, Message, ProtocolError, message_kind
from ..base import Halves, RunFacts, ServerRound, SiloProtocol, SiloRound, Strategy, timed
from ..fedwad.exchange import FEDWAD_KINDS
from .distances import pair_distances, pair_reference, reference_distance, solver_modules
from .pairs import MEASURE, SERVE, Pair, partner_roles
from .plans import pair_plan
from . import EmdCflConfig, fedwad

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

# (c', Z_{c|c}R or None, Z_{c|c'}R or None, τ, noise): a silo's projected clouds for partner c'
Projected = tuple[int, np.ndarray | None, np.ndarray | None, float, float]
SHARED_PASS_IMAGES = 4096  # the most images of a rank's silos one embedding pass takes (copied while it runs)
PLAN = message_kind("plan")                        # server → silo: the partners to measure, and its roles
HANDSHAKE = message_kind("handshake")              # silo ↔ silo: X25519 public key
EMBEDDING_MODEL = message_kind("embedding_model")  # silo ↔ silo: the embedding part ω of a silo's model
EMBEDDINGS = message_kind("embeddings")            # silo → server: a batch of pairs' Z_{c|c}R, Z_{c|c'}R, τ, noise
KINDS = (PLAN, HANDSHAKE, EMBEDDING_MODEL, EMBEDDINGS, fedwad.REFERENCE, *FEDWAD_KINDS)


def projected_dim(s: EmdCflConfig, embedding_dim: int) -> int:
    """dim(R) = ⌊proj_ratio · dim(Z)⌋ (proj_ratio 0.9 in the paper and the authors' code)."""
    return int(s.proj_ratio * embedding_dim)


def sample_size(s: EmdCflConfig, n_train: int) -> int:
    """n = min(10 % of the silo's training data, 512) (the paper's §3, complexity paragraph)."""
    return max(2, min(math.ceil(s.sample_fraction * n_train), s.max_rows, n_train))


def round_key(s: EmdCflConfig, seed: int, round: int, silo: int) -> X25519PrivateKey:
    """A silo's X25519 key of a round (one serves all its partners): from the OS, or with
    `pair_keys: seeded` from the run seed, so that anyone holding the config can rebuild it."""
    return new_private_key(f"{seed}|{round}|{silo}".encode() if s.pair_keys == "seeded" else None)


def pair_context(seed: int, round: int) -> bytes:
    """What HKDF binds a pair's projection seed to besides the pair: the run and the round."""
    return f"seed={seed}|round={round}".encode()


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
        message (`isend_all`: once per rank): at C = 2,400 most plans of a stage are the same
        (no partners, or the same representatives)."""
        self.partners = partner_roles(silos, directions)
        alike: dict[tuple[tuple[int, int], ...], list[int]] = defaultdict(list)
        for silo in silos:
            alike[tuple(self.partners[silo])].append(silo)
        wait_all([ctx.channel.isend_all(group, PLAN, ctx.round,
                                        {"partners": np.asarray([p for p, _ in plan], dtype=np.int64),
                                         "roles": np.asarray([r for _, r in plan], dtype=np.uint8)}, more=int(more))
                  for plan, group in alike.items()])

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
                    raise ProtocolError(f"{ctx.channel.describe(c)} sent {fedwad.REFERENCE.name} of round "
                                        f"{ctx.round} with noise and τ {claim}; it stated {self.stated[c]} "
                                        "earlier in this round")
            return
        todo = {silo: dict(p) for silo, p in partners.items() if p}  # partner → role, not received yet
        dim_r = self.dim_r
        # The pairs a message completes are measured at once, in batches on a pool of the
        # server's cores, while later embeddings are still arriving (the assignment solver
        # and BLAS release the GIL); each entry is computed as serially, so W is unchanged.
        solves: list[tuple[list[Pair], Future[tuple[np.ndarray, float, float]]]] = []
        with ThreadPoolExecutor(max_workers=max(1, ctx.cores), thread_name_prefix="w1") as pool:
            try:
                with timed(ctx.step_seconds, "receive"):
                    self._receive_pairs(ctx, todo, dim_r, pool, solves)
            except BaseException:  # a bad message ends the round: drop the solves not started
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            with timed(ctx.step_seconds, "w1_after_last_message"):
                for directions, solve in solves:
                    values, seconds, cpu_seconds = solve.result()
                    for (c, partner), value in zip(directions, values.tolist()):
                        self.W[c, partner] = value - self.tau[(c, partner) if self.tau.ndim == 2 else c]
                    for step, spent in (("w1_solves", seconds), ("w1_solves_cpu", cpu_seconds)):
                        ctx.step_seconds[step] = ctx.step_seconds.get(step, 0.0) + spent
        ctx.step_seconds["w1_pool_threads"] = max(1, ctx.cores)

    def _receive_pairs(self, ctx: ServerRound, todo: dict[int, dict[int, int]], dim_r: int,
                       pool: ThreadPoolExecutor,
                       solves: list[tuple[list[Pair], Future[tuple[np.ndarray, float, float]]]]) -> None:
        """Receive the embeddings of every pair in `todo` (partner → the roles not received
        yet), record τ and noise, start the solves of the pairs each message completes, in
        as many batches as the pool has threads. A silo's message carries a batch: its own
        cloud for partners it serves (`served`, `own`, `tau`) and its cross cloud for partners
        it measures with (`measured`, `cross`), as its plan gave it the roles; a silo sends what
        is ready whenever it would otherwise wait (at C = 2,400: one message a silo and stage,
        not one a pair, for the server to take)."""
        # by direction (r, c): r's own cloud Z_{r|r}R, and c's cloud under r's model Z_{c|r}R
        owns: dict[Pair, np.ndarray] = {}
        crosses: dict[Pair, np.ndarray] = {}
        per_pair = self.tau.ndim == 2
        rows: dict[int, int] = {}  # each silo's cloud size, the same in all its clouds of the round

        specs = (ArraySpec("served", "int64", (None,)), ArraySpec("own", "float32", (None, None, dim_r)),
                 ArraySpec("tau", "float64", (None,)), ArraySpec("measured", "int64", (None,)),
                 ArraySpec("cross", "float32", (None, None, dim_r)))

        def expect(c: int) -> Expect:  # at most a cloud of each role per planned partner
            return Expect(EMBEDDINGS, ctx.round, specs, {"noise": float},
                          max_elements=max(1, len(todo[c])) * self.params.max_rows * dim_r,
                          bounds={"noise": (0.0, math.inf)})

        while todo:
            msg = ctx.channel.recv_any(list(todo), expect)
            c, a, noise = msg.sender, msg.arrays, msg.meta["noise"]
            served, measured = a["served"].tolist(), a["measured"].tolist()
            self._check_batch(ctx, msg, todo[c], rows, served, measured, noise)
            for p in served:
                todo[c][p] &= ~SERVE
            for p in measured:
                todo[c][p] &= ~MEASURE
            todo[c] = {p: role for p, role in todo[c].items() if role}
            if not todo[c]:
                del todo[c]
            if served:  # τ and the noise belong to the rows W[c][·] it serves
                self.noise[c] = noise
            for p, own, tau in zip(served, a["own"], a["tau"].tolist()):
                self.tau[(c, p) if per_pair else c] = tau
                owns[(c, p)] = own
            for p, cross in zip(measured, a["cross"]):
                crosses[(p, c)] = cross
            # W[r][c] compares r's data and c's data, both under r's model.
            done = [d for d in [(c, p) for p in served] + [(p, c) for p in measured] if d in owns and d in crosses]
            size = max(1, -(-len(done) // max(1, ctx.cores)))
            for batch in (done[i:i + size] for i in range(0, len(done), size)):
                solves.append((batch, pool.submit(self._timed_distances, [owns.pop(d) for d in batch],
                                                  [crosses.pop(d) for d in batch])))

    def _check_batch(self, ctx: ServerRound, msg: Message, roles: dict[int, int], rows: dict[int, int],
                     served: list[int], measured: list[int], noise: float) -> None:
        """A batch from silo c must hold clouds its plan asks for (`roles`: partner → roles not
        received yet), each of one size (at least 2 rows) in all its clouds of the round; where
        it serves, the one noise, and the one τ unless τ is per pair, it states in all its
        messages of the round; where it serves no partner in the batch, noise 0."""
        c, own, cross, tau = msg.sender, msg.arrays["own"], msg.arrays["cross"], msg.arrays["tau"]
        per_pair = self.tau.ndim == 2

        def refuse(problem: str) -> ProtocolError:
            return ProtocolError(f"{msg.who} sent embeddings of round {ctx.round} with {problem}; partners not sent "
                                 f"yet (partner, roles: 1 serve, 2 measure): {sorted(roles.items())[:8]}")

        if len(own) != len(served) or len(tau) != len(served) or len(cross) != len(measured) \
                or not (served or measured):
            raise refuse(f"{len(own)} own clouds and {len(tau)} τ for {len(served)} partners served, "
                         f"{len(cross)} cross clouds for {len(measured)} measured (at least one cloud)")
        if len(set(served)) != len(served) or not all(roles.get(p, 0) & SERVE for p in served):
            raise refuse(f"partners served {served[:8]}: one it does not serve or sent already")
        if len(set(measured)) != len(measured) or not all(roles.get(p, 0) & MEASURE for p in measured):
            raise refuse(f"partners measured {measured[:8]}: one it does not measure with or sent already")
        sizes = {cloud.shape[1] for cloud in (own, cross) if len(cloud)}
        size = rows.setdefault(c, min(sizes))
        if sizes != {size} or size < 2:
            raise refuse(f"clouds of {sorted(sizes)} rows, expected {size} (one size, at least 2, in all of the round)")
        if (tau < 0).any() or (not per_pair and len(set(tau.tolist())) > 1):
            raise refuse(f"τ {tau[:8].tolist()} (at least 0{'' if per_pair else ', one for all partners'})")
        if not served:
            if noise != 0.0:
                raise refuse(f"noise {noise} where it serves no partner (0: the noise belongs to the rows it serves)")
            return
        claim = (noise,) if per_pair else (noise, float(tau[0]))
        if self.stated.setdefault(c, claim) != claim:
            raise refuse(f"noise and τ {claim}, having stated {self.stated[c]} earlier in this round")

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"clusters": self.clusters, "W": self.W, "tau": self.tau, "noise": self.noise,
                "placed": self.placed}, \
            {"extraction": self.extraction}

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
        return {"extraction": self.extraction,
                "paper_rule": {"epsilon": self.params.epsilon, "clusters": paper.tolist(),
                               "n_clusters": int(paper.max()) + 1}}


class OmegaSwaps:
    """A silo's ω swaps of a stage: its ω to every partner it serves as one message, which
    travels once per rank and is held there once (`Channel.isend_all`); theirs taken from the
    partners it measures with in the order they arrive, one at a time. Every send is posted
    before the first take, so no silo waits on another's taking."""

    def __init__(self, channel: Channel, round: int, partners: list[tuple[int, int]],
                 omega: dict[str, np.ndarray]) -> None:
        self.channel, self.round = channel, round
        served = [p for p, role in partners if role & SERVE]
        self.sent = channel.isend_all(served, EMBEDDING_MODEL, round, omega) if served else None
        self.awaiting = [p for p, role in partners if role & MEASURE]  # their ω not taken yet
        self.expect = Expect.like(EMBEDDING_MODEL, round, omega)

    def here(self) -> bool:
        """Whether a partner's ω is here for `take`, which then does not wait."""
        return bool(self.awaiting) and self.channel.ready(self.awaiting) is not None

    def take(self) -> tuple[int, dict[str, np.ndarray]] | None:
        """(partner, its ω, read-only) of the first partner measured with whose ω is here; None
        when all are taken and ours has left."""
        if not self.awaiting:
            if self.sent is not None:
                self.sent.wait()
            return None
        msg = self.channel.recv_any(self.awaiting, lambda _: self.expect)
        self.awaiting.remove(msg.sender)
        return msg.sender, msg.arrays


@dataclasses.dataclass
class Reference:
    """A silo's side of the rows W[c][·] it serves: its sample embedded by its own model, its
    reference and its noise (the unit row c is cut in)."""

    z_own: np.ndarray       # Z_{c|c}
    z_val: np.ndarray       # Z^val_{c|c}
    tau: float | None       # τ_c, or None when it is taken per pair (`tau_projection: pair`)
    noise: float


@dataclasses.dataclass
class OwnSample:
    """What a silo measures every pair of a round with: the data its partners' models embed,
    and, once it serves a partner, its `Reference`. A silo that only measures (a one-way
    placing stage's, staged_pairs.py) never needs its own model's embeddings: τ and the noise
    belong to the rows of W it serves, so it skips them (at C = 2,400 that is all but ~50
    silos)."""

    images: np.ndarray      # the silo's training or validation images ...
    cross_rows: np.ndarray  # ... whose rows partners' models embed (a copy only while they do)
    sample_rows: np.ndarray  # the training rows its own model embeds, Z_{c|c} (copied only if it serves)
    rng: np.random.Generator  # the round's draws after the sample's: the noise's
    embed_as_set: Callable[[Any, np.ndarray], np.ndarray]
    reference: Reference | None = None  # once the silo serves


class EmdCflSilo(SiloProtocol[EmdCflConfig]):
    """Silo half: handshake, ω swaps and projected embeddings for each planned partner."""

    steps = ("plan", "embedding", "noise", "handshake", "swap", "send")

    def __init__(self, params: EmdCflConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.dim_r = projected_dim(params, run.embedding_dim)
        self.partners: list[tuple[int, int]] = []  # (partner, role) of this round's first plan
        self.more = False                          # whether the server sends another plan after it

    def modules(self) -> tuple[str, ...]:
        return (*solver_modules(self.params), "cryptography.hazmat.backends.openssl")  # X25519's, else at the 1st key

    def before_training(self, ctx: SiloRound) -> None:
        with timed(ctx.step_seconds, "plan"):
            self.partners, self.more = self._plan(ctx)

    def after_training(self, ctx: SiloRound) -> None:
        """Measure the planned pairs; with a staged plan the server sends the next stage's
        partners once it has this stage's embeddings, until a plan says that none follow. One
        key, one sample and one noise serve every stage of the round."""
        from ...models import state_arrays  # torch: silo side only

        partners, more = self.partners, self.more
        key, omega, own = None, None, None
        while True:
            in_flight: list[Pending] = []
            if partners:
                # the key and ω go out first, so that partners can go on while this silo embeds
                names = [p for p, _ in partners]
                with timed(ctx.step_seconds, "handshake"):
                    key = key or self._round_key(ctx)
                    in_flight.append(self._offer_key(ctx, names, key))
                with timed(ctx.step_seconds, "swap"):
                    omega = omega or state_arrays(ctx.model.embedding)
                    swaps = OmegaSwaps(ctx.channel, ctx.round, partners, omega)
                own = own or self._own_sample(ctx)
                with timed(ctx.step_seconds, "handshake"):
                    seeds = self._pair_seeds(ctx, names, key)
                in_flight += self._report(ctx, own, self._project(ctx, swaps, seeds, own, dict(partners)))
            following = None
            if more:
                with timed(ctx.step_seconds, "plan"):
                    following = self._plan(ctx)
            # The stage's sends are waited for once the next plan is here: the server plans from
            # the stage's embeddings, so they have left, and the wait polls MPI once (the inbox
            # moves them meanwhile). Waiting at once, each silo polled its embeddings until the
            # server took them (~12 times at C = 2,400: benchmarks/wire.py part 5).
            with timed(ctx.step_seconds, "send"):
                wait_all(in_flight)
            if following is None:
                return
            partners, more = following

    def _own_sample(self, ctx: SiloRound) -> OwnSample:
        """The round's sample (n = sample_size) and the images partners' models embed."""
        from ...training import EVAL_BATCH, embed  # torch: silo side only

        s = self.params
        rng = np.random.default_rng([self.run.seed, 11, ctx.silo, ctx.round])
        d = ctx.data
        n = sample_size(s, len(d.y_train)) if s.partner_sample == "train" else \
            min(sample_size(s, len(d.y_train)), len(d.y_val))
        rows = np.sort(rng.choice(len(d.y_train), n, replace=False))
        images, cross_rows = (d.x_train, rows) if s.partner_sample == "train" else \
            (d.x_val, np.sort(rng.choice(len(d.y_val), n, False)))
        embed_as_set = partial(embed, device=ctx.device, train_mode=s.embed_mode == "train",
                               batch=self.run.batch_size if s.embed_mode == "train" else EVAL_BATCH)
        return OwnSample(images, cross_rows, rows, rng, embed_as_set)

    def _reference(self, ctx: SiloRound, own: OwnSample) -> Reference:
        """The sample embedded by the silo's model, τ_c and the noise: once a round, when the
        silo first serves a partner."""
        if own.reference is None:
            with timed(ctx.step_seconds, "embedding"):
                z_own = ctx.compute(own.embed_as_set, ctx.model.embedding, ctx.data.x_train[own.sample_rows])
                z_val = ctx.compute(own.embed_as_set, ctx.model.embedding, ctx.data.x_val[: self.params.max_rows])
            with timed(ctx.step_seconds, "noise"):
                own.reference = Reference(z_own, z_val, *reference_distance(z_own, z_val, self.dim_r, self.params,
                                                                             own.rng))
        return own.reference

    def _report(self, ctx: SiloRound, own: OwnSample, projected: Iterator[Projected | None]) -> list[Pending]:
        """The pairs' projected embeddings to the server (it measures meanwhile): those ready
        go as one message whenever `projected` would wait (None), so the server takes a message
        a silo and stage where their ω all arrive together, and gets the early pairs early where
        they do not; the sends, still in flight. In FedWaD mode they stay here and the server
        gets W1 by FedWaD (from every silo with partners: its τ and noise)."""
        if self.params.distance == "fedwad":  # τ: one per silo
            reference = self._reference(ctx, own)
            zr_own, zr_cross = {}, {}
            for p, a, b, _, _ in filter(None, projected):
                if a is not None:
                    zr_own[p] = a
                if b is not None:
                    zr_cross[p] = b
            fedwad.serve_pairs(ctx, self.params, self.run.seed, zr_own, zr_cross, reference.tau, reference.noise)
            return []
        pending, ready = [], []
        for item in chain(projected, [None]):
            if item is not None:
                ready.append(item)
            elif ready:
                arrays, noise = self._batch(ready)
                pending.append(ctx.channel.isend(SERVER, EMBEDDINGS, ctx.round, arrays, noise=noise))
                ready = []
        return pending

    def _batch(self, ready: list[Projected]) -> tuple[dict[str, np.ndarray], float]:
        """The arrays and noise of one embeddings message: own clouds (and τ) for the partners
        served, cross clouds for those measured with; the noise where it serves, else 0."""
        served = [(p, a, tau) for p, a, _, tau, _ in ready if a is not None]
        measured = [(p, b) for p, _, b, _, _ in ready if b is not None]

        def clouds(arrays: list[np.ndarray]) -> np.ndarray:
            return np.stack(arrays) if arrays else np.zeros((0, 0, self.dim_r), dtype=np.float32)

        arrays = {"served": np.asarray([p for p, _, _ in served], dtype=np.int64),
                  "own": clouds([a for _, a, _ in served]),
                  "tau": np.asarray([tau for _, _, tau in served], dtype=np.float64),
                  "measured": np.asarray([p for p, _ in measured], dtype=np.int64),
                  "cross": clouds([b for _, b in measured])}
        return arrays, next((noise for _, a, _, _, noise in ready if a is not None), 0.0)

    def _plan(self, ctx: SiloRound) -> tuple[list[tuple[int, int]], bool]:
        """The (partner, role) the server asks this silo to measure with, in tournament order,
        and whether another plan follows in this round."""
        plan = ctx.channel.recv(SERVER, Expect(PLAN, ctx.round, (ArraySpec("partners", "int64", (None,)),
                                                                 ArraySpec("roles", "uint8", (None,))),
                                               {"more": int}, bounds={"more": (0, 1)}))
        partners = [int(p) for p in plan.arrays["partners"]]
        roles = [int(r) for r in plan.arrays["roles"]]
        if len(set(partners)) != len(partners) or len(roles) != len(partners) \
                or not all(0 <= p < ctx.silos and p != ctx.silo for p in partners) \
                or not all(r in (SERVE, MEASURE, SERVE | MEASURE) for r in roles):
            raise ProtocolError(f"{plan.who} sent an invalid plan {partners} (roles {roles}) to silo {ctx.silo} "
                                f"in round {ctx.round}")
        return list(zip(partners, roles)), bool(plan.meta["more"])

    def _round_key(self, ctx: SiloRound) -> X25519PrivateKey:
        return round_key(self.params, self.run.seed, ctx.round, ctx.silo)

    def _offer_key(self, ctx: SiloRound, partners: list[int], key: X25519PrivateKey) -> Pending:
        """The key's public half on its way to every partner (directly; once per rank)."""
        return ctx.channel.isend_all(partners, HANDSHAKE, ctx.round, {"public_key": public_bytes(key)})

    def _pair_seeds(self, ctx: SiloRound, partners: list[int], key: X25519PrivateKey) -> dict[int, bytes]:
        """Each pair's projection seed: the partner's public key, then X25519 and HKDF."""
        key_spec = Expect(HANDSHAKE, ctx.round, (ArraySpec("public_key", "uint8", (PUBLIC_KEY_BYTES,)),))
        peer_keys = {p: ctx.channel.recv(p, key_spec).arrays["public_key"] for p in partners}
        context = pair_context(self.run.seed, ctx.round)
        return {p: pair_seed(key, peer_keys[p], ctx.silo, p, context) for p in partners}

    def _project(self, ctx: SiloRound, swaps: OmegaSwaps, seeds: dict[int, bytes], own: OwnSample,
                 roles: dict[int, int]) -> Iterator[Projected | None]:
        """(c', Z_{c|c}R, Z_{c|c'}R, τ, noise) for every partner c', both projected by the pair's R,
        and None before each wait for a partner's ω (what is ready can go meanwhile):
        Z_{c|c}R where this silo serves c' (at once where it only serves), Z_{c|c'}R — own
        data (`own.cross_rows`: of the training or the validation sample) embedded with c''s model in
        the mode and batches of z_own — where it measures, as c''s ω arrives; None for the
        other. τ the silo's, or the pair's own through R (`tau_projection: pair`), and the
        silo's noise; both 0 where it only measures: they belong to W[c][c'])."""
        from ...models import load_arrays, scratch_copy

        dim_z, dim_r = self.run.embedding_dim, self.dim_r

        def projected(p: int, z_cross: np.ndarray | None) -> Projected:
            r = projection_matrix(seeds[p], dim_z, dim_r, self.params.projection)
            zr_cross = None if z_cross is None else z_cross @ r
            if not roles[p] & SERVE:
                return p, None, zr_cross, 0.0, 0.0
            reference = self._reference(ctx, own)
            zr_own = reference.z_own @ r
            tau = reference.tau if reference.tau is not None else pair_reference(zr_own, reference.z_val, r,
                                                                                 self.params)
            return p, zr_own, zr_cross, tau, reference.noise

        def embed_under(items: list[tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]]) -> list[np.ndarray]:
            """Each silo's data (`images[rows]`) embedded by a model holding the partner's ω that
            they share: the compute worker's own scratch copy, so there are as many in the
            process as workers, not one per silo; in eval mode, one pass for them all (each
            image's embedding is its own: the same values as a pass per silo)."""
            borrowed = scratch_copy(ctx.model.embedding)
            load_arrays(borrowed, items[0][0])
            x = [images[rows] for _, images, rows in items]
            return np.split(own.embed_as_set(borrowed, np.concatenate(x)), np.cumsum([len(a) for a in x])[:-1])

        # silos of this process that embed under the same ω (shared, read-only) share a pass;
        # in train mode BatchNorm normalises by the batch, so each silo has a pass of its own
        shared = self.params.embed_mode == "eval"
        limit = max(1, SHARED_PASS_IMAGES // max(1, len(own.cross_rows))) if shared else 1

        for p in [p for p, role in roles.items() if role == SERVE]:
            yield projected(p, None)
        while True:
            if not swaps.here():
                yield None
            with timed(ctx.step_seconds, "swap"):
                swapped = swaps.take()
            if swapped is None:
                return
            p, theirs = swapped
            with timed(ctx.step_seconds, "embedding"):
                # Z_{c|c'}: own data, partner's model
                z_cross = ctx.compute.batched(("embed_under", id(next(iter(theirs.values())))), embed_under,
                                              (theirs, own.images, own.cross_rows), limit)
            del theirs, swapped
            yield projected(p, z_cross)


HALVES = Halves(EmdCfl, EmdCflSilo, KINDS)
