"""The server's batched pair distances: each entry the bits of the one-pair distance."""

import numpy as np
import pytest

from cfl_mpi.strategies.emdcfl import EmdCflConfig
from cfl_mpi.strategies.emdcfl.distances import pair_distance
from cfl_mpi.strategies.emdcfl.parts import distance_of

SETTINGS = {
    "exact cosine": EmdCflConfig(),
    "exact chordal": EmdCflConfig(ground_cost="chordal"),
    "exact sqeuclidean": EmdCflConfig(ground_cost="sqeuclidean"),
    "sinkhorn": EmdCflConfig(distance="sinkhorn"),
    "energy": EmdCflConfig(distance="energy", ground_cost="chordal"),
    "fedwad's local references": EmdCflConfig(distance="fedwad", ground_cost="euclidean"),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_batch_of_pairs_gives_each_pairs_distance_bit_for_bit(setting):
    distance = distance_of(SETTINGS[setting])
    rng = np.random.default_rng(5)
    # clouds of several sizes in one batch (equal, a multiple, neither), as a message's pairs are
    sizes = [(30, 30), (30, 30), (17, 34), (29, 31), (30, 30), (17, 34), (2, 5)]
    xs = [rng.normal(size=(n, 9)).astype(np.float32) + 0.3 * k for k, (n, _) in enumerate(sizes)]
    ys = [rng.normal(size=(m, 9)).astype(np.float32) for _, m in sizes]
    batched = distance.between(xs, ys)
    assert batched.shape == (len(sizes),)
    for k, (x, y) in enumerate(zip(xs, ys)):
        assert batched[k] == pair_distance(distance, x, y), (k, sizes[k])


def uniform_w1(x: np.ndarray, y: np.ndarray, metric: str) -> float:
    """The plain reference: POT's network simplex on the full plan."""
    import ot

    from cfl_mpi.ot.wasserstein import ground_cost

    n, m = len(x), len(y)
    return float(ot.emd2(np.full(n, 1 / n), np.full(m, 1 / m), ground_cost(x, y, metric), numItermax=10_000_000))


@pytest.mark.parametrize("n,m,cut", [(40, 40, (40, 40)), (41, 40, (40, 40)), (25, 60, (25, 50)), (11, 90, (11, 44))])
@pytest.mark.parametrize("metric", ["cosine", "chordal"])
def test_tau_is_w1_between_the_clouds_cut_to_assignment_sizes(n, m, cut, metric):
    """τ by LAPJV alone: POT's W1 at equal sizes; at unequal ones POT's W1 between the larger
    cloud's evenly spaced rows, as many as a multiple of the smaller (at most 4-fold)."""
    from cfl_mpi.ot.wasserstein import assignment_sizes

    distance = distance_of(EmdCflConfig(ground_cost=metric))
    rng = np.random.default_rng(n + m)
    x, y = rng.normal(size=(n, 12)) + 0.4, rng.normal(size=(m, 12))
    assert assignment_sizes(n, m) == cut
    keep_x = np.linspace(0, n - 1, cut[0]).round().astype(int)
    keep_y = np.linspace(0, m - 1, cut[1]).round().astype(int)
    assert len(set(keep_x)) == cut[0] and len(set(keep_y)) == cut[1]
    np.testing.assert_allclose(distance.tau_between(x, y), uniform_w1(x[keep_x], y[keep_y], metric), rtol=1e-12)
    if n == m:
        assert distance.tau_between(x, y) == pair_distance(distance, x, y)  # the paper's τ, to the bit


def test_an_emd_cfl_silo_computes_its_tau_and_noise_with_lapjv_alone():
    """The exact solver's silo loads `lap` for its τ and noise, never POT, scipy.optimize or
    scikit-learn (about a second of every silo rank's start-up); its server still loads them."""
    import subprocess
    import sys

    from conftest import PROJECT_ROOT

    code = (
        "import sys, numpy as np\n"
        "from cfl_mpi.config import load_config\n"
        "from cfl_mpi.runtime.halves import run_facts\n"
        "from cfl_mpi.strategies.emdcfl.silo import EmdCflSilo\n"
        "cfg = load_config('configs/digits.yaml')\n"
        "silo = EmdCflSilo(cfg.strategy, run_facts(cfg))\n"
        "for name in silo.modules(): __import__(name)\n"
        "rng = np.random.default_rng(0)\n"
        "z_own, z_val = rng.normal(size=(37, 16)), rng.normal(size=(30, 16))\n"
        "d = silo.parts.distance\n"
        "print(d.reference(z_own, z_val, 14, rng), d.tau_between(z_own, z_val))\n"
        "print(sorted(m for m in ('ot', 'scipy.optimize', 'sklearn') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout
    assert "cfl_mpi.ot.solvers" in distance_of(EmdCflConfig()).modules


def test_how_clear_the_clusters_are_is_said_in_words():
    from cfl_mpi.strategies.emdcfl.server import how_clear

    base = {"rule": "robust", "noise_scale": 0.01, "threshold": 3.5}
    one = how_clear({**base, "n_clusters": 1, "max_within": 2.14, "margin": None, "min_between": None}, 3.0)
    assert (
        one
        == "no groups found above the noise: the farthest pair of silos is 2.14 noise units apart, under the cut at 3.5"
    )
    spread = how_clear({**base, "n_clusters": 1, "max_within": 3.76, "margin": None, "min_between": None}, 3.0)
    assert spread == (
        "no groups found above the noise: the farthest pair of silos is 3.76 noise units apart, but no two groups of "
        "silos are farther than the cut at 3.5 on average"
    )
    continuum = {"n_clusters": 1, "max_within": 9.1, "margin": None, "min_between": None, "noise_clusters": 4}
    continuum |= {"refused_clusters": 2, "refused_gap": 2.04}
    said = how_clear({**base, **continuum}, 3.0)
    assert said is not None and said.startswith("no groups found above the noise: the silos differ beyond it (the cut")
    assert "parts them into 4" in said and "no split joins 3 times farther apart" in said
    assert said.endswith(
        "one cluster; the clearest split refused, into 2 at a gap of 2.0, is kept with strategy.clear_gap at or under "
        "that (null: the noise cut's 4)"
    )
    weak = how_clear({**base, "n_clusters": 3, "max_within": 3.1, "margin": 0.4, "min_between": 1.24}, 3.0)
    assert weak is not None and weak.startswith(
        "a weak split into 3 clusters at a margin of 0.40: the closest pair across clusters (1.24 noise units) is no "
        "farther apart than the farthest pair inside one"
    )
    kept = {"n_clusters": 2, "max_within": 4.0, "margin": 2.0, "min_between": 8.0, "noise_clusters": 6, "gap": 7.1}
    kept |= {"refused_clusters": 3, "refused_gap": 2.48}
    assert how_clear({**base, **kept}, 3.0) == (
        "2 clusters at a clear gap of 7.1: the cut at 3.5 noise units parts the silos into 6, but those inside each "
        "differ by small steps, not groups; the clearest split refused, into 3 at a gap of 2.4, is kept with "
        "strategy.clear_gap at or under that (null: the noise cut's 6)"
    )
    assert how_clear({**base, "n_clusters": 4, "max_within": 2.0, "margin": 3.2, "min_between": 6.4}, 3.0) is None
    assert how_clear({**base, "rule": "neighbourhoods", "n_clusters": 1, "max_within": 0.01}, 3.0) is None


def test_silos_too_small_are_named_with_what_would_help():
    """The help follows what the server knows: a sample held back from more examples (a fixed
    fraction, or auto's validation-sized sample), none held back, or counts it never learns
    (aggregation.secure)."""
    from cfl_mpi.strategies.emdcfl.server import too_small

    assert too_small(EmdCflConfig(), {0: 30, 1: 64}, {0: 95, 1: 400}) is None
    fixed = too_small(EmdCflConfig(sample_fraction=0.1), {0: 9, 1: 64}, {0: 95, 1: 640})
    assert fixed is not None and fixed["silos"] == [0] and fixed["sample"] == [9] and fixed["examples"] == [95]
    assert fixed["help"].startswith("strategy.sample_fraction: auto")
    assert "0 (9 of 95)" in fixed["finding"]
    auto = too_small(EmdCflConfig(sample_fraction="auto"), {0: 9}, {0: 95})
    assert auto is not None and auto["help"].startswith("a larger data.val_fraction")
    whole = too_small(EmdCflConfig(sample_fraction="auto"), {0: 20}, {0: 20})
    assert whole is not None and whole["help"].startswith("only more examples")
    hidden = too_small(EmdCflConfig(sample_fraction="auto"), {0: 9, 1: 12}, {})
    assert hidden is not None and hidden["examples"] == [None, None]
    assert "not sent under aggregation.secure" in hidden["help"] and "a larger data.val_fraction" in hidden["help"]
    assert "0 (9 of ?)" in hidden["finding"]
