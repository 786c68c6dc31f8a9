"""Secure aggregation (`aggregation.secure`) in whole runs: the models are those of the same
run in the clear, the server reads nothing of any one silo's update, and what it cannot
cover is a config error."""

from __future__ import annotations

import numpy as np
import pytest
from config_files import config_from
from jobs import run_job, simulate_job
from threads import in_threads

import cfl_mpi.runtime.secure as secure_round
from cfl_mpi.aggregation.masked_sums import MaskedSums
from cfl_mpi.aggregation.rules import AggregationConfig
from cfl_mpi.channel import SERVER, LocalChannel, LocalHub, wait_all
from cfl_mpi.config import ConfigError
from cfl_mpi.runtime.checkpoint import load_checkpoint
from cfl_mpi.runtime.secure import SiloMasking, receive_masked, send_setups
from cfl_mpi.wire.messages import ProtocolError
from cfl_mpi.wire.secure import MaskKey, SecureSetup

SECURE = ["aggregation.screen=false", "aggregation.secure=true"]
SHORT = ["train.rounds=2", "train.local_epochs=1", "strategy.pair_keys=seeded"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "aggregation.secure: the server reads the cluster's masked sum, never one update"),
        ({"aggregation": {"secure": True, "screen": False, "rule": "median"}}, "can neither screen nor take medians"),
        ({"aggregation": {"secure": True, "screen": False, "secure_neighbours": 3}}, "must be even and at least 2"),
        ({"strategy": {"name": "cfl"}}, "aggregation.secure: cfl's server reads each silo's update"),
        ({"strategy": {"name": "ifca", "k": 2}}, "aggregation.secure: ifca's server reads each silo's update"),
        ({"privacy": {"dp": "central"}}, "aggregation.secure: privacy.dp central adds its noise"),
        ({"runtime": {"on_silo_failure": "drop"}}, "set runtime.on_silo_failure: abort"),
    ],
)
def test_what_secure_aggregation_cannot_cover_is_a_config_error(tmp_path, overrides, message):
    section = {"aggregation": {"secure": True, "screen": False}} if overrides else {"aggregation": {"secure": True}}
    with pytest.raises(ConfigError) as err:
        config_from(tmp_path, {"silos": 4, "data": {"name": "rotated_digits"}, **section, **overrides})
    assert message in str(err.value)


def models_of(out) -> list[dict[str, np.ndarray]]:
    ckpt = load_checkpoint(out)
    return [ckpt.model_of(c) for c in range(8)]


@pytest.mark.job
def test_secure_emd_cfl_trains_the_models_of_the_same_run_in_the_clear(tmp_path):
    """Two rounds of the digits federation, EMD-CFL's default strategy: the masked sums give
    the clusters, accuracies and models of the run that sends its updates in the clear (the
    fixed point is exact to 2^-33 a value, under float32's own rounding), and no update and no
    sample count reaches the server."""
    plain, plain_records = simulate_job("configs/digits.yaml", tmp_path / "plain", *SHORT, SECURE[0])
    summary, records = simulate_job("configs/digits.yaml", tmp_path / "secure", *SHORT, *SECURE)
    assert [r["clusters"] for r in records] == [r["clusters"] for r in plain_records]
    assert summary["ari"] == plain["ari"] == 1.0
    for secure_record, plain_record in zip(records, plain_records):
        np.testing.assert_allclose(secure_record["accuracy"], plain_record["accuracy"], atol=0.02)
        assert secure_record["masked"] and secure_record["bytes"]["update"] == 0
        assert secure_record["bytes"]["masked_update"] <= 2 * plain_record["bytes"]["update"]  # 8-byte words
        assert secure_record["samples"] == [None] * 8
    for secure_model, plain_model in zip(models_of(tmp_path / "secure"), models_of(tmp_path / "plain")):
        for name, a in plain_model.items():
            np.testing.assert_allclose(secure_model[name], a, rtol=1e-5, atol=1e-6)


@pytest.mark.job
def test_the_server_reads_masked_words_alone_uncorrelated_with_any_update_and_their_sum_exact(tmp_path, monkeypatch):
    """Every array the server is handed in a secure FedAvg run under norm_clip, beside what
    each silo masked (its clipped, weighted update in fixed point): each uncorrelated with
    every silo's update (|r| under 0.05 over ~880,000 words, noise's sd ~0.001), their sum the
    sum of the updates exactly; and the models are those of norm_clip in the clear, which
    clips on the server."""
    unmasked: dict[int, np.ndarray] = {}
    seen: dict[int, np.ndarray] = {}
    mask_words, add = secure_round.masked, MaskedSums.add

    def recording_mask(words, own, secrets):
        unmasked[own] = words.copy()
        return mask_words(words, own, secrets)

    def recording_add(self, silo, words):
        seen[silo] = words.copy()
        return add(self, silo, words)

    monkeypatch.setattr(secure_round, "masked", recording_mask)
    monkeypatch.setattr(MaskedSums, "add", recording_add)
    run = [*SHORT[:2], "strategy.name=fedavg", "aggregation.rule=norm_clip", "aggregation.clip_norm=0.5"]
    simulate_job("configs/digits.yaml", tmp_path / "secure", *run, *SECURE)
    simulate_job("configs/digits.yaml", tmp_path / "plain", *run, SECURE[0])
    assert sorted(seen) == sorted(unmasked) == list(range(8))
    for c in range(8):
        as_read = seen[c].astype(np.float64)
        for other in range(8):
            assert abs(np.corrcoef(as_read, unmasked[other].view(np.int64).astype(np.float64))[0, 1]) < 0.05
    assert np.array_equal(sum(w.view(np.uint64) for w in seen.values()), sum(unmasked.values()))
    for secure_model, plain_model in zip(models_of(tmp_path / "secure"), models_of(tmp_path / "plain")):
        for name, a in plain_model.items():
            np.testing.assert_allclose(secure_model[name], a, rtol=1e-5, atol=1e-6)


@pytest.mark.mpi
def test_a_secure_mpi_job_finds_the_four_rotations(tmp_path):
    """The same exchange across real ranks: setups, mask keys between silo ranks, masked updates."""
    proc, summary, records = run_job("configs/digits.yaml", tmp_path, *SHORT, *SECURE)
    assert summary["ari"] == 1.0 and all(r["masked"] for r in records)
    assert all(r["bytes"]["mask_key"] > 0 and r["bytes"]["update"] == 0 for r in records)


def channels(silos: int):
    hub = LocalHub()
    return LocalChannel(SERVER, hub, 5.0, 0.01), [LocalChannel(c, hub, 5.0, 0.01) for c in range(silos)]


def test_the_exchange_over_channels_gives_the_cluster_s_weighted_mean():
    """Server and four silos in two clusters as threads: setups, keys, masked updates, sums."""
    cfg = AggregationConfig(screen=False, secure=True)
    rng = np.random.default_rng(3)
    like = {"w": np.zeros(50, np.float32)}
    models = {c: {"w": rng.normal(size=50).astype(np.float32)} for c in range(4)}
    counts, clusters = [5, 7, 11, 13], np.array([0, 1, 0, 1])
    server, silos = channels(4)

    def serve():
        sends, _ = send_setups(server, cfg, 0, 1, clusters, [0, 1, 2, 3])
        sums, _ = receive_masked(server, 1, [0, 1, 2, 3], clusters, dict.fromkeys(range(4), like), like)
        wait_all(sends)
        return sums.averages(clusters, {})[0]

    def silo(c):
        return lambda: SiloMasking(cfg, 0, 4, c).send(silos[c], 1, models[c], None, counts[c])

    out, *_ = in_threads(serve, *(silo(c) for c in range(4)))
    for c in range(4):
        mates = [m for m in range(4) if clusters[m] == clusters[c]]
        mean = sum(counts[m] * models[m]["w"].astype(np.float64) for m in mates) / sum(counts[m] for m in mates)
        np.testing.assert_allclose(out[c]["w"], mean, rtol=1e-6)


@pytest.mark.parametrize(
    ("neighbours", "public_key", "error"),
    [
        ([1], np.zeros(32, np.uint8), "silo 1 sent a mask_key in round 2 that is no X25519 public key"),
        ([0, 1], None, "names silos [0, 1] as neighbours of silo 0 (itself, or beyond the 2 silos)"),
    ],
)
def test_a_bad_key_or_setup_is_a_protocol_error_naming_who_sent_it(neighbours, public_key, error):
    server, (honest, other) = channels(2)
    cfg = AggregationConfig(screen=False, secure=True)

    def serve():
        server.send(0, SecureSetup(0, 3, np.asarray(neighbours, dtype=np.int64)), 2)

    def hostile():
        if public_key is not None:
            other.send(0, MaskKey(public_key), 2)

    _, outcome, _ = in_threads(
        serve, lambda: SiloMasking(cfg, 0, 2, 0).send(honest, 2, {"w": np.ones(3, np.float32)}, None, 4), hostile
    )
    assert isinstance(outcome, ProtocolError) and error in str(outcome)
