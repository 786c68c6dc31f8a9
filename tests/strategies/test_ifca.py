"""IFCA (Ghosh et al.) offline: its parameters, its assignment by lowest loss, and the server's
check that each silo trains the cluster its losses chose. Whole runs: tests/test_compare.py
and test_backends.py."""

from __future__ import annotations

import numpy as np
import pytest
from config_files import FOUR_SILOS, config_from

from cfl_mpi.channel import SERVER, LocalChannel, LocalHub
from cfl_mpi.config import ConfigError
from cfl_mpi.runtime.halves import server_half
from cfl_mpi.strategies.base import ServerRound
from cfl_mpi.strategies.ifca import IfcaConfig
from cfl_mpi.strategies.ifca.assign import ifca_assign
from cfl_mpi.strategies.ifca.halves import ClusterModel, Losses
from cfl_mpi.wire.messages import ProtocolError


def test_paper_defaults(tmp_path):
    assert config_from(tmp_path, FOUR_SILOS, "strategy.name=ifca").strategy == IfcaConfig(k=None, init="silos")


@pytest.mark.parametrize(
    "overrides,field,words",
    [
        (["strategy.name=ifca", "strategy.k=5"], "strategy.k", "between 1 and silos (4)"),
        (["strategy.name=ifca", "strategy.init=zeros"], "strategy.init", "one of 'silos', 'random'"),
    ],
)
def test_errors_name_the_field(tmp_path, overrides, field, words):
    with pytest.raises(ConfigError) as err:
        config_from(tmp_path, FOUR_SILOS, *overrides)
    assert str(err.value).startswith(field + ":") and words in str(err.value) and "\n" not in str(err.value)


def test_ifca_assign_argmin_with_ties() -> None:
    losses = np.array(
        [
            [0.5, 0.2, 0.9],
            [0.3, 0.3, 0.1],
            [0.4, 0.4, 0.7],  # tie: lowest index
            [np.nan, 0.8, 0.8],  # diverged model never wins; then tie
            [0.7, 0.7, 0.7],
        ]
    )
    out = ifca_assign(losses)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [1, 2, 0, 1, 0])


def test_ifca_rejects_a_silo_that_trains_another_cluster_than_its_losses_say(tmp_path):
    cfg = config_from(tmp_path, FOUR_SILOS, "strategy.name=ifca", "strategy.init=random")
    hub = LocalHub()
    server, silos = LocalChannel(SERVER, hub, 5, 0.01), [LocalChannel(c, hub, 5, 0.01) for c in range(4)]
    losses = [[0.1, 0.9], [0.2, 0.8], [0.9, 0.1], [0.7, 0.3]]
    strategy = server_half(cfg)
    model = {"w": np.zeros(3, np.float32)}
    strategy.models = [model, model]
    ctx = ServerRound(1, server, [0, 1, 2, 3], {}, {}, {c: model for c in range(4)})

    def identity_step(chosen):
        """The server's half of a round's identity step, each silo answering `chosen`."""
        strategy.before_training(ctx)
        ahead = strategy.ahead_of_update(ctx)
        for c, (table, k) in enumerate(zip(losses, chosen)):
            silos[c].send(SERVER, Losses(np.array(table), k), 1)
        for msg in server.recv_each(range(4), ahead.expect):
            ahead.take(msg)
        strategy.after_training(ctx)

    with pytest.raises(ProtocolError, match=r"silo 3 sent losses of round 1 and chose cluster 0, but .* cluster 1"):
        identity_step([0, 0, 1, 0])  # silo 3 claims cluster 0
    identity_step([0, 0, 1, 1])
    np.testing.assert_array_equal(strategy.clusters, [0, 0, 1, 1])
    assert ctx.start_models[3] is strategy.models[1] and ctx.step_seconds["identity"] > 0
    # each identity step sent every silo the K = 2 models, in order
    for silo in silos:
        expect = ClusterModel.expect(1, like=model)
        clusters = [ClusterModel.of(silo.recv(SERVER, expect)).cluster for _ in range(4)]
        assert clusters == [0, 1, 0, 1] and not hub.waiting(SERVER, silo.me)


def test_identity_step_gives_each_silo_its_losses_as_alone_and_loads_the_model_they_choose():
    """One call for several silos: each silo's losses are `evaluate`'s alone (the same bits),
    and each silo's model then holds the cluster model of its lowest loss (the one it trains)."""
    import torch

    from cfl_mpi.models.mlp import Mlp
    from cfl_mpi.strategies.ifca.halves import chosen, identity_step
    from cfl_mpi.training.local import evaluate

    torch.manual_seed(0)
    cluster_models = [{k: v.numpy().copy() for k, v in Mlp(784, 10, hidden=16).state_dict().items()} for _ in range(3)]
    data = [(torch.rand(n, 784), torch.randint(0, 10, (n,))) for n in (30, 30, 12)]
    jobs = [(Mlp(784, 10, hidden=16), cluster_models, x, y) for x, y in data]
    table = identity_step(jobs, torch.device("cpu"))
    probe = Mlp(784, 10, hidden=16)
    for (model, _, x, y), losses in zip(jobs, table):
        for k, arrays in enumerate(cluster_models):
            probe.load_state_dict({name: torch.from_numpy(a) for name, a in arrays.items()})
            assert losses[k] == evaluate(probe, x, y, torch.device("cpu"))[1]
        for name, a in model.state_dict().items():
            assert np.array_equal(a.numpy(), cluster_models[chosen(losses)][name])
    assert len({tuple(r) for r in table}) == len(table)  # each silo's own losses: a mix-up would show
