"""FedWaD between silos: the server drives many Algorithm-1 runs at once, each point cloud stays home.

The FedWaD paper (Rakotomamonjy, Nadjahi, Ralaivola, ICLR 2024), Algorithm 1. A *job*
estimates Wp(μ, ν) with μ on silo ``job.mu`` and ν on silo ``job.nu``. The server holds ξ
and, per iteration k = 1..K, sends ξ(k-1) and the time t to both holders (``fedwad_measure``,
``op: interpolate``); each returns its interpolating measure
ξ_own(k) (Eq. 10); the server forms ξ(k) = interp(ξ_μ(k), ξ_ν(k), t).
Then it sends ξ(K) (``op: distance``), each holder returns Wp(own, ξ(K)) (``fedwad_distance``)
and the estimate is their sum (line 10). Finally ``op: done`` (zero-size arrays) ends the
silo's serving loop. Only interpolating measures and scalars travel: never μ or ν.

With ``runtime.on_silo_failure: drop`` a holder may leave the federation (a ``Leave`` in place
of its reply): its jobs end without an estimate, and the other holder of each is told to let
it go (``op: abandon``, zero-size arrays), as is a silo told of jobs whose other holder left
before the exchange began. This goes beyond the FedWaD paper, whose clients all answer.

All jobs proceed concurrently: the server keeps, per silo, the FIFO of requests it sent
(a silo answers in order), receives from whichever silo answers first (``recv_any``), and
a job advances as soon as both of its halves are in; its server step (an exact OT problem,
GIL-free in POT) runs on a pool of the server's cores while it goes on receiving, since at
C silos the server makes C(C−1)·K of them. Every message is checked on both sides
(job known, iteration expected, shapes, weights summing to 1) and a violation raises
ProtocolError naming the sender, the kind and the round.

ξ(0) (S draws of N(0, I)) comes from a Generator seeded by (seed, round, μ's silo, ν's
silo), as :func:`~cfl_mpi.ot.fedwad.fedwad` draws it; the times from a second one seeded by
the same and known to both holders (:func:`job_times`): a job's result equals
``fedwad(μ, ν, p=p, n_iter=K, t=job_times(...), support_size=S, seed=job_rng(seed, round,
job))`` bit for bit.

A holder accepts only the time its own copy of the schedule gives for that job and
iteration, drawn from U(T_RANGE). The interpolating measure a holder returns is
(1 − t)·x_i + t·T(x_i), atom by atom: a t near 0 would hand the server the holder's points
themselves, so a curious server must not choose t (see docs/security/threat-model.md).

Only the approximate interpolation (Eq. 10) is offered: it keeps every measure within S
points, so the receivers can bound what they accept. Random t (one U(0, 1) draw per
iteration) rather than the fixed 0.5: on 100-dimensional clouds of unit vectors a fixed t
settles on a midpoint of a non-optimal coupling ~10 % above W1, random t reaches < 1 %
within 20 iterations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...channel import SERVER, Alternative, Channel, Pending, wait_all
from ...ot.fedwad import Measure, client_distance, client_step, gaussian_measure, server_step
from ...wire.messages import Expect, Message, ProtocolError
from ...wire.payload import Payload, array, scalar

__all__ = [
    "FEDWAD_KINDS",
    "T_RANGE",
    "FedWaDDistance",
    "FedWaDMeasure",
    "FedWaDParams",
    "FedWaDRequest",
    "Job",
    "job_key",
    "job_rng",
    "job_times",
    "run_jobs",
    "serve",
]

_WEIGHT_SUM_TOL = 1e-6
T_RANGE = (0.1, 0.9)  # every time t of the schedule: bounded away from 0 and from 1
_TIMES_STREAM = 1  # the times' Generator is seeded apart from ξ(0)'s
INTERPOLATE, DISTANCE, DONE, ABANDON = "interpolate", "distance", "done", "abandon"
_STEP_POLL_S = 0.002  # while server steps run, how often the server looks for messages too


def _weights_problem(weights: np.ndarray) -> str | None:
    """A measure's weights must be a probability vector (an empty measure ends the exchange)."""
    total = float(weights.sum()) if weights.size else 1.0
    if np.any(weights < 0) or abs(total - 1.0) > _WEIGHT_SUM_TOL:
        return f"weights that are negative or sum to {total!r}, not 1"
    return None


class FedWaDRequest(Payload, kind="fedwad_measure"):
    """server → silo: ξ(k−1) of a job and the time t (interpolate), ξ(K) (distance), or the
    end of the exchange (done, no points)."""

    points: np.ndarray = array("float64", "support", "dim")
    weights: np.ndarray = array("float64", "support")
    op: str = scalar(str)
    job: str = scalar(str)
    k: int = scalar(int)
    t: float = scalar(float)

    def problem(self) -> str | None:
        return _weights_problem(self.weights)


class FedWaDMeasure(Payload, kind=FedWaDRequest.KIND):
    """silo → server: its interpolating measure ξ_own(k) of step k of a job (Eq. 10)."""

    points: np.ndarray = array("float64", "support", "dim")
    weights: np.ndarray = array("float64", "support")
    job: str = scalar(str)
    k: int = scalar(int)

    def problem(self) -> str | None:
        return _weights_problem(self.weights)


class FedWaDDistance(Payload, kind="fedwad_distance"):
    """silo → server: Wp between its measure and ξ(K), the last step of a job (line 9)."""

    job: str = scalar(str)
    k: int = scalar(int)
    distance: float = scalar(float, 0.0, np.inf)


FEDWAD_KINDS = (FedWaDRequest.KIND, FedWaDDistance.KIND)


@dataclass(frozen=True)
class Job:
    """Estimate Wp(μ, ν): μ held by silo ``mu``, ν by silo ``nu``; ξ has ``support`` points."""

    mu: int
    nu: int
    support: int

    @property
    def key(self) -> str:
        return job_key(self.mu, self.nu)


def job_key(mu: int, nu: int) -> str:
    """The name of the job comparing silo mu's measure with silo nu's, on the wire and in dicts."""
    return f"{mu}>{nu}"


@dataclass(frozen=True)
class FedWaDParams:
    """What server and silos agree on from the config: p, K, the space and a size bound."""

    p: int  # 1: Euclidean cost, W1; 2: squared Euclidean, W2
    n_iter: int  # K
    dim: int  # dimension of the points
    max_support: int  # no measure on the wire has more points than this


def job_rng(seed: int, round: int, job: Job) -> np.random.Generator:
    """The Generator of ξ(0) and the times of one job: a function of run seed, round and pair."""
    return np.random.default_rng([seed, round, job.mu, job.nu])


def job_times(seed: int, round: int, key: str, n_iter: int) -> np.ndarray:
    """The K times t of the job named `key` (``"mu>nu"``): U(T_RANGE) draws seeded by the run
    seed, the round and the pair, so that the server and both holders know them."""
    mu, nu = (int(s) for s in key.split(">"))
    return np.random.default_rng([seed, round, mu, nu, _TIMES_STREAM]).uniform(*T_RANGE, size=n_iter)


def _checked_measure(msg: Message, measure: FedWaDRequest | FedWaDMeasure, params: FedWaDParams) -> Measure:
    """The message's measure (its weights checked by its declaration), or ProtocolError naming
    sender, kind and round where it has no point or more than the agreed bound."""
    n = measure.points.shape[0]
    if not 1 <= n <= params.max_support:
        raise ProtocolError(
            f"{msg.who} sent a {msg.kind} of round {msg.round} (job {measure.job!r}) with {n} points, "
            f"expected 1 to {params.max_support}"
        )
    return Measure(measure.points, measure.weights / float(measure.weights.sum()))


# --------------------------------------------------------------------------- server


@dataclass
class _State:
    """One job on the server: its iterate, times, and the halves of the current step."""

    job: Job
    xi: Measure
    times: np.ndarray
    k: int = 1  # iteration being computed; K + 1 = final distances
    halves: dict[int, Any] = field(default_factory=dict)  # holder silo → ξ_own(k), or Wp(own, ξ(K)) in the last step


def run_jobs(
    channel: Channel,
    round: int,
    jobs: list[Job],
    params: FedWaDParams,
    seed: int,
    cores: int = 1,
    leaving: Alternative | None = None,
    let_go: Mapping[int, Sequence[str]] | None = None,
) -> dict[str, float]:
    """Run every job to its estimate Wp(μ, ν) ≈ Wp(μ, ξ(K)) + Wp(ξ(K), ν); end the silos' loops.

    Returns ``{job.key: estimate}``. Every silo that holds a measure of some job is sent
    ``done`` at the end, and must be serving (:func:`serve`) until then. The server steps run
    on `cores` threads; each job's steps follow one another, so the estimates do not depend
    on `cores`. `leaving`: a holder may send its kind in place of a reply (it left the
    federation; `leaving.take` is told): its jobs end without an estimate and their other
    holders let them go. `let_go`: silo → jobs it may hold whose other holder left before;
    it is told to let them go first, and is sent ``done`` too.
    """
    states = {}
    for job in jobs:
        if job.mu == job.nu or not 1 <= job.support <= params.max_support:
            raise ValueError(f"job {job.key}: two distinct silos and 1 <= support <= {params.max_support} needed")
        rng = job_rng(seed, round, job)
        xi = gaussian_measure(job.support, params.dim, rng)  # ξ(0), as fedwad() draws it
        states[job.key] = _State(job, xi, job_times(seed, round, job.key, params.n_iter))
    queues: dict[int, deque] = {s: deque() for j in jobs for s in (j.mu, j.nu)}
    pending: list[Pending] = []
    results: dict[str, float] = {}
    gone: set[int] = set()  # holders that left
    abandoned: set[str] = set()  # jobs of a holder that left

    def abandon(silo: int, key: str) -> None:
        """Tell `silo` to let job `key` go: no request of it follows."""
        pending.append(
            channel.isend(silo, FedWaDRequest(np.zeros((0, params.dim)), np.zeros(0), ABANDON, key, 0, 0.0), round)
        )

    for silo, keys in (let_go or {}).items():
        queues.setdefault(silo, deque())
        for key in keys:
            abandon(silo, key)

    def request(state: _State) -> None:
        """Send ξ(k-1) (or ξ(K)) to both holders of the job and note the replies to expect."""
        final = state.k > params.n_iter
        op = DISTANCE if final else INTERPOLATE
        t = 0.0 if final else float(state.times[state.k - 1])
        state.halves = {}
        pending[:] = [p for p in pending if not p.done()]  # free the buffers of delivered ξ
        for silo in (state.job.mu, state.job.nu):
            pending.append(
                channel.isend(
                    silo, FedWaDRequest(state.xi.points, state.xi.weights, op, state.job.key, state.k, t), round
                )
            )
            queues[silo].append((state.job.key, state.k, op))

    def expect(silo: int) -> Expect:
        _, _, op = queues[silo][0]
        if op == DISTANCE:
            return FedWaDDistance.expect(round)
        return FedWaDMeasure.expect(round, dim=params.dim, max_elements=params.max_support * params.dim)

    steps: dict[Future, _State] = {}  # server steps under way

    def take(msg: Message, pool: ThreadPoolExecutor) -> None:
        """One holder's reply; a job whose two halves are in moves on (one abandoned, no more)."""
        key, k, op = queues[msg.sender].popleft()
        reply = FedWaDDistance.of(msg) if op == DISTANCE else FedWaDMeasure.of(msg)
        if reply.job != key or reply.k != k:
            raise ProtocolError(
                f"{msg.who} sent {msg.kind} of round {round} for job {reply.job!r} step {reply.k}; "
                f"expected job {key!r} step {k}"
            )
        if key in abandoned:
            return
        state = states[key]
        state.halves[msg.sender] = (
            reply.distance if isinstance(reply, FedWaDDistance) else _checked_measure(msg, reply, params)
        )
        if len(state.halves) < 2:
            return
        mine, theirs = state.halves[state.job.mu], state.halves[state.job.nu]
        if op == DISTANCE:
            results[key] = mine + theirs  # Algorithm 1, line 10
        else:  # line 7, Eq. 10
            steps[pool.submit(server_step, mine, theirs, float(state.times[k - 1]), p=params.p)] = state

    def left(msg: Message) -> None:
        """A holder left: its jobs not done end here, and their other holders let them go."""
        assert leaving is not None
        leaving.take(msg)
        gone.add(msg.sender)
        queues[msg.sender].clear()  # it answers nothing more
        for key, state in states.items():
            holders = (state.job.mu, state.job.nu)
            if msg.sender in holders and key not in results and key not in abandoned:
                abandoned.add(key)
                for other in set(holders) - gone:
                    abandon(other, key)

    instead = None if leaving is None else Alternative(leaving.kind, leaving.expect, left)
    for state in states.values():
        request(state)
    with ThreadPoolExecutor(max_workers=max(1, cores), thread_name_prefix="fedwad") as pool:
        try:
            while len(results) + len(abandoned) < len(states) or any(queues.values()):
                for step in [f for f in steps if f.done()]:
                    state = steps.pop(step)
                    state.xi, _ = step.result()
                    state.k += 1
                    if state.job.key not in abandoned:
                        request(state)
                waiting = [s for s, q in queues.items() if q]
                if steps and channel.ready(waiting) is None:
                    wait(steps, timeout=_STEP_POLL_S, return_when=FIRST_COMPLETED)
                elif (msg := channel.recv_any_or(waiting, expect, instead)) is not None:
                    take(msg, pool)
        except BaseException:  # a bad message ends the round: drop the steps not started
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    for silo in set(queues) - gone:
        pending.append(
            channel.isend(silo, FedWaDRequest(np.zeros((0, params.dim)), np.zeros(0), DONE, "", 0, 0.0), round)
        )
    wait_all(pending)
    return results


# --------------------------------------------------------------------------- silo


def serve(channel: Channel, round: int, measures: Mapping[str, Measure], params: FedWaDParams, seed: int) -> None:
    """Answer the server's requests about the jobs in ``measures`` (job key → own measure)
    until it says ``done``; each job must go through steps 1..K, at the scheduled times
    (:func:`job_times`), then its distance, unless the server lets it go (``abandon``: its
    other holder left the federation; a job this silo does not hold, which it let go before
    measuring, is let go alike)."""
    next_step = {key: 1 for key in measures}
    times = {key: job_times(seed, round, key, params.n_iter) for key in measures}
    expect = FedWaDRequest.expect(round, dim=params.dim, max_elements=params.max_support * params.dim)
    while True:
        msg = channel.recv(SERVER, expect)
        request = FedWaDRequest.of(msg)
        op, key, k, t = request.op, request.job, request.k, request.t
        unfinished = [j for j, s in next_step.items() if s <= params.n_iter + 1]
        if op == ABANDON:
            if key in next_step:
                next_step[key] = params.n_iter + 2  # done with it: no request of it may follow
            continue
        if op == DONE:
            if unfinished:
                raise ProtocolError(
                    f"{msg.who} sent done in {msg.kind} of round {round} before jobs {unfinished} finished"
                )
            break
        wanted = next_step.get(key)
        final = wanted == params.n_iter + 1
        scheduled = None if wanted is None or final else float(times[key][wanted - 1])
        if wanted is None or k != wanted or op != (DISTANCE if final else INTERPOLATE) or not (final or t == scheduled):
            raise ProtocolError(
                f"{msg.who} sent {msg.kind} of round {round} with op {op!r} "
                f"job {key!r} step {k} t {t}; this silo expects "
                + (
                    f"step {wanted} of job {key!r} (op {'distance' if final else 'interpolate'}"
                    + (f", the scheduled t {scheduled!r})" if scheduled is not None else ")")
                    if wanted
                    else f"one of the jobs {sorted(measures)}"
                )
            )
        xi = _checked_measure(msg, request, params)
        next_step[key] += 1
        if final:  # Algorithm 1, line 9
            channel.send(SERVER, FedWaDDistance(key, k, client_distance(measures[key], xi, p=params.p)), round)
            continue
        # Wp(own, ξ(k-1)) stays here: the server learns distances only at the end.
        # The server is always receiving, so a blocking (back-off) send returns promptly.
        mine, _ = client_step(measures[key], xi, t, p=params.p)  # lines 4-5, Eq. 10
        channel.send(SERVER, FedWaDMeasure(mine.points, mine.weights, key, k), round)
