"""The sections of the config the runtime reads: which silos train in a round
(participation, late silos) and how the job runs (timeouts, checkpoints, silos per rank,
devices, injected faults). Light: parsed on every rank before any heavy import."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ..models.params import BATCHABLE_MODELS


@dataclass(frozen=True)
class ParticipationConfig:
    """Which silos train in a round (EMD-CFL paper, Appendix E.4: sampled at random each round).

    Give `fraction` (of the silos present) or `count`; neither: every silo, every round.
    The draw depends on (seed, round) only, so a resumed run draws the same silos.
    """

    # Fraction of the silos present that train in a round (rounded up, at least one).
    fraction: float | None = None
    # Number of silos that train in a round (all of those present if fewer).
    count: int | None = None

    def problems(self, silos: int) -> Iterator[str]:
        if self.fraction is not None and self.count is not None:
            yield "participation: give either fraction or count, not both (remove one)"
        if self.fraction is not None and not 0 < self.fraction <= 1:
            yield f"participation.fraction: must lie in (0, 1], got {self.fraction}"
        if self.count is not None and not 1 <= self.count <= silos:
            yield f"participation.count: must lie between 1 and silos ({silos}), got {self.count}"


def participant_count(p: ParticipationConfig, present: int) -> int:
    """How many of the `present` silos train in a round (at least one)."""
    if p.count is not None:
        return min(p.count, present)
    if p.fraction is not None:
        return max(1, min(present, math.ceil(p.fraction * present)))
    return present


@dataclass(frozen=True)
class LateSilo:
    """A silo that is absent until `round`: it trains for the first time then and is
    clustered on arrival, without moving the silos already clustered."""

    # Index of the late silo (0 to silos - 1).
    silo: int
    # The round it first trains in (2 to train.rounds).
    round: int


def late_silo_problems(late_silos: list[LateSilo], silos: int, rounds: int) -> Iterator[str]:
    """Late silos must be distinct silos arriving in a later round, with one silo left for round 1."""
    seen: set[int] = set()
    for i, late in enumerate(late_silos):
        if not (0 <= late.silo < silos and late.silo not in seen):
            yield f"late_silos[{i}].silo: must be a distinct silo index in 0..{silos - 1}, got {late.silo}"
        if not 2 <= late.round <= rounds:
            yield (
                f"late_silos[{i}].round: must lie between 2 and train.rounds ({rounds}), got {late.round} "
                "(a silo present from the start needs no entry)"
            )
        seen.add(late.silo)
    if len(seen) >= silos:
        yield "late_silos: at least one silo must be present in round 1 (remove one entry)"


# The fault kinds that send a hostile update in place of the honest one.
HOSTILE_UPDATES = ("scaled_update", "huge_weights", "duplicate_update", "header_only")


@dataclass(frozen=True)
class FaultConfig:
    """Failure injection, to test that a failing or hostile silo cannot wreck the job. At the
    start of round `round`, silo `silo` raises (`raise`), exits without a word (`exit`) or
    stops answering (`hang`), its training loss turns NaN (`nan_loss`, as damaged data or a
    diverging model make it) or runs out of memory (`out_of_memory`); or, from that round on,
    sends a hostile update: its model change
    sign-flipped and scaled with a huge sample count (`scaled_update`), finite but huge
    weights (`huge_weights`), the same update twice (`duplicate_update`), or an update's
    header whose payload never follows (`header_only`). `unreadable_data`: its data cannot be
    read when its process starts (a file gone or damaged), whatever `round` says.
    `raise_after_update`: it raises once its update of round `round` has left, where its
    strategy's exchanges begin (an embedding pass out of memory, say). `raise_after_shares`:
    under `aggregation.secure`, it raises once it has dealt its key shares, before its masked
    update (the silo the others' shares recover from). `slow`: from round
    `round` on it starts each round `delay_s` late, as a straggler on a slow node would; its
    results stay the honest ones (a run that must last, without costing a core)."""

    # Index of the silo that fails (0 to silos - 1).
    silo: int
    # The round it fails in, or from which it sends hostile updates.
    round: int
    # What it does: one of the kinds described above.
    kind: Literal[
        "raise",
        "exit",
        "hang",
        "nan_loss",
        "out_of_memory",
        "scaled_update",
        "huge_weights",
        "duplicate_update",
        "header_only",
        "unreadable_data",
        "raise_after_update",
        "raise_after_shares",
        "slow",
    ] = "raise"
    # `slow`: seconds the silo waits at the start of each round from `round` on.
    delay_s: float = 0.0

    def problems(self, silos: int, rounds: int) -> Iterator[str]:
        if not 0 <= self.silo < silos:
            yield f"runtime.fault.silo: must lie in 0..{silos - 1}, got {self.silo}"
        if not 1 <= self.round <= rounds:
            yield f"runtime.fault.round: must lie between 1 and train.rounds ({rounds}), got {self.round}"
        if self.delay_s < 0 or (self.kind == "slow") != (self.delay_s > 0):
            yield f"runtime.fault.delay_s: must be > 0 with kind slow and 0 otherwise, got {self.delay_s}"


# How the MPI job runs: timeouts, checkpoints, silos per rank, devices, injected faults. Not part of the
# experiment: a resumed run may change it.
@dataclass(frozen=True)
class RuntimeConfig:
    # A peer that stays silent this long is treated as dead: the job fails cleanly. A silo
    # waits twice as long for the server, so that the server names a silent silo first.
    message_timeout_s: float = 1800.0
    # A header's payload follows it at once from an honest peer: one that has not arrived
    # this long after its header, the rank's inbox having caught up with what MPI holds for
    # the rank, is a protocol error, not a slow peer.
    payload_timeout_s: float = 15.0
    # Longest sleep between two polls of a pending receive (back-off cap), so that a
    # waiting rank uses ~0 % CPU but still reacts within this delay.
    max_poll_sleep_ms: float = 20.0
    # Each silo rank and the server beat to each other this often (under MPI), so that a rank
    # gone with its node, or cut off by its link, is noticed without waiting for a message.
    heartbeat_s: float = 2.0
    # A rank silent this long ends the job, naming its node, the node's ranks and their silos
    # (a silo rank waits twice as long for the server, so that the server names the node).
    heartbeat_timeout_s: float = 30.0
    # Write the server's checkpoint (results folder, `checkpoint/`) after every round.
    checkpoint: bool = True
    # Stop after this round, as after SLURM's warning (checkpoint written, exit code 0), to be
    # continued with --resume: a long run in pieces that each fit a machine's time. null: run
    # every round.
    stop_after_round: int | None = None
    # What a silo whose own computation fails does (an exception in its data, training or
    # evaluation: a file gone, a NaN or inf loss, out of memory): abort ends the job, naming it;
    # drop lets it leave the federation (console, failure.txt and metrics.jsonl's `dropped`
    # name it, the round and why), and its rank and the other silos go on without it; with
    # drop, a silo whose update or evaluation breaks the protocol is dropped too.
    on_silo_failure: Literal["abort", "drop"] = "abort"
    # With drop: the job stops after the round (checkpoint written, exit code 1) once more than
    # this fraction of the silos has left; a job whose silos out from the start (files that
    # cannot be read, or kept out on --resume) already exceed it does not start (exit 2).
    max_dropped: float = 0.25
    # A failure to inject, for tests (runtime.fault); null: none.
    fault: FaultConfig | None = None
    # Silos hosted by each MPI rank after the server's (they share its device and torch):
    # the job then needs 1 + ceil(silos / silos_per_rank) ranks. null: one silo per rank,
    # or as many per rank as `mpirun -n` implies (blocks of consecutive silos).
    silos_per_rank: int | None = None
    # Where the silos compute: auto takes a GPU where torch sees one (silo ranks spread over a
    # node's GPUs by local rank), else the CPU; cpu never uses a GPU, even where one is present;
    # cuda stops the job before any work where a silo rank has none. The server never uses one.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # How a process's silos train: batched, as one computation (their parameters stacked, one
    # forward and backward a step over every silo's own mini-batch: torch.func's vmap), for
    # models without buffers or dropout (simple_cnn, mlp); one_by_one, one after another;
    # auto: batched where the silos compute on a GPU, where it is many times faster, one by
    # one on the CPU, where it is not (benchmarks/silo_batching.py). Each silo keeps its own
    # shuffle and update; batched weights equal one by one's up to float rounding, not bit
    # for bit (docs/research/SMALL_SILOS.md). The silos that train together are the process's silos of
    # the round, so a batched run too is a function of its config and seed.
    silo_training: Literal["auto", "batched", "one_by_one"] = "auto"
    # What a silo holds between its steps: own, a model of its own (its memory per silo, the
    # weights it continues from copied in); shared, no model: the weights it continues from
    # are the received message's, held once by the process's silos of one cluster, and
    # training takes a copy that goes once the update has left (the process then hands what it
    # frees back to the system every few seconds). shared fits many silos of a large model in a
    # rank; it allocates each silo's weights anew every round, which costs time on a CPU
    # (docs/research/PERFORMANCE.md, "Silos hold no model").
    silo_models: Literal["own", "shared"] = "own"

    def problems(self, silos: int, model: str, rounds: int) -> Iterator[str]:
        """One config-error line per value the types cannot rule out (`runtime.<key>: …`)."""
        if self.stop_after_round is not None:
            if not 1 <= self.stop_after_round <= rounds:
                yield (
                    f"runtime.stop_after_round: must lie between 1 and train.rounds ({rounds}) or be null, "
                    f"got {self.stop_after_round}"
                )
            elif not self.checkpoint:
                yield "runtime.stop_after_round: needs runtime.checkpoint true (the run continues from it)"
        if self.message_timeout_s <= 0:
            yield "runtime.message_timeout_s: must be positive"
        if self.payload_timeout_s <= 0:
            yield "runtime.payload_timeout_s: must be positive"
        if self.silos_per_rank is not None and not 1 <= self.silos_per_rank <= silos:
            yield (
                f"runtime.silos_per_rank: must lie between 1 and silos ({silos}) or be null, got {self.silos_per_rank}"
            )
        if self.max_poll_sleep_ms <= 0:
            yield "runtime.max_poll_sleep_ms: must be positive"
        if not 0 <= self.max_dropped < 1:
            yield f"runtime.max_dropped: must lie in [0, 1) (a fraction of the silos), got {self.max_dropped:g}"
        if self.heartbeat_s <= 0:
            yield "runtime.heartbeat_s: must be positive"
        elif self.heartbeat_timeout_s < 3 * self.heartbeat_s:
            yield (
                f"runtime.heartbeat_timeout_s: must be at least 3 heartbeats (3 x runtime.heartbeat_s = "
                f"{3 * self.heartbeat_s:g} s), got {self.heartbeat_timeout_s:g}"
            )
        if self.silo_training == "batched" and model not in BATCHABLE_MODELS:
            yield (
                f"runtime.silo_training: batched needs a model without buffers or dropout "
                f"({', '.join(BATCHABLE_MODELS)}); {model} has them (set auto or one_by_one)"
            )
