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
from cfl_mpi.aggregation.masked_sums import MaskedSums, weighted_words
from cfl_mpi.aggregation.rules import AggregationConfig
from cfl_mpi.channel import SERVER, Alternative, LocalChannel, LocalHub
from cfl_mpi.config import ConfigError
from cfl_mpi.privacy.dp import PrivacyConfig, epsilon_spent
from cfl_mpi.privacy.masking import decode, encode
from cfl_mpi.runtime.checkpoint import load_checkpoint
from cfl_mpi.runtime.secure import ServerMasking, SiloMasking
from cfl_mpi.wire.messages import ProtocolError
from cfl_mpi.wire.round import Leave
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
        ({"privacy": {"dp": "central"}}, "set privacy.dp: distributed, where the silos add it"),
        (
            {"runtime": {"fault": {"silo": 1, "round": 1, "kind": "scaled_update"}}},
            "runtime.fault.kind: scaled_update plays with a plain update, which aggregation.secure masks",
        ),
    ],
)
def test_what_secure_aggregation_cannot_cover_is_a_config_error(tmp_path, overrides, message):
    section = {"aggregation": {"secure": True, "screen": False}} if overrides else {"aggregation": {"secure": True}}
    with pytest.raises(ConfigError) as err:
        config_from(tmp_path, {"silos": 4, "data": {"name": "rotated_digits"}, **section, **overrides})
    assert message in str(err.value)


def test_distributed_noise_needs_secure_aggregation(tmp_path):
    with pytest.raises(ConfigError, match="privacy.dp: distributed noise is sound only where the server reads sums"):
        config_from(tmp_path, {"silos": 4, "data": {"name": "rotated_digits"}, "privacy": {"dp": "distributed"}})


def test_a_fault_after_the_shares_needs_a_secure_round(tmp_path):
    with pytest.raises(ConfigError, match="raise_after_shares fails in a secure round"):
        fault = {"silo": 1, "round": 1, "kind": "raise_after_shares"}
        config_from(tmp_path, {"silos": 4, "data": {"name": "rotated_digits"}, "runtime": {"fault": fault}})


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


@pytest.mark.job
def test_a_silo_that_leaves_mid_round_leaves_the_model_of_the_others(tmp_path):
    """Silo 3 fails in round 2 once its key shares are dealt (drop): the round completes, and
    the models are those of the run in the clear where silo 3 fails as round 2 starts, the
    others' FedAvg. Measured: they differ by 2.8e-6 at most (the fixed point's rounding of
    round 1, grown by a round of training), against 3.6e-3 had silo 3's update stayed in."""
    run = [*SHORT[:2], "strategy.name=fedavg", "runtime.on_silo_failure=drop"]
    fault = ["runtime.fault.silo=3", "runtime.fault.round=2"]
    summary, records = simulate_job(
        "configs/digits.yaml", tmp_path / "secure", *run, *SECURE, *fault, "runtime.fault.kind=raise_after_shares"
    )
    simulate_job("configs/digits.yaml", tmp_path / "plain", *run, SECURE[0], *fault, "runtime.fault.kind=raise")
    assert [d["silo"] for d in records[1]["dropped"]] == [3] and "key shares of round 2" in records[1]["dropped"][0][
        "why"
    ]
    assert records[1]["participants"] == [0, 1, 2, 4, 5, 6, 7] and summary["avg_acc"] > 0
    for secure_model, plain_model in zip(models_of(tmp_path / "secure"), models_of(tmp_path / "plain")):
        for name, a in plain_model.items():
            np.testing.assert_allclose(secure_model[name], a, rtol=0, atol=1e-4)


@pytest.mark.job
def test_distributed_dp_reports_the_accountant_s_epsilon_and_keeps_emd_cfl_s_clusters(tmp_path):
    """Two secure rounds of the digits federation with the silos adding the noise: ε after each
    round is the accountant's for the same z, and the clusters (fixed in round 1, before any
    noise) are those of the run without DP."""
    plain, plain_records = simulate_job("configs/digits.yaml", tmp_path / "plain", *SHORT, *SECURE)
    private = ["privacy.dp=distributed", "privacy.clip=0.05", "privacy.noise_multiplier=1.5", "privacy.noise=seeded"]
    summary, records = simulate_job("configs/digits.yaml", tmp_path / "dp", *SHORT, *SECURE, *private)
    assert [r["privacy"]["epsilon"] for r in records] == [epsilon_spent(1.5, t, 1e-5) for t in (1, 2)]
    every = {"epsilon": epsilon_spent(1.5, 2, 1e-5), "rounds": 2}
    clusters = sorted(set(records[-1]["clusters"]))
    assert summary["privacy"] == {**every, "delta": 1e-5, "per_cluster": [{"cluster": k, **every} for k in clusters]}
    assert [r["clusters"] for r in records] == [r["clusters"] for r in plain_records]
    assert all(r["masked"] == list(range(8)) for r in records)


@pytest.mark.mpi
def test_a_secure_mpi_job_with_distributed_dp_finds_the_four_rotations(tmp_path):
    """The same exchange across real ranks (keys, setups, shares and masked updates through
    rank 0), each silo adding its share of the noise: the clusters of round 1, and the
    accountant's ε."""
    private = ["privacy.dp=distributed", "privacy.clip=0.05", "privacy.noise_multiplier=1.5"]
    proc, summary, records = run_job("configs/digits.yaml", tmp_path, *SHORT, *SECURE, *private)
    assert summary["ari"] == 1.0 and all(r["masked"] == list(range(8)) for r in records)
    assert all(r["bytes"]["mask_key"] > 0 and r["bytes"]["update"] == 0 for r in records)
    assert summary["privacy"]["epsilon"] == epsilon_spent(1.5, 2, 1e-5)


def channels(silos: int, timeout_s: float = 5.0):
    hub = LocalHub()
    return LocalChannel(SERVER, hub, timeout_s, 0.01), [LocalChannel(c, hub, timeout_s, 0.01) for c in range(silos)]


class Federation:
    """A secure round over in-process channels: the server and each silo as threads, random
    models, and whichever silos leave after dealing their shares (sending `Leave` in place of
    their masked update, as `runtime.on_silo_failure: drop` has them do)."""

    def __init__(
        self, silos: int, clusters: list[int], words: int = 40, seed: int = 0, privacy: PrivacyConfig | None = None
    ) -> None:
        rng = np.random.default_rng(seed)
        self.cfg, self.privacy = AggregationConfig(screen=False, secure=True), privacy
        self.like = {"w": np.zeros(words, np.float32)}
        self.models = {c: {"w": rng.normal(size=words).astype(np.float32)} for c in range(silos)}
        self.counts = rng.integers(5, 500, size=silos).tolist()
        self.clusters = np.asarray(clusters)
        self.server, self.silos = channels(silos)
        self.left: list[int] = []

    def serve(self, masking_class=None):
        leaving = Alternative(Leave.KIND, lambda _: Leave.expect(1), lambda msg: self.left.append(msg.sender))
        noised = self.privacy is not None and self.privacy.dp == "distributed"
        masking = ServerMasking(self.server, self.cfg, 0, 1, leaving, noised=noised)
        silos = list(range(len(self.silos)))
        return masking.run(silos, self.clusters, dict.fromkeys(silos, self.like), self.like)[0]

    def silo(self, c: int, leaves: bool = False, masking_class=SiloMasking):
        def fail():
            raise RuntimeError("out of memory")

        def body():
            try:
                masking_class(self.cfg, 0, len(self.silos), c, self.privacy).send(
                    self.silos[c], 1, self.models[c], self.like, self.counts[c], fail if leaves else lambda: None
                )
            except RuntimeError as err:
                self.silos[c].send(SERVER, Leave(str(err)), 1)

        return body

    def run(self, leave: tuple[int, ...] = (), liars: dict[int, type] | None = None):
        bodies = [self.silo(c, c in leave, (liars or {}).get(c, SiloMasking)) for c in range(len(self.silos))]
        return in_threads(self.serve, *bodies)

    def exact_sum(self, k: int, without: tuple[int, ...]) -> np.ndarray:
        """What the cluster's sum must be, word for word: its members' encoded updates."""
        members = [c for c in range(len(self.silos)) if self.clusters[c] == k]
        return sum(
            (encode(weighted_words(self.models[c], self.counts[c]), len(members)) for c in members if c not in without),
            np.zeros(len(self.like["w"]) + 1, np.uint64),
        )


def test_the_exchange_over_channels_gives_the_cluster_s_weighted_mean():
    """Server and six silos in two clusters as threads: keys, setups, shares, masked updates."""
    federation = Federation(6, [0, 1, 0, 1, 0, 1])
    sums, *silos = federation.run()
    assert silos == [None] * 6
    for k in (0, 1):
        assert np.array_equal(sums.sums[k], federation.exact_sum(k, ()))
    out, _ = sums.averages(federation.clusters, {})
    for c in range(6):
        mates = [m for m in range(6) if federation.clusters[m] == federation.clusters[c]]
        counts, models = federation.counts, federation.models
        mean = sum(counts[m] * models[m]["w"].astype(np.float64) for m in mates) / sum(counts[m] for m in mates)
        np.testing.assert_allclose(out[c]["w"], mean, rtol=1e-6)


@pytest.mark.parametrize(("silos", "leave"), [(8, (3,)), (8, (0, 7)), (64, (10,)), (64, (5, 6, 40))])
def test_a_silo_that_leaves_after_dealing_its_shares_leaves_the_others_exact_sum(silos, leave):
    """Its neighbours reveal their shares of its key, the server rebuilds it and takes its masks
    out: the sum is the others' updates word for word (64 silos: 12 neighbours each, 7 shares
    rebuild a key)."""
    federation = Federation(silos, [0] * silos)
    sums, *outcomes = federation.run(leave)
    assert sorted(federation.left) == list(leave) and outcomes == [None] * silos
    assert np.array_equal(sums.sums[0], federation.exact_sum(0, leave))
    assert sorted(sums.summed_into) == [c for c in range(silos) if c not in leave]


def test_distributed_noise_sums_to_the_central_noise_and_the_model_is_dp_fedavg_s():
    """Under privacy.dp: distributed each of the W silos adds N(0, (zC)²/W): their masked sum
    carries N(0, (zC)²) per value (20,000 values: the sample sd within 2 % of zC, 4 sd of
    its own spread 0.5 %) beside Σ clip(Δ_c), and the model is s̄ + (Σ clip(Δ) + noise) / W."""
    privacy = PrivacyConfig(dp="distributed", clip=0.5, noise_multiplier=2.0, noise="seeded")
    federation = Federation(8, [0] * 8, words=20_000, privacy=privacy)
    federation.models = {c: {"w": np.zeros(20_000, np.float32)} for c in range(8)}  # Δ = 0: the sum is the noise
    federation.models[3] = {"w": np.full(20_000, 0.01, np.float32)}  # ‖Δ‖ = 1.41: clipped to 0.5
    sums, *outcomes = federation.run()
    assert outcomes == [None] * 8
    total = decode(sums.sums[0])
    clipped = 0.5 / np.sqrt(20_000)
    assert total[-1] == 8  # one per silo: W
    assert abs(np.std(total[:-1]) / (2.0 * 0.5) - 1) < 0.02
    noise = sum(privacy.silo_noise(0, 1, c, 8, 20_000) for c in range(8))  # seeded: each silo's, again
    np.testing.assert_allclose(total[:-1] - noise, clipped, atol=1e-8)  # Σ clip(Δ_c): silo 3's, clipped
    out, _ = sums.averages(federation.clusters, {})
    np.testing.assert_allclose(out[0]["w"], (total[:-1] / 8).astype(np.float32), rtol=1e-6)


class RevealsAnother(SiloMasking):
    """A holder that reveals a share other than the one it was dealt."""

    def _reveal(self, channel, round, setup, dealt):
        super()._reveal(channel, round, setup, {j: bytes(len(share)) for j, share in dealt.items()})


def test_a_holder_that_reveals_another_share_is_named_and_no_honest_silo_is():
    federation = Federation(5, [0] * 5)
    sums, *outcomes = federation.run(leave=(2,), liars={4: RevealsAnother})
    assert outcomes == [None] * 5 and isinstance(sums, ProtocolError)
    assert "silo 4 revealed a share of silo 2's key in round 1 that is not the one it was dealt" in str(sums)


class SendsNoKey(SiloMasking):
    def send(self, channel, round, *args):
        channel.send(SERVER, MaskKey(np.zeros(32, np.uint8)), round)


def test_a_mask_key_that_agrees_no_secret_is_named_before_any_neighbour_gets_it():
    federation = Federation(3, [0] * 3)
    federation.server, federation.silos = channels(3, timeout_s=1.0)
    sums, *_ = federation.run(liars={1: SendsNoKey})
    assert isinstance(sums, ProtocolError) and "silo 1 sent a mask_key in round 1 that is no X25519 key" in str(sums)


@pytest.mark.parametrize(
    ("members", "graph", "error"),
    [
        ([1, 2], [[2], [1]], "without silo 0 or beyond the 2 silos"),
        ([0, 1, 2], [[1], [2], [0]], "a graph that is not one over the members (a repeated, outside or one-way"),
        ([0, 1], [[0], [1]], "a graph that is not one over the members"),
    ],
)
def test_a_setup_that_is_no_graph_over_the_cluster_is_a_protocol_error(members, graph, error):
    """The silo checks the server's setup before it deals anything: its own place, and a
    graph whose every edge runs both ways (else masks would not cancel, silently)."""
    server, (silo, _) = channels(2, timeout_s=1.0)
    keys = np.zeros((len(members), 32), np.uint8)
    setup = SecureSetup(0, 1, np.asarray(members, dtype=np.int64), keys, np.asarray(graph, dtype=np.int64))

    def serve():
        server.recv(0, MaskKey.expect(2))
        server.send(0, setup, 2)

    cfg = AggregationConfig(screen=False, secure=True)
    _, outcome = in_threads(serve, lambda: SiloMasking(cfg, 0, 2, 0).send(silo, 2, {"w": np.ones(3)}, None, 4))
    assert isinstance(outcome, ProtocolError) and error in str(outcome), outcome
