"""Pairwise projection seeds: X25519 key agreement + HKDF-SHA256 (the seed handshake of EMD-CFL's
projection R: both silos of a pair build the same R, the server cannot).

Two silos exchange X25519 public keys (directly, silo to silo); each derives the same
32-byte secret, and HKDF binds it to the pair and the run so one key pair serves all of a
silo's partners. The server sees at most public keys, from which the seed cannot be
computed (that is the Diffie–Hellman assumption X25519 rests on).
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PUBLIC_KEY_BYTES = 32
PROJECTIONS = ("orthonormal", "gaussian")


def new_private_key(seed_material: bytes | None = None) -> X25519PrivateKey:
    """A fresh key from the OS's entropy, or (for reproducible experiments) from seed material."""
    if seed_material is None:
        return X25519PrivateKey.generate()
    return X25519PrivateKey.from_private_bytes(hashlib.sha256(b"cfl_mpi x25519|" + seed_material).digest())


def public_bytes(key: X25519PrivateKey) -> np.ndarray:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return np.frombuffer(raw, dtype=np.uint8).copy()


def pair_seed(
    own: X25519PrivateKey,
    peer_public: np.ndarray,
    silo_a: int,
    silo_b: int,
    context: bytes,
    purpose: str = "projection",
) -> bytes:
    """The 32-byte secret both silos of the pair derive for `purpose` (EMD-CFL's projection,
    secure aggregation's masks); symmetric in (a, b)."""
    shared = own.exchange(X25519PublicKey.from_public_bytes(peer_public.tobytes()))
    lo, hi = sorted((silo_a, silo_b))
    info = f"cfl_mpi {purpose}|".encode() + context + f"|{lo}|{hi}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def projection_matrix(seed: bytes, dim_z: int, dim_r: int, kind: str) -> np.ndarray:
    """The pair's R, drawn from the secret seed both silos derived."""
    return random_projection(np.random.Generator(np.random.PCG64(int.from_bytes(seed, "little"))), dim_z, dim_r, kind)


def random_projection(rng: np.random.Generator, dim_z: int, dim_r: int, kind: str) -> np.ndarray:
    """R ∈ R^{dim_z × dim_r}, as float32.

    ``gaussian``: Gaussian entries / sqrt(dim_z), rows normalised, as the EMD-CFL paper and
    its authors' code draw it. At dim_r close to dim_z this R is far from an isometry: the
    singular values of a near-square Gaussian matrix spread over the Marchenko–Pastur law,
    from near 0 to about twice their mean, so every pair's R stretches some directions of the
    embedding and all but erases others, and W moves with the draw.

    ``orthonormal``: orthonormal columns, uniform on the Stiefel manifold: the Q factor of a
    Gaussian matrix with its columns' signs fixed by R's diagonal (Mezzadri, "How to generate
    random matrices from the classical compact groups", Notices of the AMS 54(5), 2007). It
    keeps a random dim_r-dimensional subspace exactly, so only the dim_z − dim_r directions it
    drops move W (docs/methods/emdcfl-projection.md, "The projection R").
    """
    g = rng.standard_normal((dim_z, dim_r))
    if kind == "gaussian":
        r = g / np.sqrt(dim_z)
        return (r / np.linalg.norm(r, axis=1, keepdims=True)).astype(np.float32)
    if kind == "orthonormal":
        q, upper = np.linalg.qr(g)
        return (q * np.where(np.diag(upper) < 0, -1.0, 1.0)).astype(np.float32)
    raise ValueError(f"unknown projection {kind!r}; expected one of {PROJECTIONS}")
