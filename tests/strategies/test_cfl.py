"""CFL (Sattler et al.) offline: its parameters, and the silo side's transform of the updates
(Eq. 41). Whole runs: tests/test_compare.py (and every strategy over MPI: test_backends.py)."""

from __future__ import annotations

import numpy as np
import pytest
from config_files import FOUR_SILOS, config_from

from cfl_mpi.clustering.bipartition import pairwise_cosine
from cfl_mpi.config import ConfigError
from cfl_mpi.runtime.halves import silo_half
from cfl_mpi.strategies.cfl import CflConfig
from cfl_mpi.strategies.cfl.halves import flat


def test_paper_defaults(tmp_path):
    cfl = config_from(tmp_path, FOUR_SILOS, "strategy.name=cfl").strategy
    assert (cfl.eps1, cfl.eps2, cfl.warmup_rounds, cfl.gamma_max, cfl.transform) == (0.4, 1.6, 20, 0.0, False)
    hidden = config_from(tmp_path, FOUR_SILOS, "strategy.name=cfl", "strategy.transform=true").strategy
    assert isinstance(hidden, CflConfig) and hidden.transform


@pytest.mark.parametrize(
    "overrides,field,words",
    [
        (["strategy.name=cfl", "strategy.eps1=0"], "strategy.eps1", "positive"),
        (["strategy.name=cfl", "strategy.gamma_max=1"], "strategy.gamma_max", "[0, 1)"),
        (["strategy.name=cfl", "strategy.warmup_rounds=-1"], "strategy.warmup_rounds", "non-negative"),
        (
            ["strategy.name=cfl", "strategy.transform=true", "strategy.warmup_rounds=0"],
            "strategy.warmup_rounds",
            "with strategy.transform",
        ),
    ],
)
def test_errors_name_the_field(tmp_path, overrides, field, words):
    with pytest.raises(ConfigError) as err:
        config_from(tmp_path, FOUR_SILOS, *overrides)
    assert str(err.value).startswith(field + ":") and words in str(err.value) and "\n" not in str(err.value)


def test_cfl_transform_round_trip_and_invariance(tmp_path):
    cfg = config_from(tmp_path, FOUR_SILOS, "strategy.name=cfl", "strategy.transform=true")
    silo, other = silo_half(cfg), silo_half(cfg)  # two silos build the same P from the config
    rng = np.random.default_rng(0)
    states = [
        {
            "w": rng.standard_normal((30, 7)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32),
            "n": np.array(3, dtype=np.int64),
        }
        for _ in range(4)
    ]
    sent = [silo.encode_update(s, 1) for s in states[:2]] + [other.encode_update(s, 1) for s in states[2:]]
    assert all(e["w"].shape == (30, 7) and e["n"] == 3 for e in sent)
    assert not np.allclose(sent[0]["w"], states[0]["w"])  # the server sees mixtures
    back = other.decode_model(sent[0], 1)
    np.testing.assert_allclose(back["w"], states[0]["w"], atol=1e-5)
    assert silo.decode_model(states[0], 0) is states[0]  # θ(0) arrives untransformed
    # What the server computes on transformed updates equals the plain computation (Eq. 41).
    plain = np.stack([flat(s) - flat(states[0]) for s in states[1:]])
    hidden = np.stack([flat(s) - flat(sent[0]) for s in sent[1:]])
    np.testing.assert_allclose(pairwise_cosine(hidden), pairwise_cosine(plain), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(hidden, axis=1), np.linalg.norm(plain, axis=1), rtol=1e-5)
