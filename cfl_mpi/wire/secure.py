"""The messages of secure aggregation (`aggregation.secure`), each declared once (payload.py).
Every one travels between a silo and the server: the server relays what silos address to each
other (public keys, sealed shares), so that a silo that leaves never leaves a peer waiting."""

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
    """server → silo: its cluster, how many of the cluster's members mask this round (the
    bound on its fixed-point values), the shares that rebuild a key, and its neighbours in the
    round's graph with their public keys."""

    cluster: int = scalar(int, 0, math.inf)
    members: int = scalar(int, 1, math.inf)
    threshold: int = scalar(int, 1, math.inf)
    neighbours: np.ndarray = array("int64", "neighbours")
    keys: np.ndarray = array("uint8", "neighbours", PUBLIC_KEY_BYTES)

    def problem(self) -> str | None:
        listed = self.neighbours.tolist()
        if len(set(listed)) != len(listed) or min(listed, default=0) < 0 or len(listed) >= self.members:
            return f"neighbours {listed[:8]} (repeated, negative, or as many as the {self.members} members)"
        if listed and self.threshold > len(listed):
            return f"threshold {self.threshold} above its {len(listed)} neighbours"
        return None


class KeyShares(Payload, kind="key_shares"):
    """silo → server: a share of its round key for each neighbour, sealed for that neighbour,
    in the setup's order."""

    sealed: np.ndarray = array("uint8", "neighbours", SEALED_BYTES)


class ForwardedShares(Payload, kind="forwarded_shares"):
    """server → silo: the sealed shares its neighbours dealt it (those that dealt: the ones it
    masks with)."""

    dealers: np.ndarray = array("int64", "dealers")
    sealed: np.ndarray = array("uint8", "dealers", SEALED_BYTES)


class MaskedUpdate(Payload, kind="masked_update"):
    """silo → server: its update as fixed-point words modulo 2^64 (int64 bits) with its
    neighbours' masks added (privacy/masking.py), alone uniform noise; and a digest of each
    share it was dealt, in the forwarded order, which any share it reveals must match."""

    words: np.ndarray = array("int64", "words")
    commitments: np.ndarray = array("uint8", "dealers", DIGEST_BYTES)


class UnmaskRequest(Payload, kind="unmask_request"):
    """server → silo, once the masked updates are in: the silos that dealt it shares and left
    before their masked update (mostly none), whose shares it is to reveal."""

    left: np.ndarray = array("int64", "left")


class RevealedShares(Payload, kind="revealed_shares"):
    """silo → server: its shares of the keys of the silos that left, in the request's order."""

    shares: np.ndarray = array("uint8", "left", SHARE_BYTES)


SECURE_KINDS: tuple[Kind, ...] = tuple(
    kind.KIND
    for kind in (MaskKey, SecureSetup, KeyShares, ForwardedShares, MaskedUpdate, UnmaskRequest, RevealedShares)
)
