"""The shares that let a secure round finish without a silo that left mid-round: each silo
splits its round key among its neighbours (Shamir, *How to Share a Secret*, CACM 1979), sealed
for each one, so that the server can rebuild the key of a silo that left, and only of one that
left, from the shares of the neighbours that stayed (Bonawitz et al., CCS 2017, Sections 4.1
and 4.2: a threshold t of its neighbours).

Shamir's scheme is written here by hand: the libraries that offer it split 16-byte secrets
only, and the arithmetic is a few lines of Python integers modulo a prime."""

from __future__ import annotations

import hashlib
import secrets

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

# A Mersenne prime above any 32-byte key: the field of the shares' polynomials.
PRIME = 2**521 - 1
SHARE_BYTES = (PRIME.bit_length() + 7) // 8
SEALED_BYTES = SHARE_BYTES + 16  # ChaCha20-Poly1305's tag
SEAL_NONCE = bytes(12)  # one message per sealing key, which is fresh each round and pair


def threshold_for(neighbours: int) -> int:
    """t, the shares that rebuild a key: a majority of its holder's neighbours, so that fewer
    than t colluding neighbours learn nothing of it and up to k − t of them may leave too."""
    return neighbours // 2 + 1


def split(secret: bytes, holders: list[int], threshold: int) -> dict[int, bytes]:
    """Silo index → its share of `secret`: f(holder + 1) for a random polynomial f of degree
    t − 1 over GF(PRIME) with f(0) the secret."""
    if not 1 <= threshold <= len(holders):
        raise ValueError(f"a threshold of {threshold} among {len(holders)} holders")
    coefficients = [int.from_bytes(secret, "big"), *(secrets.randbelow(PRIME) for _ in range(threshold - 1))]
    out = {}
    for holder in holders:
        x, y = holder + 1, 0
        for a in reversed(coefficients):  # Horner's rule
            y = (y * x + a) % PRIME
        out[holder] = y.to_bytes(SHARE_BYTES, "big")
    return out


def combine(shares: dict[int, bytes], length: int = 32) -> bytes:
    """The secret of `length` bytes from its holders' shares (silo index → share): f(0) by
    Lagrange interpolation. Fewer than the threshold give some other value, never an error:
    check what comes out (its public key)."""
    points = [(holder + 1, int.from_bytes(share, "big")) for holder, share in shares.items()]
    secret = 0
    for i, (xi, yi) in enumerate(points):
        numerator, denominator = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                numerator = numerator * -xj % PRIME
                denominator = denominator * (xi - xj) % PRIME
        secret = (secret + yi * numerator * pow(denominator, -1, PRIME)) % PRIME
    if secret >= 1 << (8 * length):
        return bytes(length)  # not a key of this length: the shares were not of one
    return secret.to_bytes(length, "big")


def seal(key: bytes, share: bytes, context: bytes) -> bytes:
    """`share` for one holder only: ChaCha20-Poly1305 under the pair's sealing key."""
    return ChaCha20Poly1305(key).encrypt(SEAL_NONCE, share, context)


def unseal(key: bytes, sealed: bytes, context: bytes) -> bytes:
    """The share sealed for this holder; cryptography's InvalidTag where it was not."""
    return ChaCha20Poly1305(key).decrypt(SEAL_NONCE, sealed, context)


def commitment(share: bytes, context: bytes) -> bytes:
    """What a holder tells the server of a share once it holds it, so that the share it
    reveals later is checked against it (SHA-256: the share stays hidden)."""
    return hashlib.sha256(context + share).digest()
