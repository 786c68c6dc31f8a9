"""EMD-CFL's silo half (Zhang, Williams, Toni: Clustered Federated Learning via Embedding
Distributions; Algorithm 1, lines 5-15): for each partner the server's plan names, agree on a
secret projection R (X25519 + HKDF), swap embedding models ω directly, and send the server
the projected embeddings and τ_c. A silo takes its partners' ω in the order they come
(`OmegaSwaps`), so that a late partner holds up only its own pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ...channel import SERVER, Channel, Notice, Pending, wait_all
from ...privacy.handshake import new_private_key, pair_seed, projection_matrix, public_bytes
from ...wire.messages import Expect, Message, ProtocolError
from ..base import RunFacts, SiloProtocol, SiloRound, timed
from . import EmdCflConfig
from .distances import sample_size
from .measurement import SEND_READY, Reference, SendReady
from .messages import Classes, EmbeddingModel, Handshake, PartnerLeft, Plan, Projected
from .pairs import MEASURE, SERVE
from .parts import parts

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

SHARED_PASS_IMAGES = 4096  # the most images of a rank's silos one embedding pass takes (copied while it runs)


def round_key(seeded: bool, seed: int, round: int, silo: int) -> X25519PrivateKey:
    """A silo's X25519 key of a round (one serves all its partners): from the OS, or with
    `pair_keys: seeded` from the run seed, so that anyone holding the config can rebuild it."""
    return new_private_key(f"{seed}|{round}|{silo}".encode() if seeded else None)


def pair_context(seed: int, round: int) -> bytes:
    """What HKDF binds a pair's projection seed to besides the pair: the run and the round."""
    return f"seed={seed}|round={round}".encode()


class PartnerGone(Exception):
    """A partner this silo waits for left the federation (`PartnerLeft`): the wait ends."""


class PartnerWaits:
    """A silo's waits for its partners in a round, which a partner's leaving ends: the server
    tells each partner of a silo that left (`runtime.on_silo_failure: drop`) in a notice
    (`PartnerLeft`, taken whenever the silo waits for the server too: channel/base.py), and
    the silo then skips the pairs with it it has not sent."""

    def __init__(self, channel: Channel, round: int) -> None:
        self.channel, self.round = channel, round
        self.partners: set[int] = set()  # of the round's plans so far
        self.left: set[int] = set()  # those the server said left
        self.awaited: set[int] = set()  # those a wait is on now
        channel.notices[PartnerLeft.KIND.name] = Notice(PartnerLeft.expect(round), self._left)

    def _left(self, msg: Message) -> None:
        silo = PartnerLeft.of(msg).silo
        if silo not in self.partners:
            raise ProtocolError(f"{msg.who} said silo {silo} left in round {self.round}: not a partner of this silo")
        self.left.add(silo)
        if silo in self.awaited:
            raise PartnerGone(silo)

    def first(self, sources: list[int], expect: Expect) -> Message | None:
        """The first message to arrive from any of `sources` the server has not said left;
        None where one of them left meanwhile (or all had)."""
        waiting = [p for p in sources if p not in self.left]
        if not waiting:
            return None
        self.awaited = set(waiting)
        try:  # the server too: its notices come while the partners' messages are awaited
            return self.channel.recv_any([*waiting, SERVER], lambda _: expect)
        except PartnerGone:
            return None
        finally:
            self.awaited = set()

    def each(self, sources: list[int], expect: Expect) -> Iterator[Message]:
        """One message from each of `sources` but those that left, in the order they arrive."""
        pending = list(sources)
        while pending := [p for p in pending if p not in self.left]:
            if (msg := self.first(pending, expect)) is not None:
                pending.remove(msg.sender)
                yield msg


class OmegaSwaps:
    """A silo's ω swaps of a stage: its ω to every partner it serves as one message, which
    travels once per rank and is held there once (`Channel.isend_all`); theirs taken from the
    partners it measures with in the order they arrive, one at a time (none from a partner
    that left). Every send is posted before the first take, so no silo waits on another's
    taking."""

    def __init__(self, waits: PartnerWaits, partners: list[tuple[int, int]], omega: dict[str, np.ndarray]) -> None:
        self.waits, self.channel = waits, waits.channel
        served = [p for p, role in partners if role & SERVE]
        self.sent = self.channel.isend_all(served, EmbeddingModel(omega), waits.round) if served else None
        self.awaiting = [p for p, role in partners if role & MEASURE]  # their ω not taken yet
        self.expect = EmbeddingModel.expect(waits.round, like=omega)

    def ready(self) -> bool:
        """Whether a partner's ω is here for `take`, which then does not wait."""
        return bool(self.awaiting) and self.channel.ready(self.awaiting) is not None

    def take(self) -> tuple[int, dict[str, np.ndarray]] | None:
        """(partner, its ω, read-only) of the first partner measured with whose ω is here; None
        when all are taken (or left) and ours has left."""
        while self.awaiting:
            msg = self.waits.first(self.awaiting, self.expect)
            if msg is not None:
                self.awaiting.remove(msg.sender)
                return msg.sender, EmbeddingModel.of(msg).omega
            self.awaiting = [p for p in self.awaiting if p not in self.waits.left]
        if self.sent is not None:
            self.sent.wait()
        return None


@dataclasses.dataclass
class OwnSample:
    """What a silo measures every pair of a round with: the data its partners' models embed,
    and, once it serves a partner, its `Reference`. A silo that only measures (a one-way
    placing stage's, staged_pairs.py) never needs its own model's embeddings: τ and the noise
    belong to the rows of W it serves, so it skips them (with many silos nearly all do: only
    the sample and the members others are placed by serve)."""

    images: np.ndarray  # the silo's training or validation images ...
    cross_rows: np.ndarray  # ... whose rows partners' models embed (a copy only while they do)
    sample_rows: np.ndarray  # the training rows its own model embeds, Z_{c|c} (copied only if it serves)
    rng: np.random.Generator  # the round's draws after the sample's: the noise's
    embed_as_set: Callable[[Any, np.ndarray], np.ndarray]
    # the labels of the sample's rows, of the cross rows and of the validation sample: what the
    # server matches classes by (classes.py), where it does
    sample_labels: np.ndarray
    cross_labels: np.ndarray
    val_labels: np.ndarray
    reference: Reference | None = None  # once the silo serves


class EmdCflSilo(SiloProtocol[EmdCflConfig]):
    """Silo half: handshake, ω swaps and projected embeddings for each planned partner."""

    steps = ("plan", "embedding", "noise", "handshake", "swap", "send")

    def __init__(self, params: EmdCflConfig, run: RunFacts) -> None:
        super().__init__(params, run)
        self.parts = parts(params, run)
        self.dim_r = self.parts.dim_r
        self.partners: list[tuple[int, int]] = []  # (partner, role) of this round's first plan
        self.more = False  # whether the server sends another plan after it
        self.waits: PartnerWaits | None = None  # the round's

    def modules(self) -> tuple[str, ...]:
        return (
            *self.parts.distance.silo_modules,
            *self.parts.measurement.silo_modules,
            "cryptography.hazmat.backends.openssl",  # X25519's, else at the first key
        )

    def before_training(self, ctx: SiloRound) -> None:
        self.waits = PartnerWaits(ctx.channel, ctx.round)
        with timed(ctx.step_seconds, "plan"):
            self.partners, self.more = self._plan(ctx)

    def after_training(self, ctx: SiloRound) -> None:
        """Measure the planned pairs; with a staged plan the server sends the next stage's
        partners once it has this stage's embeddings, until a plan says that none follow. One
        key, one sample and one noise serve every stage of the round."""
        from ...models.build import state_arrays  # torch: silo side only

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
                    swaps = OmegaSwaps(self._waits(), partners, omega)
                own = own or self._own_sample(ctx)
                with timed(ctx.step_seconds, "handshake"):
                    seeds = self._pair_seeds(ctx, names, key)
                roles = dict(partners)
                projected = self._project(ctx, swaps, seeds, own, roles)
                reference = partial(self._reference, ctx, own)
                in_flight += self.parts.measurement.report(ctx, projected, roles, reference, self._waits().left)
            following = None
            if more:
                with timed(ctx.step_seconds, "plan"):
                    following = self._plan(ctx)
            # The stage's sends are waited for once the next plan is here: the server plans from
            # the stage's embeddings, so they have left, and the wait polls MPI once (the inbox
            # moves them meanwhile). Waiting at once, each silo would poll its embeddings until
            # the server takes them (docs/research/PERFORMANCE.md, "A stage's sends").
            with timed(ctx.step_seconds, "send"):
                wait_all(in_flight)
            if following is None:
                return
            partners, more = following

    def _own_sample(self, ctx: SiloRound) -> OwnSample:
        """The round's sample (n = sample_size) and the images partners' models embed."""
        from ...training.local import EVAL_BATCH, embed  # torch: silo side only

        s = self.params
        rng = np.random.default_rng([self.run.seed, 11, ctx.silo, ctx.round])
        d = ctx.data
        n = sample_size(s.sample_fraction, s.max_rows, len(d.y_train), len(d.y_val))
        n = n if s.partner_sample == "train" else min(n, len(d.y_val))
        rows = np.sort(rng.choice(len(d.y_train), n, replace=False))
        images, labels, cross_rows = (
            (d.x_train, d.y_train, rows)
            if s.partner_sample == "train"
            else (d.x_val, d.y_val, np.sort(rng.choice(len(d.y_val), n, False)))
        )
        embed_as_set = partial(
            embed,
            device=ctx.device,
            train_mode=s.embed_mode == "train",
            batch=self.run.local_work.batch_size if s.embed_mode == "train" else EVAL_BATCH,
        )
        return OwnSample(
            images,
            cross_rows,
            rows,
            rng,
            embed_as_set,
            d.y_train[rows],
            labels[cross_rows],
            d.y_val[: self.params.max_rows],
        )

    def _reference(self, ctx: SiloRound, own: OwnSample) -> Reference:
        """The sample embedded by the silo's model, τ_c and the noise: once a round, when the
        silo first serves a partner."""
        if own.reference is None:
            with timed(ctx.step_seconds, "embedding"):
                z_own = ctx.compute(own.embed_as_set, ctx.model.embedding, ctx.data.x_train[own.sample_rows])
                z_val = ctx.compute(own.embed_as_set, ctx.model.embedding, ctx.data.x_val[: self.params.max_rows])
            with timed(ctx.step_seconds, "noise"):
                own.reference = Reference(
                    z_own, z_val, *self.parts.distance.reference(z_own, z_val, self.dim_r, own.rng)
                )
        return own.reference

    def _waits(self) -> PartnerWaits:
        assert self.waits is not None, "before_training starts the round's waits"
        return self.waits

    def _plan(self, ctx: SiloRound) -> tuple[list[tuple[int, int]], bool]:
        """The (partner, role) the server asks this silo to measure with, in tournament order,
        and whether another plan follows in this round."""
        msg = ctx.channel.recv(SERVER, Plan.expect(ctx.round))
        plan = Plan.of(msg)
        partners, roles = plan.partners.tolist(), plan.roles.tolist()
        if not all(0 <= p < ctx.silos and p != ctx.silo for p in partners):
            raise ProtocolError(
                f"{msg.who} sent an invalid plan {partners} (roles {roles}) to silo {ctx.silo} in round {ctx.round}"
            )
        self._waits().partners.update(partners)
        return list(zip(partners, roles)), bool(plan.more)

    def _round_key(self, ctx: SiloRound) -> X25519PrivateKey:
        return round_key(self.params.pair_keys == "seeded", self.run.seed, ctx.round, ctx.silo)

    def _offer_key(self, ctx: SiloRound, partners: list[int], key: X25519PrivateKey) -> Pending:
        """The key's public half on its way to every partner (directly; once per rank)."""
        return ctx.channel.isend_all(partners, Handshake(public_bytes(key)), ctx.round)

    def _pair_seeds(self, ctx: SiloRound, partners: list[int], key: X25519PrivateKey) -> dict[int, bytes]:
        """Each pair's projection seed: the partner's public key, then X25519 and HKDF (none with
        a partner that left before its key came)."""
        peer_keys = {
            msg.sender: Handshake.of(msg).public_key
            for msg in self._waits().each(partners, Handshake.expect(ctx.round))
        }
        context = pair_context(self.run.seed, ctx.round)
        return {p: pair_seed(key, public, ctx.silo, p, context) for p, public in sorted(peer_keys.items())}

    def _project(
        self, ctx: SiloRound, swaps: OmegaSwaps, seeds: dict[int, bytes], own: OwnSample, roles: dict[int, int]
    ) -> Iterator[Projected | SendReady]:
        """The clouds of every partner c', both projected by the pair's R, and SEND_READY before
        each wait for a partner's ω (what is ready can go meanwhile): Z_{c|c}R where this silo
        serves c' (at once where it only serves), Z_{c|c'}R — own data (`own.cross_rows`: of
        the training or the validation sample) embedded with c''s model in the mode and batches
        of z_own — where it measures, as c''s ω arrives. τ the silo's, or the pair's own through
        R (`tau_projection: pair`), and the silo's noise; both 0 where it only measures: they
        belong to W[c][c']."""
        from ...models.build import load_arrays, scratch_copy

        dim_z, dim_r = self.run.embedding_dim, self.dim_r

        def projected(p: int, z_cross: np.ndarray | None) -> Projected:
            r = projection_matrix(seeds[p], dim_z, dim_r, self.params.projection)
            zr_cross = None if z_cross is None else z_cross @ r
            cross_labels = None if z_cross is None else own.cross_labels
            if not roles[p] & SERVE:
                classes = Classes(None, None, None, cross_labels) if self.parts.classes else None
                return Projected(p, None, zr_cross, classes=classes)
            reference = self._reference(ctx, own)
            zr_own = reference.z_own @ r
            if self.parts.classes:  # the server takes τ on the pair's matched rows
                classes = Classes(own.sample_labels, reference.z_val @ r, own.val_labels, cross_labels)
                return Projected(p, zr_own, zr_cross, 0.0, reference.noise, classes)
            tau = reference.tau
            if tau is None:  # τ per pair
                tau = self.parts.distance.pair_reference(zr_own, reference.z_val, r)
            return Projected(p, zr_own, zr_cross, tau, reference.noise)

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

        for p in [p for p, role in roles.items() if role == SERVE and p in seeds]:
            yield projected(p, None)
        while True:
            if not swaps.ready():
                yield SEND_READY
            with timed(ctx.step_seconds, "swap"):
                swapped = swaps.take()
            if swapped is None:
                return
            p, theirs = swapped
            with timed(ctx.step_seconds, "embedding"):
                # Z_{c|c'}: own data, partner's model
                z_cross = ctx.compute.batched(
                    ("embed_under", id(next(iter(theirs.values())))),
                    embed_under,
                    (theirs, own.images, own.cross_rows),
                    limit,
                )
            del theirs, swapped
            yield projected(p, z_cross)
