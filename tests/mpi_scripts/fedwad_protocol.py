"""Run under `mpirun -n 3`: rank 0 drives FedWaD jobs, ranks 1 and 2 (silos 0 and 1) hold the
measures. Checks that the distributed run equals the local `fedwad()` bit for bit, and that
malformed messages on either side raise ProtocolError naming the sender. Rank 0 prints a
JSON report (the silos' findings gathered to it)."""
import json

import numpy as np
from mpi4py import MPI

from cfl_mpi.ot.fedwad import fedwad, uniform_measure
from cfl_mpi.ot.fedwad_protocol import FedWaDParams, Job, job_rng, run_jobs, serve
from cfl_mpi.wire.messages import ArraySpec, Expect, Kind, ProtocolError
from cfl_mpi.wire.transport import PeerTimeout, Transport

world = MPI.COMM_WORLD
RANK = world.Get_rank()
SILO_RANKS = [1, 2]
ROUND, SEED, DIM, K, S = 7, 3, 3, 6, 12
rng = np.random.default_rng(0)
CLOUDS = {0: (rng.normal(size=(40, DIM)), rng.normal(size=(30, DIM)) + 1.0),  # silo 0: μ of 0>1, ν of 1>0
          1: (rng.normal(size=(25, DIM)) * 2.0, rng.normal(size=(40, DIM)) - 1.0)}
JOBS = [Job(0, 1, S), Job(1, 0, S)]


def measures(silo):
    first, second = CLOUDS[silo]
    own = {0: "0>1", 1: "1>0"}[silo]
    other = {0: "1>0", 1: "0>1"}[silo]
    return {own: uniform_measure(first), other: uniform_measure(second)}


def transport(timeout=20.0):
    return Transport(world.Dup(), timeout_s=timeout, max_sleep_s=0.01)


def good_run(p):
    t = transport()
    params = FedWaDParams(p=p, n_iter=K, dim=DIM, max_support=S)
    if RANK == 0:
        got = run_jobs(t, ROUND, SILO_RANKS, JOBS, params, SEED)
        local = {}
        for job in JOBS:
            mu = measures(job.mu)[job.key]
            nu = measures(job.nu)[job.key]
            local[job.key] = fedwad(mu, nu, p=p, n_iter=K, t="random", support_size=S,
                                    seed=job_rng(SEED, ROUND, job)).distance
        return {"got": got, "local": local, "sent": dict(t.sent_bytes)}
    serve(t, ROUND, 0, measures(RANK - 1), params)
    return {"sent": dict(t.sent_bytes)}


def bad_reply():
    """Silo 1 (rank 2) answers its first request with weights summing to 2."""
    t = transport()
    params = FedWaDParams(p=1, n_iter=K, dim=DIM, max_support=S)
    if RANK == 0:
        try:
            run_jobs(t, ROUND, SILO_RANKS, JOBS, params, SEED)
            return {"error": None}
        except ProtocolError as err:
            for r in SILO_RANKS:  # end both loops early: rank 1 must refuse a premature done
                t.send(r, Kind.FEDWAD_MEASURE, ROUND, {"points": np.zeros((0, DIM)), "weights": np.zeros(0)},
                       op="done", job="", k=0, t=0.0)
            return {"error": str(err)}
    if RANK == 1:
        try:
            serve(t, ROUND, 0, measures(0), params)
            return {"error": None}
        except ProtocolError as err:
            return {"error": str(err)}
    spec = Expect(Kind.FEDWAD_MEASURE, ROUND, (ArraySpec("points", "float64", (None, DIM)),
                                               ArraySpec("weights", "float64", (None,))), {"op": str, "job": str, "k": int})
    answered = False
    while True:
        msg = t.recv(0, spec)
        if msg.meta["op"] == "done":
            return {}
        if not answered:
            t.send(0, Kind.FEDWAD_MEASURE, ROUND, {"points": msg.arrays["points"], "weights": 2 * msg.arrays["weights"]},
                   job=msg.meta["job"], k=msg.meta["k"])
            answered = True


def bad_request(meta):
    """The server (hand-driven) sends silo 0 one request it must refuse."""
    t = transport(timeout=5.0)
    params = FedWaDParams(p=1, n_iter=K, dim=DIM, max_support=S)
    xi = np.random.default_rng(1).normal(size=(S, DIM))
    if RANK == 0:
        t.send(1, Kind.FEDWAD_MEASURE, ROUND, {"points": xi, "weights": np.full(S, 1 / S)}, **meta)
        return {}
    if RANK == 1:
        try:
            serve(t, ROUND, 0, measures(0), params)
            return {"error": None}
        except (ProtocolError, PeerTimeout) as err:
            return {"error": str(err)}
    return {}


def main():
    report = {}
    for name, case in [("good_p1", lambda: good_run(1)), ("good_p2", lambda: good_run(2)),
                       ("bad_reply", bad_reply),
                       ("unknown_job", lambda: bad_request({"op": "interpolate", "job": "5>9", "k": 1, "t": 0.5})),
                       ("wrong_step", lambda: bad_request({"op": "interpolate", "job": "0>1", "k": 2, "t": 0.5})),
                       ("bad_time", lambda: bad_request({"op": "interpolate", "job": "0>1", "k": 1, "t": 1.5}))]:
        results = world.gather(case(), root=0)
        report[name] = results
        world.Barrier()
    if RANK == 0:
        print(json.dumps(report), flush=True)


main()
