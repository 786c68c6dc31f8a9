"""Secure aggregation's round (`aggregation.secure`): both parties' steps. The masks' arithmetic
is privacy/masking.py's, the key shares' privacy/key_shares.py's, the sums
aggregation/masked_sums.py's.

Once the round's clusters are known (after the strategy's clustering exchanges, which a
secure silo therefore finishes before its update), the round runs the semi-honest protocol of
Bonawitz et al. (CCS 2017, Section 4) over SecAgg+'s graph (Bell et al., CCS 2020), every
message through the server:

1. each training silo sends a fresh X25519 public key (`MaskKey`);
2. the server draws a Harary graph over each cluster's silos that sent one and sends each its
   neighbours with their keys (`SecureSetup`);
3. each silo splits its private key into shares, one sealed for each neighbour
   (`KeyShares`), which the server forwards (`ForwardedShares`);
4. each silo masks its update with every neighbour that dealt it a share (`MaskedUpdate`,
   with a digest of each share it holds);
5. for a silo that left after dealing its shares and before its masked update, the server
   asks its neighbours for their shares (`UnmaskRequest`, `RevealedShares`), checks each
   against its holder's digest, rebuilds the key, and takes that silo's masks out of its
   neighbours' words.

A silo that leaves (`runtime.on_silo_failure: drop`) in place of any of its messages is left
out from there on. The server never rebuilds the key of a silo whose masked update it holds;
a server that did could read that update (the papers' double masking, which prevents it, is
not built: the server is trusted to follow the protocol)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ..aggregation.masked_sums import MaskedSums, noised_words, weighted_words, word_count
from ..aggregation.rules import AggregationConfig, Model, clip_update
from ..channel import SERVER, Alternative, Channel, Pending, wait_all
from ..privacy.dp import PrivacyConfig
from ..privacy.handshake import new_private_key, pair_seed, public_bytes
from ..privacy.key_shares import SEALED_BYTES, SHARE_BYTES, combine, commitment, seal, split, threshold_for, unseal
from ..privacy.masking import encode, mask, masked, neighbour_count, neighbours
from ..wire.messages import Expect, Message, ProtocolError
from ..wire.secure import (
    DIGEST_BYTES,
    ForwardedShares,
    KeyShares,
    MaskedUpdate,
    MaskKey,
    RevealedShares,
    SecureSetup,
    UnmaskRequest,
)

# What the graph's draw mixes into the run seed, so that it shares no stream with other draws.
GRAPH_STREAM = 0x5347
Refused = Callable[[int, ProtocolError], None]


def mask_context(seed: int, round: int, cluster: int) -> bytes:
    """What HKDF binds a pair's secrets to besides the pair."""
    return f"seed={seed}|round={round}|cluster={cluster}".encode()


def share_context(context: bytes, dealer: int, holder: int) -> bytes:
    """What a sealed share and its digest are bound to: the round's context and the pair."""
    return context + f"|share {dealer}->{holder}".encode()


def pair_secrets(
    key: X25519PrivateKey, public: np.ndarray, own: int, other: int, context: bytes
) -> tuple[bytes, bytes]:
    """The pair's mask secret and its sealing key (HKDF of one X25519 exchange, two purposes);
    ValueError where `public` is no key to agree with (RFC 7748, section 6.1)."""
    return pair_seed(key, public, own, other, context, "mask"), pair_seed(key, public, own, other, context, "share")


@dataclass
class ClusterRound:
    """What the server holds of one cluster's secure round."""

    context: bytes
    graph: dict[int, list[int]]
    keys: dict[int, np.ndarray]  # each member's public key
    dealt: dict[int, KeyShares] = field(default_factory=dict)
    forwarded: dict[int, list[int]] = field(default_factory=dict)  # holder → the dealers it masks with
    commitments: dict[int, dict[int, bytes]] = field(default_factory=dict)  # holder → dealer → digest


class ServerMasking:
    """The server's part of a secure round: keys in, setups out, shares relayed, masked updates
    summed by cluster, and the masks of silos that left taken out."""

    def __init__(
        self,
        channel: Channel,
        cfg: AggregationConfig,
        seed: int,
        round: int,
        leaving: Alternative | None = None,
        refused: Refused | None = None,
        noised: bool = False,
    ) -> None:
        self.channel, self.cfg, self.seed, self.round = channel, cfg, seed, round
        self.leaving, self.refused = leaving, refused
        self.noised = noised  # privacy.dp: distributed: the silos send noised, clipped updates
        self.lone: list[int] = []  # clusters with one member masking: its sum is its update

    def run(
        self, training: list[int], clusters: np.ndarray, starts: dict[int, Model], like: Model
    ) -> tuple[MaskedSums, int | None]:
        """Each cluster's sum of the training silos' masked updates, and the silo whose update
        came last (None where none came)."""
        key_expect = MaskKey.expect(self.round)
        keys = self._gather(training, lambda _: key_expect)
        rounds = self._setups(self._agreeable({c: MaskKey.of(m).public_key for c, m in keys.items()}), clusters)
        expected = {
            c: KeyShares.expect(self.round, neighbours=len(r.graph[c])) for r in rounds.values() for c in r.graph
        }
        for c, msg in self._gather(sorted(expected), lambda c: expected[c]).items():
            rounds[int(clusters[c])].dealt[c] = KeyShares.of(msg)
        self._forward(rounds)
        holders = sorted(c for r in rounds.values() for c in r.forwarded)
        members = {k: sorted(r.graph) for k, r in rounds.items()}
        sums, last = MaskedSums(self.round, clusters, starts, members if self.noised else None), None
        words = word_count(like)
        for c, msg in self._gather(holders, lambda c: self._masked_expect(rounds, clusters, c, words)).items():
            update = MaskedUpdate.of(msg)
            sums.add(c, update.words)
            rounds[int(clusters[c])].commitments[c] = dict(
                zip(rounds[int(clusters[c])].forwarded[c], map(bytes, update.commitments))
            )
            last = c
        self._unmask(rounds, sums)
        return sums, last

    def _gather(self, sources: list[int], expect: Callable[[int], Expect]) -> dict[int, Message]:
        """One message from each source, by silo; a source that leaves or breaks the protocol
        (under drop) is simply not among them."""
        return {m.sender: m for m in self.channel.recv_each(sources, expect, self.leaving, self.refused)}

    def _agreeable(self, keys: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """The keys a neighbour can agree a secret with: a low-order point gives none (RFC 7748,
        section 6.1), and its sender is named before any neighbour is given it."""
        probe, out = new_private_key(), {}
        for c, public in keys.items():
            try:
                probe.exchange(X25519PublicKey.from_public_bytes(public.tobytes()))
            except ValueError:
                self._refuse(c, ProtocolError(f"silo {c} sent a mask_key in round {self.round} that is no X25519 key"))
                continue
            out[c] = public
        return out

    def _refuse(self, silo: int, err: ProtocolError) -> None:
        """A silo that broke the protocol: dropped under drop (left out from here on), else the end."""
        if self.refused is None:
            raise err
        self.refused(silo, err)

    def _setups(self, keys: dict[int, np.ndarray], clusters: np.ndarray) -> dict[int, ClusterRound]:
        """Each cluster's graph over the silos that sent keys, and its setup out to them."""
        rounds, sends = {}, []
        for k in sorted({int(clusters[c]) for c in keys}):
            members = sorted(c for c in keys if clusters[c] == k)
            rng = np.random.default_rng([self.seed, self.round, k, GRAPH_STREAM])
            degree = neighbour_count(len(members), self.cfg.secure_neighbours)
            graph = neighbours(members, degree, rng)
            rounds[k] = ClusterRound(mask_context(self.seed, self.round, k), graph, {c: keys[c] for c in members})
            if len(members) == 1:
                self.lone.append(k)
            setup = SecureSetup(
                k,
                threshold_for(degree) if degree else 1,
                np.asarray(members, dtype=np.int64),
                np.stack([keys[c] for c in members]),
                np.asarray([graph[c] for c in members], dtype=np.int64).reshape(len(members), degree),
            )
            sends.append(self.channel.isend_all(members, setup, self.round))
        wait_all(sends)
        return rounds

    def _forward(self, rounds: dict[int, ClusterRound]) -> None:
        """To each cluster's members that dealt, every dealer's sealed shares: a member opens
        those sealed for it, and masks with the neighbours that dealt."""
        sends: list[Pending] = []
        for r in rounds.values():
            if not r.dealt:
                continue
            dealers = sorted(r.dealt)
            for holder in dealers:
                r.forwarded[holder] = [d for d in r.graph[holder] if d in r.dealt]
            sealed = np.stack([r.dealt[d].sealed for d in dealers])
            sends.append(self.channel.isend_all(dealers, ForwardedShares(np.asarray(dealers), sealed), self.round))
        wait_all(sends)

    def _masked_expect(self, rounds: dict[int, ClusterRound], clusters: np.ndarray, c: int, words: int) -> Expect:
        return MaskedUpdate.expect(self.round, words=words, dealers=len(rounds[int(clusters[c])].forwarded[c]))

    def _unmask(self, rounds: dict[int, ClusterRound], sums: MaskedSums) -> None:
        """For every silo that dealt its shares and sent no masked update: its neighbours'
        shares of its key, checked against their digests; the key rebuilt and checked against
        its public key; its masks taken out of the words of the neighbours that masked with it."""
        requests: dict[int, list[int]] = {}
        sends: list[Pending] = []
        for r in rounds.values():
            silent = sorted(set(r.dealt) - set(r.commitments))
            for holder in sorted(r.commitments):
                requests[holder] = [d for d in silent if d in r.forwarded[holder]]
            if r.commitments:
                request = UnmaskRequest(np.asarray(silent, dtype=np.int64))
                sends.append(self.channel.isend_all(sorted(r.commitments), request, self.round))
        wait_all(sends)
        asked = sorted(c for c, left in requests.items() if left)
        expect = {c: RevealedShares.expect(self.round, left=len(requests[c])) for c in asked}
        shares: dict[int, dict[int, bytes]] = {}  # the silo that left → holder → share
        for holder, msg in self._gather(asked, lambda c: expect[c]).items():
            for dealer, share in zip(requests[holder], RevealedShares.of(msg).shares):
                shares.setdefault(dealer, {})[holder] = bytes(share)
        for r in rounds.values():
            for gone in sorted(set(r.dealt) - set(r.commitments)):
                key = self._rebuilt(r, gone, shares.get(gone, {}))
                for holder in (h for h in r.commitments if gone in r.forwarded[h]):
                    secret, _ = pair_secrets(key, r.keys[holder], gone, holder, r.context)
                    words = mask(secret, len(sums.sums[int(sums.clusters[holder])]))
                    sums.unmask(holder, words if gone > holder else -words)  # what the holder added

    def _rebuilt(self, r: ClusterRound, gone: int, shares: dict[int, bytes]) -> X25519PrivateKey:
        """The key of silo `gone` from the shares revealed: each checked against the digest its
        holder sent before anyone left (a holder that reveals another is named), then the key
        against the public key `gone` sent."""
        good = {}
        for holder, share in sorted(shares.items()):
            if commitment(share, share_context(r.context, gone, holder)) == r.commitments[holder][gone]:
                good[holder] = share
                continue
            err = ProtocolError(
                f"silo {holder} revealed a share of silo {gone}'s key in round {self.round} that is not the "
                "one it was dealt (revealed_shares)"
            )
            self._refuse(holder, err)
        threshold = threshold_for(len(r.graph[gone]))
        if len(good) < threshold:
            raise ProtocolError(
                f"silo {gone} left round {self.round} after dealing its key, and {len(good)} of its neighbours "
                f"revealed their shares, under the {threshold} that rebuild it: the cluster's sum cannot be unmasked"
            )
        key = X25519PrivateKey.from_private_bytes(combine(dict(list(good.items())[:threshold])))
        if not np.array_equal(public_bytes(key), r.keys[gone]):
            raise ProtocolError(
                f"silo {gone} dealt shares of a key in round {self.round} that is not the one it sent "
                "(key_shares): the cluster's sum cannot be unmasked"
            )
        return key


class SiloMasking:
    """A silo's part of a secure round: its key out, its shares dealt, its update masked with
    the neighbours that dealt theirs, and its shares of a silo that left revealed."""

    def __init__(
        self, cfg: AggregationConfig, seed: int, silos: int, silo: int, privacy: PrivacyConfig | None = None
    ) -> None:
        self.clip = cfg.clip_norm if cfg.rule == "norm_clip" else None
        self.seed, self.silos, self.silo = seed, silos, silo
        self.dp = privacy if privacy is not None and privacy.dp == "distributed" else None

    @property
    def keeps_start(self) -> bool:
        """Whether `send` needs the model training started from (to clip the update)."""
        return self.clip is not None or self.dp is not None

    def send(
        self,
        channel: Channel,
        round: int,
        trained: Model,
        start: Model | None,
        n_samples: int,
        before_masking: Callable[[], None] = lambda: None,
    ) -> None:
        """`trained` (clipped to `aggregation.clip_norm` from `start` under norm_clip), weighted
        by `n_samples`, masked and sent to the server; under `privacy.dp: distributed` its
        update from `start` clipped to `privacy.clip`, plus its share of the noise, instead.
        `before_masking` runs once the shares are dealt (a fault to inject there)."""
        if self.clip is not None:
            assert start is not None, "norm_clip keeps the start it clips from"
            trained = clip_update(trained, start, self.clip)
        key = new_private_key()
        channel.send(SERVER, MaskKey(public_bytes(key)), round)
        setup, near = self._setup(channel, round)
        context, members = mask_context(self.seed, round, setup.cluster), len(setup.members)
        key_of = dict(zip(setup.members.tolist(), setup.keys))
        secrets = {}
        for j in near:
            try:
                secrets[j] = pair_secrets(key, key_of[j], self.silo, j, context)
            except ValueError as err:
                raise ProtocolError(
                    f"the server's secure_setup of round {round} gives silo {j} a key that is no X25519 public key"
                ) from err
        shares = split(key.private_bytes_raw(), near, setup.threshold) if near else {}
        sealed = [seal(secrets[j][1], shares[j], share_context(context, self.silo, j)) for j in near]
        channel.send(SERVER, KeyShares(_rows(sealed, SEALED_BYTES)), round)
        dealt = self._dealt(channel, round, setup, near, secrets, context)
        before_masking()
        words = encode(self._values(trained, start, n_samples, round, members), members)
        words = masked(words, self.silo, {j: secrets[j][0] for j in dealt})
        digests = [commitment(share, share_context(context, j, self.silo)) for j, share in dealt.items()]
        channel.send(SERVER, MaskedUpdate(words.view(np.int64), _rows(digests, DIGEST_BYTES)), round)
        self._reveal(channel, round, setup, dealt)

    def _values(self, trained: Model, start: Model | None, n_samples: int, round: int, members: int) -> np.ndarray:
        """What the silo masks: n·θ and n, or under distributed DP its clipped update noised and 1."""
        if self.dp is None:
            return weighted_words(trained, n_samples)
        assert start is not None, "distributed DP keeps the start it clips from"
        noise = self.dp.silo_noise(self.seed, round, self.silo, members, word_count(trained) - 1)
        return noised_words(clip_update(trained, start, self.dp.clip), start, noise)

    def _setup(self, channel: Channel, round: int) -> tuple[SecureSetup, list[int]]:
        """The cluster's setup, and this silo's neighbours in its graph."""
        setup = SecureSetup.of(channel.recv(SERVER, SecureSetup.expect(round)))
        members = setup.members.tolist()
        if self.silo not in members or max(members) >= self.silos:
            raise ProtocolError(
                f"the server's secure_setup of round {round} names silos {members[:8]} as its cluster's members, "
                f"without silo {self.silo} or beyond the {self.silos} silos"
            )
        return setup, setup.graph[members.index(self.silo)].tolist()

    def _dealt(
        self,
        channel: Channel,
        round: int,
        setup: SecureSetup,
        near: list[int],
        secrets: dict[int, tuple[bytes, bytes]],
        context: bytes,
    ) -> dict[int, bytes]:
        """The shares the neighbours that dealt sealed for this silo (dealer → share, in the
        order of its neighbours), unsealed."""
        forwarded = ForwardedShares.of(channel.recv(SERVER, ForwardedShares.expect(round, degree=setup.graph.shape[1])))
        dealers = forwarded.dealers.tolist()
        members = setup.members.tolist()
        if len(set(dealers)) != len(dealers) or not set(dealers) <= set(members):
            raise ProtocolError(
                f"the server's forwarded_shares of round {round} come from silos {dealers[:8]}, not all "
                f"members of silo {self.silo}'s cluster"
            )
        rows = dict(zip(dealers, forwarded.sealed))
        out = {}
        for j in (j for j in near if j in rows):
            place = setup.graph[members.index(j)].tolist().index(self.silo)  # the graph is symmetric (checked)
            try:
                out[j] = unseal(secrets[j][1], bytes(rows[j][place]), share_context(context, j, self.silo))
            except InvalidTag as err:
                raise ProtocolError(
                    f"silo {j} dealt silo {self.silo} a key share in round {round} that is not sealed for it "
                    "(key_shares)"
                ) from err
        return out

    def _reveal(self, channel: Channel, round: int, setup: SecureSetup, dealt: dict[int, bytes]) -> None:
        """Its shares of the keys of the silos that left, as the server asks: of those that
        dealt it one."""
        left = UnmaskRequest.of(channel.recv(SERVER, UnmaskRequest.expect(round))).left.tolist()
        if not set(left) <= set(setup.members.tolist()) or len(set(left)) != len(left):
            raise ProtocolError(
                f"the server's unmask_request of round {round} asks for the shares of silos {left[:8]}, "
                f"not all of them members of silo {self.silo}'s cluster"
            )
        if held := [j for j in left if j in dealt]:
            channel.send(SERVER, RevealedShares(_rows([dealt[j] for j in held], SHARE_BYTES)), round)


def _rows(items: list[bytes], width: int) -> np.ndarray:
    """Byte strings of one width as the rows of a uint8 array (none: an empty one)."""
    return np.frombuffer(b"".join(items), dtype=np.uint8).reshape(len(items), width).copy()
