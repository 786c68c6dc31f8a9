"""EMD-CFL's W class by class (strategy.match_classes): the matched rows, the entry against POT
on them, label skew within the noise and a shift of the inputs far beyond it, and the server's
refusal of labels that do not fit."""

from __future__ import annotations

import numpy as np
import ot
import pytest
from emdcfl_wire import batch, server_with_plan
from jobs import PROJECT_ROOT, simulate_job

from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.strategies.emdcfl import EmdCflConfig
from cfl_mpi.strategies.emdcfl.classes import matched_rows, to_full_sample
from cfl_mpi.strategies.emdcfl.direct import Direct, Measured, Served
from cfl_mpi.strategies.emdcfl.messages import Embeddings
from cfl_mpi.strategies.emdcfl.parts import distance_of
from cfl_mpi.wire.messages import ProtocolError

MATCHED = "strategy.match_classes=auto"
MARGIN = 1.0  # noise units between the cut and the nearest entry on either side


def test_matched_rows_take_the_smallest_count_of_each_class_the_three_samples_hold():
    own = np.array([0, 0, 0, 1, 1, 2, 3, 3])
    cross = np.array([0, 1, 1, 1, 2, 2, 2, 5])
    val = np.array([0, 0, 1, 1, 1, 1, 2, 3])
    a, b, v = matched_rows(own, cross, val, np.random.default_rng(0))
    for rows, labels in ((a, own), (b, cross), (v, val)):
        assert sorted(labels[rows].tolist()) == [0, 1, 1, 2]  # class 3 is not in cross, 5 not in own
        assert len(set(rows.tolist())) == len(rows)
    assert [len(r) for r in matched_rows(own, np.array([4, 4]), val, np.random.default_rng(0))] == [0, 0, 0]


def test_an_entry_on_m_rows_is_rescaled_to_the_silos_own_sizes():
    assert to_full_sample(40, 40, 40) == pytest.approx(1.0)
    assert to_full_sample(10, 40, 40) == pytest.approx(2.0)  # W1's spread goes like (1/a + 1/b)^(1/2)


def _emd2(x: np.ndarray, y: np.ndarray) -> float:
    cost = ot.dist(x.astype(np.float64), y.astype(np.float64), metric="cosine")
    return float(ot.emd2(np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y)), cost))


def test_the_server_takes_w_and_tau_on_the_matched_rows_as_pot_does():
    """Silo 0 serves silo 1: its cloud, labels and validation cloud through R; silo 1's cross
    cloud and labels. W[0][1] is POT's W1 on the matched rows less τ on silo 0's matched rows,
    rescaled to its full sample; τ is recorded per pair."""
    server, ctx, silos = server_with_plan([(0, 1)], MATCHED)
    assert server.parts.classes and server.tau.shape == (3, 3)
    dim, rng = server.dim_r, np.random.default_rng(3)
    own, cross, val = (np.abs(rng.normal(size=(n, dim))).astype(np.float32) for n in (12, 12, 10))
    own_y, cross_y, val_y = rng.integers(0, 3, 12), rng.integers(0, 3, 12), rng.integers(0, 3, 10)
    silos[0].send(
        -1,
        Embeddings.KIND,
        1,
        batch(dim, [1], [own], [0.0], own_labels=[own_y], val=[val], val_labels=[val_y]),
        noise=0.01,
    )
    silos[1].send(-1, Embeddings.KIND, 1, batch(dim, measured=[0], cross=[cross], cross_labels=[cross_y]), noise=0.0)
    server._measure(ctx, server.partners)

    a, b, v = matched_rows(own_y, cross_y, val_y, np.random.default_rng([server.run.seed, 1, 0, 1]))
    tau = _emd2(own[a], val[v])
    expected = (_emd2(own[a], cross[b]) - tau) / to_full_sample(len(a), 12, 10)
    assert server.W[0, 1] == pytest.approx(expected, abs=1e-9)
    assert server.tau[0, 1] == pytest.approx(tau, abs=1e-9)
    assert server.noise[0] == 0.01


def test_a_pair_with_no_class_in_common_stays_unmeasured_and_is_recorded():
    server, ctx, silos = server_with_plan([(0, 1)], MATCHED)
    dim, ones = server.dim_r, np.ones((6, server.dim_r))
    silos[0].send(
        -1,
        Embeddings.KIND,
        1,
        batch(dim, [1], [ones], [0.0], own_labels=[np.zeros(6)], val=[ones], val_labels=[np.zeros(6)]),
        noise=0.01,
    )
    silos[1].send(-1, Embeddings.KIND, 1, batch(dim, measured=[0], cross=[ones], cross_labels=[np.ones(6)]), noise=0.0)
    server._measure(ctx, server.partners)
    assert np.isnan(server.W[0, 1]) and server.record.unmatched == {(0, 1)}


@pytest.mark.parametrize(
    "case, words",
    [
        ("no labels", "clouds without their rows' labels"),
        ("beyond the classes", "a label beyond the run's 10 classes"),
        ("one label short", "labels of shapes"),
        ("a negative label", "a negative label"),
        ("labels unasked", "labels, where the run does not match classes"),
    ],
)
def test_labels_that_do_not_fit_are_named(case, words):
    """Each names the silo, the kind, the round and the fault: never a W from them."""
    server, ctx, silos = server_with_plan(
        [(0, 1)], MATCHED if case != "labels unasked" else "strategy.match_classes=false"
    )
    dim, ones, labels = server.dim_r, np.ones((6, server.dim_r)), np.arange(6)
    arrays = {
        "no labels": batch(dim, [1], [ones], [0.0]),
        "beyond the classes": batch(dim, [1], [ones], [0.0], own_labels=[labels + 5], val=[ones], val_labels=[labels]),
        "one label short": batch(dim, [1], [ones], [0.0], own_labels=[labels[:5]], val=[ones], val_labels=[labels]),
        "a negative label": batch(dim, [1], [ones], [0.0], own_labels=[labels - 1], val=[ones], val_labels=[labels]),
        "labels unasked": batch(dim, [1], [ones], [0.0], own_labels=[labels], val=[ones], val_labels=[labels]),
    }[case]
    silos[0].send(-1, Embeddings.KIND, 1, arrays, noise=0.01)
    with pytest.raises(ProtocolError, match=f"silo 0 sent .*embeddings.* round 1.*{words}"):
        server._measure(ctx, server.partners)
    assert np.isnan(server.W[0, 1])


def _silo(rng: np.random.Generator, centres: np.ndarray, mix: list[float], n: int, turned: bool = False):
    """n ReLU-like embeddings of classes drawn from `mix`, each class around its centre; `turned`:
    every class's features moved along (what another scanner does to a model's features)."""
    y = rng.choice(len(mix), n, p=mix)
    z = np.maximum(centres[y] + rng.normal(size=(n, centres.shape[1])), 0.0)
    return (np.roll(z, 8, axis=1) if turned else z).astype(np.float32), y


def test_label_skew_alone_stays_within_the_noise_and_a_shift_of_the_inputs_does_not():
    """Silo 0 holds mostly class 0, silo 1 mostly class 1, the classes' embeddings alike: the
    whole samples' W puts them many noise units apart, the matched W within the noise; a shift
    of silo 2's embeddings of every class is far beyond it either way."""
    rng = np.random.default_rng(0)
    centres = rng.random((3, 32)) * 4
    z0, y0 = _silo(rng, centres, [0.8, 0.1, 0.1], 60)
    v0, w0 = _silo(rng, centres, [0.8, 0.1, 0.1], 60)
    z1, y1 = _silo(rng, centres, [0.1, 0.8, 0.1], 60)
    z2, y2 = _silo(rng, centres, [0.8, 0.1, 0.1], 60, turned=True)
    distance = distance_of(EmdCflConfig())
    direct = Direct(distance, 32, 512, classes=3, seed=0)
    whole_tau, _ = distance_of(EmdCflConfig(match_classes=False)).reference(z0, v0, 32, np.random.default_rng(1))
    _, noise = distance.reference(z0, v0, 32, np.random.default_rng(1))

    def matched(z, y):
        entries, _ = direct._distances(1, [(0, 1)], [Served(z0, y0, v0, w0)], [Measured(z, y)])
        return entries[0] / noise

    def whole(z):
        return (distance.between([z0], [z])[0] - whole_tau) / noise

    assert abs(matched(z1, y1)) < 2.0 < 8.0 < whole(z1)
    assert matched(z2, y2) > 8.0


def test_match_classes_resolves_and_refuses_what_it_cannot_measure():
    config = load_config(PROJECT_ROOT / "configs/digits.yaml", [])
    assert config.strategy.classes_matched and config.strategy.gap is None
    whole = load_config(PROJECT_ROOT / "configs/digits.yaml", ["strategy.match_classes=false"])
    assert not whole.strategy.classes_matched and whole.strategy.gap == 3
    for paper in ("configs/rotated.yaml", "configs/digits_fedwad.yaml"):  # τ through a full projection; FedWaD
        assert not load_config(PROJECT_ROOT / paper, []).strategy.classes_matched
    for sets, words in (
        (["strategy.distance=fedwad", "strategy.ground_cost=chordal"], "distance fedwad measures no τ"),
        (["strategy.tau_projection=full"], "matched classes take τ per pair"),
    ):
        with pytest.raises(ConfigError, match=f"strategy.match_classes: {words}"):
            load_config(PROJECT_ROOT / "configs/digits.yaml", [*sets, "strategy.match_classes=true"])


@pytest.mark.job
def test_groups_of_inverted_scans_stand_out_of_label_skew_inside_each(tmp_path):
    """Two groups of digit scans, one inverted, each skewed by Dirichlet(0.3) inside: class by
    class, the groups are the clusters, each well inside the cut and far beyond it apart."""
    from benchmarks.federation_data import Federation, build

    fed = Federation("digits_inverted_dir0.3", "digits", ("none", "inverted"), 4, "dirichlet", "test", alpha=0.3)
    build(fed, tmp_path / "fed", None, "own")
    summary, records = simulate_job(
        str(tmp_path / "fed" / "config.yaml"), tmp_path / "run", "train.rounds=1", "strategy.pair_keys=seeded"
    )
    extraction = summary["extraction"]
    assert records[0]["ari"] == 1.0
    assert extraction["min_between"] - extraction["threshold"] >= MARGIN
    assert extraction["threshold"] - extraction["max_within"] >= MARGIN
