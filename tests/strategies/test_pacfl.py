"""PACFL (Vahidian et al.) offline: its parameters, and Algorithm 2's placement of late silos.
Whole runs: tests/test_compare.py and test_backends.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from config_files import FOUR_SILOS, config_from

from cfl_mpi.channel import SERVER, LocalChannel, LocalHub
from cfl_mpi.config import ConfigError
from cfl_mpi.runtime.halves import server_half
from cfl_mpi.strategies.base import ServerRound
from cfl_mpi.strategies.pacfl import PacflConfig
from cfl_mpi.strategies.pacfl.halves import PrincipalVectors
from cfl_mpi.wire.messages import ProtocolError


def test_paper_defaults(tmp_path):
    assert config_from(tmp_path, FOUR_SILOS).strategy == PacflConfig(p=3, per_class=True, measure="sum", beta=600.0)


@pytest.mark.parametrize(
    "overrides,field,words",
    [
        (["strategy.p=0"], "strategy.p", "at least 1"),
        (["strategy.beta=-1"], "strategy.beta", "positive"),
        (["strategy.measure=mean"], "strategy.measure", "one of 'sum', 'smallest'"),
        (["strategy.epsilon=1"], "strategy.epsilon", "unknown key"),
    ],
)
def test_errors_name_the_field(tmp_path, overrides, field, words):
    with pytest.raises(ConfigError) as err:
        config_from(tmp_path, FOUR_SILOS, *overrides)
    assert str(err.value).startswith(field + ":") and words in str(err.value) and "\n" not in str(err.value)


def test_pacfl_places_late_silos_without_moving_anyone(tmp_path):
    """Algorithm 2: signatures arriving after the first batch are placed; nobody moves."""
    cfg = config_from(tmp_path, FOUR_SILOS, "strategy.beta=120", "silos=6", "data.rotations=[0,180,90]")
    rng = np.random.default_rng(1)
    centres = [np.linalg.qr(rng.standard_normal((40, 3)))[0] for _ in range(2)]
    bases = [np.linalg.qr(centres[g] + 0.05 * rng.standard_normal((40, 3)))[0] for g in (0, 0, 1, 1, 1, 0)]
    strategy = server_half(cfg)
    strategy.add_signatures([bases[c] for c in (0, 2, 3, 5)], [0, 2, 3, 5])  # first batch: silos 1, 4 absent
    first = strategy.clusters.copy()
    assert first[0] == first[5] != first[2] == first[3]
    assert len({first[1], first[4]} | set(first[[0, 2]])) == 4  # the absent silos are alone
    strategy.add_signatures([bases[4], bases[1]], [4, 1])
    np.testing.assert_array_equal(strategy.clusters[[0, 2, 3, 5]], first[[0, 2, 3, 5]])
    assert strategy.clusters[4] == first[2] and strategy.clusters[1] == first[0]
    assert strategy.order == [0, 2, 3, 5, 4, 1] and strategy.artifacts["A"] is strategy.A
    assert not np.isnan(strategy.A).any()
    arrays, meta = strategy.state_dict()
    again = server_half(cfg)
    again.load_state_dict(arrays, json.loads(json.dumps(meta)))
    np.testing.assert_array_equal(again.clusters, strategy.clusters)
    np.testing.assert_array_equal(again.A, strategy.A)


@pytest.mark.parametrize(
    "shape,words",
    [
        ((28 * 28 - 1, 3), "shape"),  # a row short of the run's input size (1 channel, 28 x 28)
        ((28 * 28, 31), "over the size limit"),  # p = 3 per class of 10: at most 30 columns
        ((28 * 28, 0), "no column"),
    ],
)
def test_pacfl_refuses_a_signature_of_another_shape_naming_its_sender(tmp_path, shape, words):
    cfg = config_from(tmp_path, FOUR_SILOS)
    hub = LocalHub()
    server, silos = LocalChannel(SERVER, hub, 5, 0.01), [LocalChannel(c, hub, 5, 0.01) for c in range(4)]
    rng = np.random.default_rng(0)
    silos[0].send(SERVER, PrincipalVectors(rng.standard_normal((28 * 28, 30))), 1)
    silos[1].send(SERVER, PrincipalVectors(rng.standard_normal(shape)), 1)
    strategy = server_half(cfg)
    with pytest.raises(ProtocolError, match="silo 1") as err:
        strategy.after_training(ServerRound(1, server, [0, 1, 2, 3], {}, {}, first={0, 1, 2, 3}))
    assert "principal_vectors" in str(err.value) and "round 1" in str(err.value) and words in str(err.value)
    assert np.isnan(strategy.A).all()  # nothing of the honest silo's signature clustered yet
