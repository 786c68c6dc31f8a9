"""FedWaD between silos (cfl_mpi.strategies.shared.fedwad_exchange) over in-process channels, the
server and two silos in threads: the distributed jobs equal the local `fedwad()` bit for bit,
and malformed messages on either side are refused with the sender, the kind and the round
named. (The MPI path of the same code runs in the backend-equality job tests.)"""

import numpy as np
import pytest
from threads import in_threads

from cfl_mpi.channel import SERVER, LocalChannel, LocalHub
from cfl_mpi.ot.fedwad import fedwad, uniform_measure
from cfl_mpi.strategies.shared.fedwad_exchange import (
    T_RANGE,
    FedWaDParams,
    FedWaDRequest,
    Job,
    job_rng,
    job_times,
    run_jobs,
    serve,
)
from cfl_mpi.wire.messages import ProtocolError

ROUND, SEED, DIM, K, S = 7, 3, 3, 6, 12
rng = np.random.default_rng(0)
CLOUDS = {
    0: (rng.normal(size=(40, DIM)), rng.normal(size=(30, DIM)) + 1.0),  # silo 0: μ of 0>1, ν of 1>0
    1: (rng.normal(size=(25, DIM)) * 2.0, rng.normal(size=(40, DIM)) - 1.0),
}
JOBS = [Job(0, 1, S), Job(1, 0, S)]


def measures(silo: int) -> dict:
    first, second = CLOUDS[silo]
    own, other = ("0>1", "1>0") if silo == 0 else ("1>0", "0>1")
    return {own: uniform_measure(first), other: uniform_measure(second)}


def parties(timeout_s: float = 20.0):
    hub = LocalHub()
    return [LocalChannel(a, hub, timeout_s, 0.01) for a in (SERVER, 0, 1)]


@pytest.mark.parametrize("p,cores", [(1, 1), (2, 1), (2, 3)])  # cores: the server steps on a pool
def test_distributed_jobs_equal_local_fedwad(p, cores):
    server, silo0, silo1 = parties()
    params = FedWaDParams(p=p, n_iter=K, dim=DIM, max_support=S)
    got, _, _ = in_threads(
        lambda: run_jobs(server, ROUND, JOBS, params, SEED, cores),
        lambda: serve(silo0, ROUND, measures(0), params, SEED),
        lambda: serve(silo1, ROUND, measures(1), params, SEED),
    )
    local = {
        job.key: fedwad(
            measures(job.mu)[job.key],
            measures(job.nu)[job.key],
            p=p,
            n_iter=K,
            t=job_times(SEED, ROUND, job.key, K),
            support_size=S,
            seed=job_rng(SEED, ROUND, job),
        ).distance
        for job in JOBS
    }
    assert got == local and set(got) == {"0>1", "1>0"}
    # Only measures and scalars travel: the server sends ξ, the silos ξ_own and two distances.
    assert set(server.sent_bytes) == {"fedwad_measure"}
    assert set(silo0.sent_bytes) == set(silo1.sent_bytes) == {"fedwad_measure", "fedwad_distance"}


def test_bad_reply_names_the_silo_and_premature_done_is_refused():
    server, silo0, silo1 = parties()
    params = FedWaDParams(p=1, n_iter=K, dim=DIM, max_support=S)
    spec = FedWaDRequest.expect(ROUND, dim=DIM)

    def drive():
        try:
            run_jobs(server, ROUND, JOBS, params, SEED)
        finally:  # end both loops early: silo 0 must refuse a premature done
            for silo in (0, 1):
                server.send(
                    silo,
                    FedWaDRequest.KIND,
                    ROUND,
                    {"points": np.zeros((0, DIM)), "weights": np.zeros(0)},
                    op="done",
                    job="",
                    k=0,
                    t=0.0,
                )

    def cheat():
        """Silo 1 answers its first request with weights summing to 2."""
        msg = silo1.recv(SERVER, spec)
        silo1.send(
            SERVER,
            FedWaDRequest.KIND,
            ROUND,
            {"points": msg.arrays["points"], "weights": 2 * msg.arrays["weights"]},
            job=msg.meta["job"],
            k=msg.meta["k"],
        )

    server_error, good_silo_error, _ = in_threads(drive, lambda: serve(silo0, ROUND, measures(0), params, SEED), cheat)
    assert isinstance(server_error, ProtocolError)
    assert "silo 1" in str(server_error) and "fedwad_measure" in str(server_error) and "round 7" in str(server_error)
    assert "sum to 2.0" in str(server_error)
    assert "the server" in str(good_silo_error) and "before jobs" in str(good_silo_error)


@pytest.mark.parametrize(
    "meta,words",
    [
        ({"op": "interpolate", "job": "5>9", "k": 1, "t": 0.5}, "one of the jobs"),
        ({"op": "interpolate", "job": "0>1", "k": 2, "t": 0.5}, "step 2"),
        ({"op": "interpolate", "job": "0>1", "k": 1, "t": 1.5}, "t 1.5"),
        # a curious server's t near 0 would return the silo's own points: only the schedule's t passes
        ({"op": "interpolate", "job": "0>1", "k": 1, "t": 1e-9}, "the scheduled t"),
        (
            {"op": "interpolate", "job": "0>1", "k": 1, "t": float(job_times(SEED, ROUND, "0>1", K)[1])},
            "the scheduled t",
        ),
    ],
)
def test_bad_requests_are_refused_by_the_silo(meta, words):
    server, silo0, _ = parties(timeout_s=5.0)
    xi = np.random.default_rng(1).normal(size=(S, DIM))
    server.send(0, FedWaDRequest.KIND, ROUND, {"points": xi, "weights": np.full(S, 1 / S)}, **meta)
    with pytest.raises(ProtocolError) as err:
        serve(silo0, ROUND, measures(0), FedWaDParams(p=1, n_iter=K, dim=DIM, max_support=S), SEED)
    error = str(err.value)
    assert "the server" in error and "fedwad_measure" in error and "round 7" in error and words in error, error


def test_the_schedule_is_seeded_per_job_and_bounded_away_from_0_and_1():
    a, b = job_times(SEED, ROUND, "0>1", 500), job_times(SEED, ROUND, "1>0", 500)
    assert np.array_equal(a, job_times(SEED, ROUND, "0>1", 500)) and not np.array_equal(a, b)
    assert T_RANGE[0] <= a.min() and a.max() < T_RANGE[1]
