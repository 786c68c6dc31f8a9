"""EMD-CFL's options for federations of small silos (docs/research/SMALL_SILOS.md): each option's
decision, on its own."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import yaml
from jobs import PROJECT_ROOT, run_job, simulate_job

from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.ot.energy import energy_distance
from cfl_mpi.privacy.handshake import random_projection
from cfl_mpi.strategies.emdcfl import EmdCflConfig
from cfl_mpi.strategies.emdcfl.parts import distance_of


def test_pair_tau_is_w1_through_the_pairs_projection():
    rng = np.random.default_rng(0)
    z, v = rng.random((12, 6)), rng.random((8, 6))  # non-negative, as ReLU embeddings
    r = random_projection(rng, 6, 5, "gaussian")
    cut = z[np.linspace(0, 11, 8).round().astype(int)]  # the larger cloud cut to the smaller's size
    expected = ot.emd2(ot.unif(8), ot.unif(8), ot.dist(cut @ r, v @ r, metric="cosine"))
    assert distance_of(EmdCflConfig(tau_projection="pair")).pair_reference(z @ r, v, r) == pytest.approx(
        expected, abs=1e-9
    )


def test_pair_tau_takes_the_projections_distortion_out_of_the_noise():
    """One distribution, two samples: W1 is mostly the samples' own spread, which a random R
    rescales; subtracting τ through the same R cancels that (the noise falls ~2x on trained
    silos, docs/research/SMALL_SILOS.md), subtracting an unprojected τ does not."""
    rng = np.random.default_rng(1)
    centres = rng.random((10, 32)) * 3
    cloud = np.maximum(centres[rng.integers(0, 10, 330)] + rng.normal(size=(330, 32)), 0.0)
    z, v = cloud[:300], cloud[300:]
    noise = {
        mode: distance_of(EmdCflConfig(tau_projection=mode, projection="gaussian", match_classes=False)).reference(
            z, v, 28, np.random.default_rng(2)
        )
        for mode in ("none", "pair")
    }
    assert noise["pair"][0] is None and noise["none"][0] > 0
    assert noise["none"][1] > 2 * noise["pair"][1]


@pytest.mark.job
def test_validation_rows_lent_to_the_clustering_train_from_the_next_round(tmp_path):
    """Sites of 80 rows (16 to test) hold out 26 for EMD-CFL's τ and noise in round 1, where
    the paper's 10 % would be 6; from round 2 on they train on the 58 rows that split leaves,
    and the default screening takes the larger counts as honest."""
    rng = np.random.default_rng(0)
    for site in range(4):
        np.savez(tmp_path / f"site{site}.npz", x=rng.random((80, 10), dtype=np.float32), y=np.arange(80) % 2)
    config = tmp_path / "sites.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "silos": 4,
                "data": {"name": "silo_files", "files": str(tmp_path / "site{silo}.npz")},
                "model": {"name": "mlp"},
                "train": {"rounds": 3, "local_epochs": 1},
                "strategy": {"name": "emdcfl", "pair_keys": "seeded"},
            }
        )
    )
    _, records = simulate_job(str(config), tmp_path / "out")
    assert [r["samples"] for r in records] == [[38] * 4, [58] * 4, [58] * 4]
    assert all(r["rejected"] == [] for r in records)


@pytest.mark.job
def test_pair_tau_run_records_one_tau_per_ordered_pair(tmp_path):
    summary, records = simulate_job(
        "configs/digits.yaml",
        tmp_path,
        "silos=4",
        "data.rotations=[0,180]",
        "train.rounds=1",
        "strategy.pair_keys=seeded",
        "strategy.tau_projection=pair",
    )
    tau = np.load(tmp_path / "tau.npy")
    off = ~np.eye(4, dtype=bool)
    assert tau.shape == (4, 4) and np.isnan(tau[~off]).all() and (tau[off] > 0).all()
    assert len(set(tau[off].round(12))) == 12  # each pair's own R
    assert records[0]["ari"] == 1.0 and summary["n_clusters"] == 2


def test_energy_noise_is_the_spread_of_w_between_samples_of_one_distribution():
    """`distance: energy`: τ is 0 and the silo's noise, from its own n embeddings alone, is the
    spread of W[c][c'] when c' holds c's distribution (n points each, fresh R each pair).
    Measured over 3 seeds and n = 30, 60, 200: estimate / true spread 0.93-1.06."""
    rng = np.random.default_rng(0)
    centres = rng.random((10, 32)) * 3

    def draw(n: int) -> np.ndarray:  # ReLU'd clusters, as embeddings
        return np.maximum(centres[rng.integers(0, 10, n)] + rng.normal(size=(n, 32)), 0.0)

    energy = distance_of(EmdCflConfig(distance="energy", ground_cost="chordal"))
    spread = np.std(
        [
            energy_distance(draw(60) @ (r := random_projection(rng, 32, 28, "gaussian")), draw(60) @ r, "chordal")
            for _ in range(200)
        ]
    )
    estimates = [energy.reference(draw(60), draw(6), 28, rng) for _ in range(20)]
    assert all(tau == 0.0 for tau, _ in estimates)
    assert 0.75 < np.mean([noise for _, noise in estimates]) / spread < 1.33


@pytest.mark.job
def test_energy_run_finds_the_rotations_with_no_tau(tmp_path):
    summary, records = simulate_job(
        "configs/digits.yaml",
        tmp_path,
        "silos=4",
        "data.rotations=[0,180]",
        "train.rounds=1",
        "strategy.pair_keys=seeded",
        "strategy.distance=energy",
        "strategy.ground_cost=chordal",
    )
    assert (np.load(tmp_path / "tau.npy") == 0).all() and (np.load(tmp_path / "noise.npy") > 0).all()
    assert records[0]["ari"] == 1.0 and summary["n_clusters"] == 2
    print(f"digits, 4 silos, energy: margin {summary['extraction']['margin']:.2f}")


@pytest.mark.mpi
def test_one_hundred_small_silos_on_two_ranks_find_the_four_rotations(shared_data, tmp_path):
    """The small-silo config at C = 100 (25 silos of ~360 images per rotation), 50 silos on each
    of 2 ranks, with a narrower CNN and the staged pair plan to stay within a minute or two
    (all 4,950 pairs took ~3.5x as long, the silos' cross embeddings most of it). Measured:
    the extraction's margin over the 1,260 pairs it measures 3.16 (seed 0) and 5.29 (seed 1)
    (all pairs: 3.99 and 5.88), against the asserted 1.0."""
    proc, summary, records = run_job(
        "configs/rotated_mnist_small_silos.yaml",
        tmp_path,
        f"data.root={shared_data / 'mnist'}",
        "data.download=false",
        "train.rounds=1",
        "model.channels=[16,32]",
        "model.embedding_dim=64",
        "strategy.pair_keys=seeded",
        "strategy.pairs=staged",
        n=3,
    )
    assert "100 silos on 2 ranks (up to 50 per rank)" in proc.stdout
    assert records[0]["ari"] == 1.0 and summary["n_clusters"] == 4
    assert summary["extraction"]["margin"] > 1.0
    print(f"C = 100: ARI 1.0, margin {summary['extraction']['margin']:.2f}")


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "strategy.tau_projection=pair --set strategy.distance=fedwad --set strategy.ground_cost=chordal",
            "strategy.tau_projection: pair needs the server to measure each pair",
        ),
        ("strategy.distance=energy", "strategy.ground_cost: distance energy needs a Euclidean distance"),
        (
            "strategy.distance=energy --set strategy.ground_cost=chordal --set strategy.tau_projection=pair",
            "strategy.tau_projection: distance energy subtracts no τ",
        ),
    ],
)
def test_option_errors_name_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(PROJECT_ROOT / "configs/digits.yaml", override.split(" --set "))
    assert message in str(err.value) and "\n" not in str(err.value)
