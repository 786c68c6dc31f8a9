"""FedWaD between silos when a holder leaves the federation (`runtime.on_silo_failure: drop`):
the server and three silos in threads over in-process channels. A silo that sends `Leave` in
place of a reply ends its jobs without an estimate, the other holders let them go and finish,
and the jobs it had no part in equal the local `fedwad()` bit for bit."""

import numpy as np
import pytest
from threads import in_threads

from cfl_mpi.channel import SERVER, Alternative, LocalChannel, LocalHub
from cfl_mpi.ot.fedwad import client_step, fedwad, uniform_measure
from cfl_mpi.strategies.shared.fedwad_exchange import (
    FedWaDMeasure,
    FedWaDParams,
    FedWaDRequest,
    Job,
    job_rng,
    job_times,
    run_jobs,
    serve,
)
from cfl_mpi.wire.messages import ProtocolError
from cfl_mpi.wire.round import Leave

ROUND, SEED, DIM, K, S = 4, 5, 3, 6, 10
rng = np.random.default_rng(1)
CLOUD = {silo: uniform_measure(rng.normal(size=(20, DIM)) + silo) for silo in range(4)}
JOBS = [Job(0, 1, S), Job(1, 2, S), Job(2, 0, S)]
PARAMS = FedWaDParams(p=1, n_iter=K, dim=DIM, max_support=S)


def held(silo: int, jobs: list[Job]) -> dict:
    return {job.key: CLOUD[silo] for job in jobs if silo in (job.mu, job.nu)}


def leaving_after(channel: LocalChannel, replies: int) -> str:
    """Silo 2: serve its first `replies` requests honestly, then fail and leave."""
    mine = held(2, JOBS)
    expect = FedWaDRequest.expect(ROUND, dim=DIM, max_elements=S * DIM)
    for _ in range(replies):
        request = FedWaDRequest.of(channel.recv(SERVER, expect))
        times = job_times(SEED, ROUND, request.job, K)
        assert request.op == "interpolate" and request.t == times[request.k - 1]
        xi = uniform_measure(request.points)
        step, _ = client_step(mine[request.job], xi, request.t, p=1)
        channel.send(SERVER, FedWaDMeasure(step.points, step.weights, request.job, request.k), ROUND)
    channel.send(SERVER, Leave("MemoryError: out of memory in its FedWaD step"), ROUND)
    return "left"


def test_a_holder_that_leaves_mid_exchange_ends_its_jobs_and_the_others_finish():
    hub = LocalHub()
    server, *silos = [LocalChannel(a, hub, 20.0, 0.01) for a in (SERVER, 0, 1, 2)]
    left: list[int] = []
    leaving = Alternative(Leave.KIND, lambda _: Leave.expect(ROUND), lambda msg: left.append(msg.sender))
    got, done0, done1, gone = in_threads(
        lambda: run_jobs(server, ROUND, JOBS, PARAMS, SEED, 1, leaving),
        lambda: serve(silos[0], ROUND, held(0, JOBS), PARAMS, SEED),
        lambda: serve(silos[1], ROUND, held(1, JOBS), PARAMS, SEED),
        lambda: leaving_after(silos[2], 3),  # mid-way: it answered some steps of both its jobs
    )
    assert (done0, done1, gone, left) == (None, None, "left", [2])
    local = fedwad(CLOUD[0], CLOUD[1], p=1, n_iter=K, t=job_times(SEED, ROUND, "0>1", K), support_size=S,
                   seed=job_rng(SEED, ROUND, JOBS[0])).distance  # fmt: skip
    assert got == {"0>1": local}  # 1>2 and 2>0 ended without an estimate


@pytest.mark.parametrize("told", [True, False])
def test_jobs_whose_other_holder_left_before_the_exchange_are_let_go(told):
    """Silo 0 holds a measure for a job with silo 3, which left before the exchange: told to
    let it go, it finishes; not told, it refuses the server's `done` as premature."""
    jobs, extra = [Job(0, 1, S)], {"0>3": CLOUD[0]}
    hub = LocalHub()
    server, zero, one = [LocalChannel(a, hub, 20.0, 0.01) for a in (SERVER, 0, 1)]
    got, done0, done1 = in_threads(
        lambda: run_jobs(server, ROUND, jobs, PARAMS, SEED, 1, None, {0: ["0>3"]} if told else None),
        lambda: serve(zero, ROUND, {**held(0, jobs), **extra}, PARAMS, SEED),
        lambda: serve(one, ROUND, held(1, jobs), PARAMS, SEED),
    )
    assert set(got) == {"0>1"} and done1 is None
    if told:
        assert done0 is None
    else:
        assert isinstance(done0, ProtocolError) and "before jobs ['0>3'] finished" in str(done0)
