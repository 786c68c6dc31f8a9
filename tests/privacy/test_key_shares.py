"""Shamir shares of a round key: any t of them rebuild it, fewer say nothing of it; sealed
shares open for their holder only; a digest binds a holder to the share it holds."""

from __future__ import annotations

import itertools
import os

import pytest
from cryptography.exceptions import InvalidTag
from hypothesis import given, settings
from hypothesis import strategies as st

from cfl_mpi.privacy.key_shares import PRIME, combine, commitment, seal, split, threshold_for, unseal


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.integers(1, 20), st.data())
def test_any_threshold_of_the_shares_rebuild_the_key(secret, k, data):
    holders = sorted(data.draw(st.sets(st.integers(0, 10_000), min_size=k, max_size=k)))
    t = threshold_for(k)
    shares = split(secret, holders, t)
    chosen = data.draw(st.permutations(holders))[:t]
    assert combine({h: shares[h] for h in chosen}) == secret
    assert combine(shares) == secret  # more than t: the same polynomial


def test_fewer_than_the_threshold_leave_every_key_equally_likely():
    """t − 1 shares and any candidate key: exactly one polynomial of degree t − 1 passes
    through them and the candidate, so the shares rule out no key (checked: the candidate's
    polynomial gives those very shares)."""
    secret, other = os.urandom(32), os.urandom(32)
    shares = split(secret, [3, 8, 11, 20], threshold=3)
    known = {3: shares[3], 8: shares[8]}
    assert combine(known) != secret
    # the polynomial through (0, other) and the two known shares, evaluated at holder 11
    points = [(0, int.from_bytes(other, "big"))] + [(h + 1, int.from_bytes(s, "big")) for h, s in known.items()]
    x = 12
    value = 0
    for i, (xi, yi) in enumerate(points):
        term = yi
        for j, (xj, _) in enumerate(points):
            if i != j:
                term = term * (x - xj) * pow(xi - xj, -1, PRIME) % PRIME
        value = (value + term) % PRIME
    assert combine({**known, 11: value.to_bytes(66, "big")}) == other


def test_the_threshold_is_a_majority_of_the_neighbours():
    assert [threshold_for(k) for k in (1, 2, 3, 4, 8, 12, 20)] == [1, 2, 2, 3, 5, 7, 11]
    with pytest.raises(ValueError, match="a threshold of 3 among 2 holders"):
        split(bytes(32), [1, 2], 3)


def test_a_sealed_share_opens_for_its_holder_and_pair_only():
    key, other, share = os.urandom(32), os.urandom(32), os.urandom(66)
    sealed = seal(key, share, b"round 1|share 2->5")
    assert unseal(key, sealed, b"round 1|share 2->5") == share
    for wrong_key, context in itertools.product((key, other), (b"round 1|share 2->6", b"round 1|share 2->5")):
        if (wrong_key, context) != (key, b"round 1|share 2->5"):
            with pytest.raises(InvalidTag):
                unseal(wrong_key, sealed, context)


def test_a_digest_binds_the_share_and_its_context():
    share = os.urandom(66)
    assert commitment(share, b"a") == commitment(share, b"a")
    assert commitment(share, b"a") != commitment(share, b"b")
    assert commitment(share, b"a") != commitment(bytes(66), b"a")
