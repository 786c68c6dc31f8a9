"""Secure aggregation's arithmetic: the server of a cluster learns the sum of its members'
updates and nothing else (Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal,
Seth, *Practical Secure Aggregation for Privacy-Preserving Machine Learning*, CCS 2017).

Each silo turns its weighted model into fixed-point words modulo 2^64 and adds, for every
neighbour of the round's graph, a mask expanded from the pair's secret by AES-256 in counter
mode (a standard PRG; with the AES instructions of x86 and ARMv8 servers, faster than
ChaCha20 here): plus towards a neighbour of higher index, minus towards a lower one. Each
pair's masks cancel in the cluster's sum; over a connected graph every single masked vector
is uniform given the others' sum, so the sum is all the server can read. The graph is
SecAgg+'s (Bell, Bonawitz, Gascón, Lepoint, Raykova, *Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead*, CCS 2020): a Harary graph over a random order, each silo joined
to k = O(log n) others.
"""

from __future__ import annotations

import math

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

# Fixed point: a value v travels as round(v · 2^FRACTION_BITS) modulo 2^64, exact to
# 2^-(FRACTION_BITS + 1) each; a cluster's sum must stay under 2^63 in magnitude.
FRACTION_BITS = 32
SUM_LIMIT = 2.0**63
MASK_COUNTER = bytes(16)  # the first counter block: one stream per pair secret, fresh each round and cluster


def neighbour_count(members: int, given: int | None = None) -> int:
    """k, the neighbours of each member: `given` (even: a Harary graph joins k/2 on either
    side), else every other member in a cluster of up to 9, and 2⌈log₂ n⌉ beyond; at most n − 1."""
    if given is not None:
        return min(given, members - 1)
    if members <= 9:
        return members - 1
    return min(members - 1, 2 * math.ceil(math.log2(members)))


def neighbours(members: list[int], k: int, rng: np.random.Generator) -> dict[int, list[int]]:
    """The Harary graph H(k, n) over `members` in a random order (k even): each joined to the
    k/2 before and after it round the ring; complete where k ≥ n − 1. Every member's
    neighbours, sorted."""
    n = len(members)
    if k >= n - 1:
        return {m: sorted(set(members) - {m}) for m in members}
    ring = [members[i] for i in rng.permutation(n)]
    graph: dict[int, set[int]] = {m: set() for m in members}
    for i, m in enumerate(ring):
        for step in range(1, k // 2 + 1):
            other = ring[(i + step) % n]
            graph[m].add(other)
            graph[other].add(m)
    return {m: sorted(graph[m]) for m in members}


def encode(values: np.ndarray, members: int) -> np.ndarray:
    """`values` (float64) as fixed-point words modulo 2^64 (uint64); OverflowError where a
    cluster of `members` such values could overflow the sum."""
    scaled = np.rint(values * 2.0**FRACTION_BITS)
    bound = SUM_LIMIT / max(members, 1)
    if scaled.size and not np.abs(scaled).max() < bound:
        largest = float(np.abs(values).max())
        raise OverflowError(
            f"a value of {largest:.3g} does not fit the fixed point of secure aggregation "
            f"(at most {bound / 2.0**FRACTION_BITS:.3g} in a cluster of {members})"
        )
    return scaled.astype(np.int64).view(np.uint64)


def decode(words: np.ndarray) -> np.ndarray:
    """The float64 values of fixed-point words (a cluster's sum, its masks cancelled)."""
    return words.view(np.int64).astype(np.float64) / 2.0**FRACTION_BITS


def mask_stream(secret: bytes) -> CipherContext:
    """A pair's 32-byte secret as a stream cipher: AES-256-CTR from counter 0."""
    return Cipher(algorithms.AES(secret), modes.CTR(MASK_COUNTER)).encryptor()


def mask(secret: bytes, length: int) -> np.ndarray:
    """`length` uniform words (uint64) from a pair's 32-byte secret: its keystream."""
    return np.frombuffer(mask_stream(secret).update(bytes(8 * length)), dtype=np.uint64).copy()


def masked(words: np.ndarray, own: int, secrets: dict[int, bytes]) -> np.ndarray:
    """`words` plus each neighbour's mask (neighbour → pair secret), added towards a
    neighbour of higher index and subtracted towards a lower one, modulo 2^64. One buffer
    takes every neighbour's stream in turn: fresh megabytes for each cost more in page faults
    than the cipher itself."""
    out = words.copy()
    zeros = bytes(8 * len(words))
    stream = bytearray(len(zeros) + 63)  # update_into's room: a block less one byte beyond the data
    keystream = np.frombuffer(stream, dtype=np.uint64, count=len(words))
    for other, secret in secrets.items():
        if other == own:
            raise ValueError(f"silo {own} cannot be its own neighbour")
        mask_stream(secret).update_into(zeros, stream)
        if other > own:
            out += keystream
        else:
            out -= keystream
    return out
