"""Seed handshake: both silos of a pair build the same R; the server's view does not give it.
R's two distributions: the paper's Gaussian one and the orthonormal one, checked against the
law of a uniformly random unit vector."""

import numpy as np
import pytest
from scipy import stats

from cfl_mpi.privacy.handshake import (
    PROJECTIONS,
    new_private_key,
    pair_seed,
    projection_matrix,
    public_bytes,
    random_projection,
)


@pytest.mark.parametrize("kind", PROJECTIONS)
def test_both_silos_derive_the_same_projection(kind):
    a, b = new_private_key(), new_private_key()
    seed_a = pair_seed(a, public_bytes(b), 3, 7, b"ctx")
    seed_b = pair_seed(b, public_bytes(a), 7, 3, b"ctx")
    assert seed_a == seed_b
    r_a, r_b = projection_matrix(seed_a, 128, 115, kind), projection_matrix(seed_b, 128, 115, kind)
    assert r_a.shape == (128, 115) and r_a.dtype == np.float32
    np.testing.assert_array_equal(r_a, r_b)
    if kind == "gaussian":
        np.testing.assert_allclose(np.linalg.norm(r_a, axis=1), 1.0, rtol=1e-5)  # rows normalised
    else:
        np.testing.assert_allclose(r_a.T @ r_a, np.eye(115), atol=1e-5)  # orthonormal columns


def test_orthonormal_projection_is_uniform():
    """Each column of a uniformly random orthonormal R is a uniform unit vector u in R^d, whose
    coordinate u_1 follows (u_1 + 1) / 2 ~ Beta((d - 1) / 2, (d - 1) / 2). A bare QR factor is
    not uniform (LAPACK's sign convention skews its entries), which the sign fix corrects."""
    d, rng = 16, np.random.default_rng(0)
    draws = np.stack([random_projection(rng, d, 14, "orthonormal") for _ in range(3000)]).astype(np.float64)
    law = stats.beta((d - 1) / 2, (d - 1) / 2)
    for column in (0, 7, 13):
        assert stats.kstest((draws[:, 0, column] + 1) / 2, law.cdf).pvalue > 1e-3  # measured: 0.008-0.6
    bare = np.stack([np.linalg.qr(rng.standard_normal((d, 14)))[0] for _ in range(3000)])
    assert stats.kstest((bare[:, 0, 0] + 1) / 2, law.cdf).pvalue < 1e-6  # measured: 0.0


def test_gaussian_projection_distorts_and_orthonormal_does_not():
    """Why the orthonormal R is the default: a near-square Gaussian R's singular values spread
    widely (Marchenko–Pastur), an orthonormal R's are all 1."""
    rng = np.random.default_rng(1)
    gaussian = np.linalg.svd(random_projection(rng, 128, 115, "gaussian"), compute_uv=False)
    orthonormal = np.linalg.svd(random_projection(rng, 128, 115, "orthonormal"), compute_uv=False)
    assert gaussian.max() / gaussian.min() > 5
    np.testing.assert_allclose(orthonormal, 1.0, atol=1e-5)


def test_server_view_does_not_give_the_projection():
    """The server sees both public keys (if it relays them) but no private key: any key it
    holds itself, and the public bytes themselves, give other seeds and other matrices."""
    a, b = new_private_key(), new_private_key()
    pub_a, pub_b = public_bytes(a), public_bytes(b)
    true_r = projection_matrix(pair_seed(a, pub_b, 0, 1, b"ctx"), 16, 14, "orthonormal")
    server = new_private_key()
    guesses = [
        pair_seed(server, pub_a, 0, 1, b"ctx"),
        pair_seed(server, pub_b, 0, 1, b"ctx"),
        bytes(pub_a),
        bytes(pub_b),
        bytes(pub_a ^ pub_b),
    ]
    for guess in guesses:
        assert not np.allclose(projection_matrix(guess, 16, 14, "orthonormal"), true_r)


def test_seed_bound_to_pair_and_context():
    a, b, c = new_private_key(), new_private_key(), new_private_key()
    ab = pair_seed(a, public_bytes(b), 0, 1, b"round=1")
    assert ab != pair_seed(a, public_bytes(c), 0, 2, b"round=1")  # other partner
    assert ab != pair_seed(a, public_bytes(b), 0, 1, b"round=2")  # other context


def test_seeded_keys_are_reproducible_and_ephemeral_keys_are_not():
    assert np.array_equal(public_bytes(new_private_key(b"s")), public_bytes(new_private_key(b"s")))
    assert not np.array_equal(public_bytes(new_private_key()), public_bytes(new_private_key()))
