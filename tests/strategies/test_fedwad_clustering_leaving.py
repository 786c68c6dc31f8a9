"""FedWaD clustering's round 1 when silos are missing (`runtime.on_silo_failure: drop`): the
server half and the silo halves in threads over in-process channels. Silo 4 is out from the
start (never started), silo 2 leaves mid-exchange: the pairs among the others are measured,
each equal to the local `fedwad()` bit for bit, and the spectral clustering runs on them
alone, silos 2 and 4 in clusters of their own."""

import dataclasses
from types import SimpleNamespace

import numpy as np
from config_files import config_from
from threads import in_threads

from cfl_mpi.channel import SERVER, Alternative, LocalChannel, LocalHub
from cfl_mpi.ot.fedwad import client_step, fedwad, uniform_measure
from cfl_mpi.runtime.halves import run_facts
from cfl_mpi.strategies.base import ServerRound, SiloRound
from cfl_mpi.strategies.fedwad.halves import FedWaDClustering, FedWaDClusteringSilo, fedwad_params
from cfl_mpi.strategies.shared.fedwad_exchange import ABANDON, FedWaDMeasure, FedWaDRequest, Job, job_rng, job_times
from cfl_mpi.wire.round import Leave

SILOS, DIM, K, POINTS = 5, 3, 6, 12
ABSENT, LEAVING = 4, 2
CONFIG = f"""
name: t
silos: {SILOS}
data: {{name: rotated_digits, rotations: [0]}}
strategy: {{name: fedwad, clusters: 2, sample_cap: {POINTS}, iterations: {K}, p: 1}}
"""
rng = np.random.default_rng(3)
# silos 0, 1 and 2 near the origin, silos 3 and 4 ten units away: two groups
POINTS_OF = {c: rng.normal(size=(POINTS, DIM)) + (10.0 if c >= 3 else 0.0) for c in range(SILOS)}


def halves(tmp_path):
    cfg = config_from(tmp_path, CONFIG)
    run = dataclasses.replace(run_facts(cfg), input_dim=DIM)  # the clouds here are 3-dimensional
    return FedWaDClustering(cfg.strategy, run), FedWaDClusteringSilo(cfg.strategy, run), run


def leaving_after(channel: LocalChannel, params, seed: int, replies: int) -> str:
    """Silo 2: answer its first `replies` requests honestly (letting go of the job with silo 4
    as told), then fail and leave, as the runtime's silo does (`Leave` in place of a reply)."""
    mine = uniform_measure(POINTS_OF[LEAVING])
    expect = FedWaDRequest.expect(1, dim=DIM, max_elements=params.max_support * DIM)
    while replies:
        request = FedWaDRequest.of(channel.recv(SERVER, expect))
        if request.op == ABANDON:
            continue
        assert request.t == job_times(seed, 1, request.job, K)[request.k - 1]
        step, _ = client_step(mine, uniform_measure(request.points), request.t, p=1)
        channel.send(SERVER, FedWaDMeasure(step.points, step.weights, request.job, request.k), 1)
        replies -= 1
    channel.send(SERVER, Leave("MemoryError: out of memory in its FedWaD step"), 1)
    return "left"


def test_silos_out_from_the_start_or_leaving_mid_exchange_are_clustered_alone(tmp_path):
    server_half, silo_half, run = halves(tmp_path)
    params = fedwad_params(server_half.params, run)
    hub = LocalHub()
    channels = {a: LocalChannel(a, hub, 20.0, 0.01) for a in (SERVER, *range(SILOS))}
    left: list[int] = []
    ctx = ServerRound(1, channels[SERVER], [c for c in range(SILOS) if c != ABSENT], {}, {})

    def take(msg) -> None:  # the runtime's: the silo is dropped and leaves the participants
        left.append(msg.sender)
        ctx.participants.remove(msg.sender)

    ctx.leaving = Alternative(Leave.KIND, lambda _: Leave.expect(1), take)

    def honest(silo: int) -> None:
        data = SimpleNamespace(x_train=POINTS_OF[silo])
        silo_half.before_training(SiloRound(1, silo, channels[silo], None, data, None, SILOS))  # type: ignore[arg-type]

    outcomes = in_threads(
        lambda: server_half.before_training(ctx),
        *(lambda c=c: honest(c) for c in (0, 1, 3)),
        lambda: leaving_after(channels[LEAVING], params, run.seed, 5),  # steps of several of its jobs
    )
    assert outcomes == [None, None, None, None, "left"]  # every honest silo finished, none blamed
    assert left == [LEAVING] and ctx.participants == [0, 1, 3]
    D = server_half.D
    for mu, nu in ((0, 1), (0, 3), (1, 3)):
        job = Job(mu, nu, POINTS)
        local = fedwad(uniform_measure(POINTS_OF[mu]), uniform_measure(POINTS_OF[nu]), p=1, n_iter=K,
                       t=job_times(run.seed, 1, job.key, K), support_size=POINTS,
                       seed=job_rng(run.seed, 1, job)).distance  # fmt: skip
        assert D[mu, nu] == D[nu, mu] == local
    for silo in (LEAVING, ABSENT):  # measured with nobody
        assert np.isnan(np.delete(D[silo], silo)).all() and np.isnan(np.delete(D[:, silo], silo)).all()
    # the near pair (0, 1) together, silo 3 apart; 2 and 4 alone
    assert server_half.clusters.tolist() == [0, 0, 1, 2, 3]
