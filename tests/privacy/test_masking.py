"""Secure aggregation's arithmetic: masks that cancel in a cluster's sum modulo 2^64, the
fixed point and its bound, SecAgg+'s Harary graph, and masked words that alone say nothing."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cfl_mpi.aggregation.masked_sums import MaskedSums, weighted_words
from cfl_mpi.privacy.masking import FRACTION_BITS, decode, encode, mask, masked, neighbour_count, neighbours


def secrets_of(graph: dict[int, list[int]], rng: np.random.Generator) -> dict[tuple[int, int], bytes]:
    """One random 32-byte secret per edge (what HKDF gives both ends of a pair)."""
    return {(a, b): rng.bytes(32) for a in graph for b in graph[a] if a < b}


def masked_all(updates: dict[int, np.ndarray], graph: dict[int, list[int]], seed: int = 0) -> dict[int, np.ndarray]:
    pair = secrets_of(graph, np.random.default_rng(seed))
    n = len(updates)
    return {c: masked(encode(u, n), c, {o: pair[min(c, o), max(c, o)] for o in graph[c]}) for c, u in updates.items()}


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 24), st.integers(0, 2**32 - 1), st.sampled_from([None, 2, 4]))
def test_the_masks_cancel_in_the_sum_and_the_sum_is_exact_to_the_fixed_point(n, seed, k):
    rng = np.random.default_rng(seed)
    members = sorted(rng.choice(100, size=n, replace=False).tolist())
    graph = neighbours(members, neighbour_count(n, k), rng)
    updates = {c: rng.normal(0, 50, size=37) for c in members}
    total = sum(masked_all(updates, graph, seed).values(), np.zeros(37, dtype=np.uint64))
    exact = sum(updates.values())
    assert np.abs(decode(total) - exact).max() <= n * 2.0 ** -(FRACTION_BITS + 1)


@pytest.mark.parametrize(
    ("n", "k", "degree"), [(5, None, 4), (9, None, 8), (10, None, 8), (40, None, 12), (200, None, 16), (40, 6, 6)]
)
def test_the_graph_is_harary_s_k_regular_and_connected_even_without_any_k_minus_1_members(n, k, degree):
    """Connected after removing any k − 1 members: no coalition of fewer than k neighbours
    of a silo cut it off from the rest (SecAgg+'s graph)."""
    members = list(range(3, 3 + n))
    assert neighbour_count(n, k) == degree
    graph = neighbours(members, degree, np.random.default_rng(n))
    g = nx.Graph([(a, b) for a in graph for b in graph[a]])
    assert all(len(graph[m]) == degree for m in members)
    assert all(a in graph[b] for a in graph for b in graph[a])  # symmetric
    assert nx.node_connectivity(g) == degree


def test_a_sum_that_could_leave_the_fixed_point_is_an_overflow_error_naming_the_value():
    assert encode(np.array([1e6]), members=40).view(np.int64)[0] == 10**6 * 2**FRACTION_BITS
    with pytest.raises(OverflowError, match="a value of 1e\\+08 does not fit .* in a cluster of 40"):
        encode(np.array([1.0, 1e8]), members=40)


def test_the_mask_is_the_secret_s_aes_ctr_stream_and_differs_between_secrets():
    """AES-256 of the counter blocks 0, 1, 2, ... under the secret (one block cipher call a
    block, an independent construction of CTR mode), read as little-endian words."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    a, b = bytes(range(32)), bytes(range(1, 33))
    block = Cipher(algorithms.AES(a), modes.ECB()).encryptor()
    counters = b"".join(i.to_bytes(16, "big") for i in range(250))  # 250 blocks: 500 words
    expected = np.frombuffer(block.update(counters), dtype="<u8")
    assert np.array_equal(mask(a, 500), expected)
    assert np.array_equal(mask(a, 1000)[:10], mask(a, 10))
    assert not np.array_equal(mask(a, 1000), mask(b, 1000))
    bits = np.unpackbits(mask(a, 4096).view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.01  # 262144 bits: the mean's sd is 0.001


def test_a_masked_update_alone_is_uncorrelated_with_the_update():
    """What the server reads of one silo: uniform words, whose correlation with the update is
    that of noise (sd 1/sqrt(5000) ≈ 0.014; the bound is 7 sd)."""
    rng = np.random.default_rng(1)
    members = list(range(6))
    updates = {c: rng.normal(0, 1, size=5000) + np.linspace(0, 3, 5000) for c in members}
    seen = masked_all(updates, neighbours(members, 4, rng))
    for c in members:
        as_numbers = seen[c].view(np.int64).astype(np.float64)
        for other in members:
            assert abs(np.corrcoef(as_numbers, updates[other])[0, 1]) < 0.1


def test_masked_sums_give_fedavg_s_weighted_mean_and_keep_integer_buffers_from_the_start():
    rng = np.random.default_rng(2)
    like = {"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32), "steps": np.array(7, np.int64)}
    models = {
        c: {**like, "w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}
        for c in range(5)
    }
    counts = {0: 10, 1: 30, 2: 5, 3: 12, 4: 40}
    clusters = np.array([0, 0, 1, 1, 1])
    starts = {c: like for c in range(5)}
    sums = MaskedSums(3, clusters, starts)
    for k in (0, 1):
        members = [c for c in range(5) if clusters[c] == k]
        graph = neighbours(members, neighbour_count(len(members)), rng)
        words = masked_all({c: weighted_words(models[c], counts[c]) for c in members}, graph, seed=k)
        for c in members:
            sums.add(c, words[c].view(np.int64))
    out, decisions = sums.averages(clusters, {})
    for c in range(5):
        members = [m for m in range(5) if clusters[m] == clusters[c]]
        total = sum(counts[m] for m in members)
        for name in ("w", "b"):
            mean = sum(counts[m] * models[m][name].astype(np.float64) for m in members) / total
            np.testing.assert_allclose(out[c][name], mean, rtol=1e-6, atol=1e-7)
        assert out[c]["steps"] == 7
    assert [d.silo for d in decisions] == list(range(5))
