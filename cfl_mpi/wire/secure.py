"""The messages of secure aggregation (`aggregation.secure`), each declared once (payload.py).
Every one travels between a silo and the server: the server relays what silos address to each
other (public keys, sealed shares), so that a silo that leaves never leaves a peer waiting, and
sends what a cluster's members share as one message for the cluster (`Channel.isend_all`: once
per rank)."""

from __future__ import annotations

import math

import numpy as np

from ..privacy.handshake import PUBLIC_KEY_BYTES
from ..privacy.key_shares import SEALED_BYTES, SHARE_BYTES
from .messages import Kind
from .payload import Payload, array, scalar

DIGEST_BYTES = 32  # SHA-256


class MaskKey(Payload, kind="mask_key"):
    """silo → server, once the round's clustering exchanges are done: the public half of the
    silo's fresh X25519 key for the round's masks."""

    public_key: np.ndarray = array("uint8", PUBLIC_KEY_BYTES)


class SecureSetup(Payload, kind="secure_setup"):
    """server → every member of a cluster that sent a key (one message for the cluster): the
    members, their public keys, the round's graph over them (row i: the neighbours of member
    i) and the shares that rebuild a key."""

    cluster: int = scalar(int, 0, math.inf)
    threshold: int = scalar(int, 1, math.inf)
    members: np.ndarray = array("int64", "members")
    keys: np.ndarray = array("uint8", "members", PUBLIC_KEY_BYTES)
    graph: np.ndarray = array("int64", "members", "degree")

    def problem(self) -> str | None:
        members = self.members.tolist()
        if len(set(members)) != len(members) or min(members, default=0) < 0:
            return f"members {members[:8]} (repeated or negative)"
        edges = {(a, b) for a, row in zip(members, self.graph.tolist()) for b in row}
        rows_ok = all(len(set(row)) == len(row) and a not in row for a, row in zip(members, self.graph.tolist()))
        if not rows_ok or not {b for _, b in edges} <= set(members) or any((b, a) not in edges for a, b in edges):
            return "a graph that is not one over the members (a repeated, outside or one-way neighbour, or a loop)"
        if self.graph.shape[1] and self.threshold > self.graph.shape[1]:
            return f"threshold {self.threshold} above the {self.graph.shape[1]} neighbours of each member"
        return None


class KeyShares(Payload, kind="key_shares"):
    """silo → server: a share of its round key for each neighbour, sealed for that neighbour,
    in the setup's order."""

    sealed: np.ndarray = array("uint8", "neighbours", SEALED_BYTES)


class ForwardedShares(Payload, kind="forwarded_shares"):
    """server → every member of a cluster that dealt (one message for the cluster): each
    dealer's sealed shares, row by row in the order of its neighbours; a member opens those
    sealed for it, and masks with the neighbours that dealt."""

    dealers: np.ndarray = array("int64", "dealers")
    sealed: np.ndarray = array("uint8", "dealers", "degree", SEALED_BYTES)


class MaskedUpdate(Payload, kind="masked_update"):
    """silo → server: its update as fixed-point words modulo 2^64 (int64 bits) with its
    neighbours' masks added (privacy/masking.py), alone uniform noise; and a digest of each
    share it was dealt, in the forwarded order, which any share it reveals must match."""

    words: np.ndarray = array("int64", "words")
    commitments: np.ndarray = array("uint8", "dealers", DIGEST_BYTES)


class UnmaskRequest(Payload, kind="unmask_request"):
    """server → every member of a cluster whose masked update came (one message for the
    cluster): the members that dealt shares and left before their masked update (mostly
    none), whose shares each holds it is to reveal."""

    left: np.ndarray = array("int64", "left")


class RevealedShares(Payload, kind="revealed_shares"):
    """silo → server: its shares of the keys of the silos that left and dealt it one, in the
    request's order."""

    shares: np.ndarray = array("uint8", "left", SHARE_BYTES)


SECURE_KINDS: tuple[Kind, ...] = tuple(
    kind.KIND
    for kind in (MaskKey, SecureSetup, KeyShares, ForwardedShares, MaskedUpdate, UnmaskRequest, RevealedShares)
)
