"""Secure aggregation's round (`aggregation.secure`): both parties' steps. The arithmetic is
privacy/masking.py's, the server's sums aggregation/masked_sums.py's.

Once the round's clusters are known (after the strategy's clustering exchanges, which a
secure silo therefore finishes before it sends its update), the server sends each training
silo a `SecureSetup`: its cluster, and its neighbours in a Harary graph over the cluster's
trainers. Neighbours swap fresh X25519 public keys directly; each pair derives its mask
secret with HKDF, bound to the run, the round and the cluster; every silo sends the server
its masked words. The server sums each cluster's words, and the masks cancel."""

from __future__ import annotations

import numpy as np

from ..aggregation.masked_sums import MaskedSums, weighted_words, word_count
from ..aggregation.rules import AggregationConfig, Model, clip_update
from ..channel import SERVER, Channel, Pending
from ..privacy.handshake import new_private_key, pair_seed, public_bytes
from ..privacy.masking import encode, masked, neighbour_count, neighbours
from ..wire.messages import ProtocolError
from ..wire.secure import MaskedUpdate, MaskKey, SecureSetup

# What the graph's draw mixes into the run seed, so that it shares no stream with other draws.
GRAPH_STREAM = 0x5347


def mask_context(seed: int, round: int, cluster: int) -> bytes:
    """What HKDF binds a pair's mask secret to besides the pair."""
    return f"seed={seed}|round={round}|cluster={cluster}".encode()


def send_setups(
    channel: Channel, cfg: AggregationConfig, seed: int, round: int, clusters: np.ndarray, training: list[int]
) -> tuple[list[Pending], list[int]]:
    """Each training silo's `SecureSetup`; the sends, and the clusters with one member training
    (whose sum is that member's update: nothing to hide it among)."""
    sends, alone = [], []
    for k in sorted({int(clusters[c]) for c in training}):
        members = sorted(c for c in training if clusters[c] == k)
        rng = np.random.default_rng([seed, round, k, GRAPH_STREAM])
        graph = neighbours(members, neighbour_count(len(members), cfg.secure_neighbours), rng)
        if len(members) == 1:
            alone.append(k)
        for c in members:
            sends.append(channel.isend(c, SecureSetup(k, len(members), np.asarray(graph[c], dtype=np.int64)), round))
    return sends, alone


def receive_masked(
    channel: Channel, round: int, training: list[int], clusters: np.ndarray, starts: dict[int, Model], like: Model
) -> tuple[MaskedSums, int | None]:
    """The training silos' masked updates summed by cluster, taken as they come; and the silo
    whose update came last (None where none trained)."""
    sums, last = MaskedSums(round, clusters, starts), None
    expect = MaskedUpdate.expect(round, words=word_count(like))
    for _, msg in channel.recv_in_turn(training, [lambda _: expect]):
        sums.add(msg.sender, MaskedUpdate.of(msg).words)
        last = msg.sender
    return sums, last


class SiloMasking:
    """A silo's part of a secure round: take its setup, agree a mask secret with each
    neighbour, and send the server its update masked."""

    def __init__(self, cfg: AggregationConfig, seed: int, silos: int, silo: int) -> None:
        self.clip = cfg.clip_norm if cfg.rule == "norm_clip" else None
        self.seed, self.silos, self.silo = seed, silos, silo

    def send(self, channel: Channel, round: int, trained: Model, start: Model | None, n_samples: int) -> None:
        """`trained` (clipped to `aggregation.clip_norm` from `start` under norm_clip), weighted
        by `n_samples`, masked and sent to the server."""
        setup = SecureSetup.of(channel.recv(SERVER, SecureSetup.expect(round)))
        partners = setup.neighbours.tolist()
        if self.silo in partners or max(partners, default=0) >= self.silos:
            raise ProtocolError(
                f"the server's secure_setup of round {round} names silos {partners[:8]} as neighbours of "
                f"silo {self.silo} (itself, or beyond the {self.silos} silos)"
            )
        if self.clip is not None:
            assert start is not None, "norm_clip keeps the start it clips from"
            trained = clip_update(trained, start, self.clip)
        key = new_private_key()
        sent = channel.isend_all(partners, MaskKey(public_bytes(key)), round) if partners else None
        context, secrets, waiting = mask_context(self.seed, round, setup.cluster), {}, list(partners)
        expect = MaskKey.expect(round)
        while waiting:
            msg = channel.recv_any(waiting, lambda _: expect)
            waiting.remove(msg.sender)
            try:
                secrets[msg.sender] = pair_seed(key, MaskKey.of(msg).public_key, self.silo, msg.sender, context, "mask")
            except ValueError as err:  # a low-order point: no shared secret (RFC 7748, section 6.1)
                raise ProtocolError(
                    f"silo {msg.sender} sent a mask_key in round {round} that is no X25519 public key ({err})"
                ) from err
        words = masked(encode(weighted_words(trained, n_samples), setup.members), self.silo, secrets)
        channel.send(SERVER, MaskedUpdate(words.view(np.int64)), round)
        if sent is not None:
            sent.wait()
