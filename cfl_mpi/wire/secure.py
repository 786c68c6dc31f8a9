"""The messages of secure aggregation (`aggregation.secure`), each declared once (payload.py):
the server's word to each training silo once the round's clusters are known, the silos' keys
for their masks, and the masked update that takes the place of `Update`."""

from __future__ import annotations

import math

import numpy as np

from ..privacy.handshake import PUBLIC_KEY_BYTES
from .messages import Kind
from .payload import Payload, array, scalar


class SecureSetup(Payload, kind="secure_setup"):
    """server → silo, after the round's clustering: its cluster, how many of the cluster's
    members send masked updates this round (the bound on its fixed-point values) and the
    members it masks with (its neighbours in the round's graph)."""

    cluster: int = scalar(int, 0, math.inf)
    members: int = scalar(int, 1, math.inf)
    neighbours: np.ndarray = array("int64", "neighbours")

    def problem(self) -> str | None:
        listed = self.neighbours.tolist()
        if len(set(listed)) != len(listed) or min(listed, default=0) < 0 or len(listed) >= self.members:
            return f"neighbours {listed[:8]} (repeated, negative, or as many as the {self.members} members)"
        return None


class MaskKey(Payload, kind="mask_key"):
    """silo ↔ silo: the public half of the silo's fresh X25519 key for the round's masks."""

    public_key: np.ndarray = array("uint8", PUBLIC_KEY_BYTES)


class MaskedUpdate(Payload, kind="masked_update"):
    """silo → server: its update as fixed-point words modulo 2^64 (int64 bits) with its
    neighbours' masks added (privacy/masking.py): alone, uniform noise."""

    words: np.ndarray = array("int64", "words")


SECURE_KINDS: tuple[Kind, ...] = (SecureSetup.KIND, MaskKey.KIND, MaskedUpdate.KIND)
