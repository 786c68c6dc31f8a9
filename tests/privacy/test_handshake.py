"""Seed handshake: both silos of a pair build the same R; the server's view does not give it."""
import numpy as np

from cfl_mpi.privacy.handshake import new_private_key, pair_seed, projection_matrix, public_bytes


def test_both_silos_derive_the_same_projection():
    a, b = new_private_key(), new_private_key()
    seed_a = pair_seed(a, public_bytes(b), 3, 7, b"ctx")
    seed_b = pair_seed(b, public_bytes(a), 7, 3, b"ctx")
    assert seed_a == seed_b
    r_a, r_b = projection_matrix(seed_a, 128, 115), projection_matrix(seed_b, 128, 115)
    assert r_a.shape == (128, 115) and r_a.dtype == np.float32
    np.testing.assert_array_equal(r_a, r_b)
    np.testing.assert_allclose(np.linalg.norm(r_a, axis=1), 1.0, rtol=1e-5)  # rows normalised


def test_server_view_does_not_give_the_projection():
    """The server sees both public keys (if it relays them) but no private key: any key it
    holds itself, and the public bytes themselves, give other seeds and other matrices."""
    a, b = new_private_key(), new_private_key()
    pub_a, pub_b = public_bytes(a), public_bytes(b)
    true_r = projection_matrix(pair_seed(a, pub_b, 0, 1, b"ctx"), 16, 14)
    server = new_private_key()
    guesses = [pair_seed(server, pub_a, 0, 1, b"ctx"), pair_seed(server, pub_b, 0, 1, b"ctx"),
               bytes(pub_a), bytes(pub_b), bytes(pub_a ^ pub_b)]
    for guess in guesses:
        assert not np.allclose(projection_matrix(guess, 16, 14), true_r)


def test_seed_bound_to_pair_and_context():
    a, b, c = new_private_key(), new_private_key(), new_private_key()
    ab = pair_seed(a, public_bytes(b), 0, 1, b"round=1")
    assert ab != pair_seed(a, public_bytes(c), 0, 2, b"round=1")  # other partner
    assert ab != pair_seed(a, public_bytes(b), 0, 1, b"round=2")  # other context


def test_seeded_keys_are_reproducible_and_ephemeral_keys_are_not():
    assert np.array_equal(public_bytes(new_private_key(b"s")), public_bytes(new_private_key(b"s")))
    assert not np.array_equal(public_bytes(new_private_key()), public_bytes(new_private_key()))
