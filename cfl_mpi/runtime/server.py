"""The server: decides who trains, gathers updates, lets the strategy cluster and aggregate,
and checkpoints after every round so that a stopped run continues where it stopped.

It talks to the silos through its channel only, so the same server runs over MPI (rank 0)
and in the in-process simulator."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..aggregation.rules import ClusterSums, Decision
from ..channel import Alternative, Channel, Pending, wait_all
from ..clustering.labels import adjusted_rand_index
from ..config import Config, config_digest
from ..console import detail, say, warn
from ..reporting.results import RunRecorder, record_failure
from ..strategies.base import AheadOfUpdate, Model, ServerRound, timed
from ..wire.messages import Message, ProtocolError
from ..wire.round import (
    EVALUATE,
    MAX_WHY,
    STOP,
    TRAIN,
    WAIT,
    BackdoorEvaluation,
    Control,
    Dropped,
    Evaluation,
    Hello,
    Leave,
    StartModel,
    Update,
)
from .absent import Absent, too_many_gone
from .checkpoint import Checkpoint, dedupe_models, load_checkpoint, save_checkpoint
from .control import participants, present
from .halves import halves, message_kinds, server_half
from .stop import StopRequest
from .timeline import mark

PHASES = ("train", "clustering", "aggregation", "evaluation")  # of a round's wall time, as recorded


class Server:
    """Builds θ(0) and the strategy at once (before any silo starts, so nothing races for torch's
    default generator), then `run`s the rounds."""

    def __init__(
        self,
        cfg: Config,
        channel: Channel,
        out: Path,
        stop: StopRequest,
        cores: int = 1,
        devices: list[str] | None = None,
    ) -> None:
        from ..models.build import initial_model  # torch: imported by the rank that builds θ(0) only

        self.cfg, self.channel, self.out, self.stop, self.cores = cfg, channel, out, stop, cores
        self.devices = devices or []  # where the silos compute: one label per silo rank (summary.json)
        self.truth = cfg.data.true_clusters(cfg.silos)  # None: no known groups, no ARI
        self.targets = cfg.data.backdoor_targets(cfg.silos)
        self.halves = halves(cfg)
        self.kinds = message_kinds(cfg)
        self.strategy = server_half(cfg)
        self.theta0 = initial_model(cfg.architecture, cfg.seed)
        mark("strategy")
        self.start_models: dict[int, Model] = {c: self.theta0 for c in range(cfg.silos)}  # what each trains from
        self.trained: set[int] = set()  # silos that have trained at least once
        self.first_counts: dict[int, int] = {}  # each silo's first reported sample count (screening)
        self.next_round = 1
        self.resumed_after: int | None = None
        self.records: list[dict] = []  # metrics of the rounds done, including those before a resume
        # silos that left the federation (runtime.on_silo_failure: drop): when and why
        self.dropped: dict[int, dict] = {}
        self.expelled: set[int] = set()  # those dropped for breaking the protocol: sent nothing more
        self.absent: frozenset[int] = frozenset()  # those out before the first round: not started, sent nothing
        self.farewells: list[Pending] = []  # the `Dropped` messages to them
        self.lone: set[int] = set()  # clusters said to train with one member (aggregation.secure)

    # ------------------------------------------------------------------ checkpoints
    def resume(self) -> None:
        """Continue from the results folder's checkpoint (verified by check_resume before any work)."""
        ckpt = load_checkpoint(self.out)
        self.start_models = {c: ckpt.model_of(c) for c in range(self.cfg.silos)}
        self.strategy.load_state_dict(ckpt.strategy, ckpt.meta["strategy"])
        self.trained = set(ckpt.meta["trained"])
        self.first_counts = {int(c): int(n) for c, n in ckpt.meta["first_counts"].items()}
        self.records = ckpt.meta["records"]
        self.dropped = {int(c): d for c, d in ckpt.meta.get("dropped", {}).items()}
        self.next_round = ckpt.round + 1
        self.resumed_after = ckpt.round

    def keep_out(self, absent: Absent) -> None:
        """The silos out of the job before its first round: of those the resumed run had
        dropped, the ones `absent` keeps out stay dropped and the others are readmitted; those
        whose data could not be read are dropped now, in the coming round's record."""
        readmitted = sorted(c for c in self.dropped if c not in absent.kept)
        self.dropped = {c: d for c, d in self.dropped.items() if c in absent.kept}
        self.absent = absent.silos
        if readmitted:
            say(f"readmitted {', '.join(self.channel.describe(c) for c in readmitted)}, dropped in the run resumed")
        for silo, why in sorted(absent.unreadable.items()):
            who = self.channel.describe(silo)
            self.dropped[silo] = {"round": self.next_round, "from": who, "why": _printable(why)}
            text = f"round {self.next_round}: dropped {who}, whose data cannot be read: {_printable(why)}"
            warn(text)
            record_failure(self.out, f"cfl_mpi: {text}")

    def checkpoint(self, round: int) -> tuple[int, float]:
        """Write the state after `round`; returns (bytes, seconds)."""
        start = time.monotonic()
        models, index = dedupe_models([self.start_models[c] for c in range(self.cfg.silos)])
        arrays, meta = self.strategy.state_dict()
        size = save_checkpoint(
            self.out,
            Checkpoint(
                round,
                models,
                index,
                arrays,
                {
                    "strategy": meta,
                    "trained": sorted(self.trained),
                    "first_counts": self.first_counts,
                    "records": self.records,
                    "dropped": {str(c): d for c, d in self.dropped.items()},
                },
                config_digest(self.cfg),
            ),
        )
        return size, time.monotonic() - start

    # ------------------------------------------------------------------ the run
    def run(self) -> dict | None:
        start = time.monotonic()
        recorder = RunRecorder(self.out, self.cfg, self.records)
        wait_all([self.channel.isend(c, Hello(self.next_round), 0) for c in self.reachable()])
        mark("hello")
        needs_model = set(present(self.cfg, self.next_round)) & set(self.reachable())  # a fresh silo has no model
        t = self.next_round - 1
        if t < self.cfg.train.rounds and not self.stop.requested:  # the first round's line can be minutes away
            say(f"round {t + 1}/{self.cfg.train.rounds} running (the silos start, load their data and train)")
        while t < self.cfg.train.rounds and not self.stop.requested:  # a stop during start-up: no round
            t += 1
            record = self.round(t, needs_model)
            needs_model = set()
            self.records.append(record)
            if self.cfg.runtime.checkpoint:  # before the metrics line, which states what it cost
                size, seconds = self.checkpoint(t)
                record["checkpoint"] = {"bytes": size, "seconds": round(seconds, 4)}
            recorder.write(record)
            if t == self.cfg.runtime.stop_after_round and t < self.cfg.train.rounds:
                self.stop.request(f"runtime.stop_after_round is {t}")
        wait_all([self.channel.isend(c, Control(STOP, 0, 0), t + 1) for c in self.reachable()])
        wait_all(self.farewells)
        if t < self.cfg.train.rounds:
            then = f"continue with --resume {self.out}" if t else "nothing to resume: start again with --overwrite"
            warn(f"stopped after round {t} ({self.stop.reason}); {then}")
            return None
        return self.finish(recorder, time.monotonic() - start)

    def round(self, t: int, needs_model: set[int]) -> dict:
        """Round t: tell each silo what to do, let the strategy cluster around the silos'
        training, aggregate, hand out the next start models, gather the evaluations."""
        here, training, first = self.announce(t, needs_model)
        ctx = ServerRound(
            t, self.channel, training, {}, {}, self.start_models, first, self.first_counts, cores=self.cores
        )
        ctx.leaving = self._leaving(t, ctx.participants)
        phases = dict.fromkeys(PHASES, 0.0)  # wall seconds; the strategy's hooks count as clustering
        with timed(phases, "clustering"):
            self.strategy.before_training(ctx)
        clusters, slowest = self.updates_and_clusters(ctx, phases)
        here = [c for c in here if c not in self.dropped]  # a silo may leave in training or clustering
        with timed(phases, "aggregation"):
            self.start_models = self.strategy.aggregate(ctx)
            flagged = self.report_decisions(t, ctx.decisions)
            sends = self.send_models(t, here, clusters)
        with timed(phases, "evaluation"):
            # Receive while the models are still in flight: a silo that sent a stray message (a
            # second update, say) may be blocked until it is taken, and would never take its
            # model; receiving first turns that deadlock into a ProtocolError naming it.
            record = self.evaluations(t, here)
            wait_all(sends)
        here = [c for c in here if c not in self.dropped]
        record.update(
            {
                "participants": training,
                "samples": [ctx.n_samples.get(c) for c in range(self.cfg.silos)],  # the counts claimed
                "ari": None if self.truth is None else adjusted_rand_index(self.truth[here], clusters[here]),
                "n_clusters": int(len(np.unique(clusters[here]))),
                "clusters": clusters.tolist(),
                "rejected": [d.record() for d in flagged],
                "seconds": {k: round(v, 4) for k, v in phases.items()},
            }
        )
        if slowest is not None:
            record["slowest_update"] = slowest
        if ctx.sums is not None:
            record["summed_on_arrival"] = True  # no update was held: see aggregation.ClusterSums
        if self.cfg.aggregation.secure and ctx.sums is not None:  # the server read each cluster's sum only
            record["masked"] = sorted(ctx.sums.summed_into)  # the silos whose masked updates entered a sum
        left = [{"silo": c, **d} for c, d in self.dropped.items() if d["round"] == t]
        if self.cfg.runtime.on_silo_failure == "drop":
            record["dropped"] = left
        if too_many_gone(self.dropped, self.cfg.silos, self.cfg.runtime.max_dropped):
            self.stop.fail(
                f"{len(self.dropped)} of {self.cfg.silos} silos left, over runtime.max_dropped "
                f"({self.cfg.runtime.max_dropped:g})"
            )
        if ctx.step_seconds:
            record["server_steps"] = {k: round(v, 4) for k, v in ctx.step_seconds.items()}
        record.update(ctx.facts)
        if self.cfg.privacy.on:
            record["privacy"] = self.privacy_spent(record)
        self.say_round(t, record, phases)
        return record

    def updates_and_clusters(self, ctx: ServerRound, phases: dict[str, float]) -> tuple[np.ndarray, dict | None]:
        """The round's updates, then its clusters (which the strategy may find from the
        updates); under aggregation.secure the clusters first, as the masks are set up within
        them. Returns the clusters and the slowest update."""
        if self.cfg.aggregation.secure:
            with timed(phases, "clustering"):
                clusters = self.strategy.after_training(ctx)
            with timed(phases, "train"):
                return clusters, self.receive_masked(ctx, clusters)
        if self.cfg.aggregation.streams and not self.cfg.privacy.on and self.strategy.settled(ctx):
            ctx.sums = ClusterSums(self.cfg.aggregation, ctx.round, self.strategy.clusters, ctx.start_models)
        with timed(phases, "train"):
            slowest = self.receive_updates(ctx, self.strategy.ahead_of_update(ctx))
        with timed(phases, "clustering"):
            return self.strategy.after_training(ctx), slowest

    def privacy_spent(self, record: dict) -> dict:
        """ε at δ of the silo whose update entered a noised sum in the most rounds so far (each
        such round one Gaussian mechanism for it; a round it sat out, none), and per cluster of
        the round, that of its member that entered the most (a silo that changed clusters brings
        its rounds with it: its data's guarantee is what it spent in all of them). The rounds'
        draws are a function of the run seed, known to whoever sees the models, so sampling
        amplifies nothing: a silo's rounds are counted as they were."""
        rounds = Counter(c for r in [*self.records, record] for c in updated(r))
        members: dict[int, list[int]] = {}
        for silo, k in enumerate(record.get("clusters") or []):
            if k is not None:
                members.setdefault(int(k), []).append(silo)

        def spent(n: int) -> dict:
            return {"epsilon": self.cfg.privacy.spent(n), "rounds": n}

        most = max(rounds.values(), default=0)
        per_cluster = [{"cluster": k, **spent(max(rounds[c] for c in members[k]))} for k in sorted(members)]
        return {**spent(most), "delta": self.cfg.privacy.delta, "per_cluster": per_cluster}

    def say_round(self, t: int, record: dict, phases: dict[str, float]) -> None:
        """Round t's line on the console, and with --verbose its slowest update and timed steps."""
        say(
            f"round {t}/{self.cfg.train.rounds}  clusters {record['n_clusters']}  ARI {_ari(record['ari'])}  "
            f"acc avg {100 * record['avg_acc']:.2f} worst {100 * record['worst_acc']:.2f}  "
            + "  ".join(f"{k} {v:.1f}s" for k, v in phases.items())
            + (
                f"  DP ε {record['privacy']['epsilon']:.2f} (δ {record['privacy']['delta']:g})"
                if "privacy" in record
                else ""
            )
        )
        if (slowest := record.get("slowest_update")) is not None:
            where = f" on {slowest['host']}" if "host" in slowest else ""
            detail(f"round {t}: the last update came from {slowest['from']}{where} after {slowest['seconds']:.2f}s")
        for whose, steps in (("the server's", record.get("server_steps")), ("the silos'", record.get("silo_steps"))):
            if steps:
                detail(f"round {t}: {whose} steps " + ", ".join(f"{k} {_step(v)}" for k, v in steps.items()))

    def announce(self, t: int, needs_model: set[int]) -> tuple[list[int], list[int], set[int]]:
        """Tell every silo what round t asks of it (train, evaluate or wait; whether a model
        comes, whether it trains for the first time) and send the models that must come;
        (the silos present, those training, those training for the first time)."""
        cfg = self.cfg
        here = [c for c in present(cfg, t) if c not in self.dropped]
        training = [c for c in participants(cfg, t) if c not in self.dropped]
        needs_model |= {c for c in here if cfg.join_round(c) == t}  # arriving now
        first = {c for c in training if c not in self.trained}
        wait_all(
            [
                self.channel.isend(
                    c,
                    Control(
                        TRAIN if c in training else EVALUATE if c in here else WAIT,
                        int(c in needs_model),
                        int(c in first),
                    ),
                    t,
                )
                for c in self.reachable()
            ]
        )
        wait_all(self.send_models(t - 1, sorted(needs_model), np.full(cfg.silos, -1)))
        return here, training, first

    def reachable(self) -> list[int]:
        """The silos the server still talks to: all but those it dropped for breaking the protocol
        and those out before the first round (never started)."""
        return [c for c in range(self.cfg.silos) if c not in self.expelled and c not in self.absent]

    def receive_updates(self, ctx: ServerRound, ahead: AheadOfUpdate | None) -> dict | None:
        """The training silos' weight updates and sample counts into `ctx`, in silo order, not
        arrival order: the run is a function of the seed. Where `ctx.sums` is set each update
        is summed into it as it arrives, and none is kept; `ahead`: the strategy's message each
        silo sends before its update, taken as it comes. Returns which silo's update came last,
        where it runs and after how many seconds (a slow node shows there), if any trained."""
        expect = Update.expect(ctx.round, like=self.theta0)
        expects = [lambda _: expect] if ahead is None else [ahead.expect, lambda _: expect]
        start, last = time.monotonic(), None
        arrived = {}
        for step, msg in self.channel.recv_in_turn(ctx.participants, expects, ctx.leaving, self._refused(ctx.round)):
            if step + 1 < len(expects):
                assert ahead is not None
                ahead.take(msg)
                continue
            update, last = Update.of(msg), msg.sender
            if isinstance(ctx.sums, ClusterSums):
                ctx.sums.add(msg.sender, update.weights, update.n_samples)
                ctx.n_samples[msg.sender] = update.n_samples
            else:
                arrived[msg.sender] = update
        for c in sorted(arrived):
            ctx.updates[c], ctx.n_samples[c] = arrived[c].weights, arrived[c].n_samples
        ctx.participants[:] = [c for c in ctx.participants if c not in self.dropped]  # its cluster trains without it
        self.trained |= set(ctx.participants)
        return self.slowest(last, start)

    def receive_masked(self, ctx: ServerRound, clusters: np.ndarray) -> dict | None:
        """Secure aggregation's part of the round, once its clusters are known: each training
        silo's setup out, and each cluster's sum of masked updates into `ctx.sums` (no update,
        and no silo's sample count, is ever readable). Returns the slowest update, as
        `receive_updates` does."""
        from .secure import ServerMasking  # cryptography's ciphers: only where rounds are secure

        t, start = ctx.round, time.monotonic()
        noised = self.cfg.privacy.dp == "distributed"
        masking = ServerMasking(
            self.channel, self.cfg.aggregation, self.cfg.seed, t, ctx.leaving, self._refused(t), noised
        )
        ctx.sums, last = masking.run(list(ctx.participants), clusters, ctx.start_models, self.theta0)
        if new := sorted(set(masking.lone) - self.lone):
            self.lone |= set(new)
            warn(
                f"round {t}: secure aggregation: clusters {new} train with one member, whose sum is that "
                "member's update: the server reads it as it is"
            )
        ctx.participants[:] = [c for c in ctx.participants if c not in self.dropped]
        self.trained |= set(ctx.participants)
        return self.slowest(last, start)

    def slowest(self, last: int | None, start: float) -> dict | None:
        """Which silo's update came last (None: no silo trained), where it runs and after how
        many seconds from `start` (a slow node shows there)."""
        if last is None:
            return None
        host = self.channel.host_of(last)
        return {
            "silo": last,
            "from": self.channel.describe(last),
            **({"host": host} if host is not None else {}),
            "seconds": round(time.monotonic() - start, 4),
        }

    def _leaving(self, t: int, training: list[int] | None = None) -> Alternative | None:
        """With runtime.on_silo_failure: drop, a silo may send `Leave` where its message of round
        t is awaited; it then leaves `training` (the round's participants) too."""
        if self.cfg.runtime.on_silo_failure != "drop":
            return None

        def take(msg: Message) -> None:
            self._left(msg)
            if training is not None and msg.sender in training:
                training.remove(msg.sender)

        return Alternative(Leave.KIND, lambda _: Leave.expect(t), take)

    def _left(self, msg: Message) -> None:
        """Silo `msg.sender` left the federation: it is awaited no more, and said why (printed
        as text: a control character from a peer never reaches the console)."""
        why = _printable(Leave.of(msg).why)
        who = self.channel.describe(msg.sender)
        self.dropped[msg.sender] = {"round": msg.round, "from": who, "why": why}
        text = f"round {msg.round}: dropped {who}, which left the federation: {why}"
        warn(text)
        record_failure(self.out, f"cfl_mpi: {text}")

    def _refused(self, t: int) -> Callable[[int, ProtocolError], None] | None:
        """With runtime.on_silo_failure: drop, a silo whose message of round t breaks the
        protocol is dropped (`_expel`) instead of ending the job."""
        if self.cfg.runtime.on_silo_failure != "drop":
            return None
        return lambda silo, err: self._expel(t, silo, err)

    def _expel(self, t: int, silo: int, err: ProtocolError) -> None:
        """Drop `silo`, whose message broke the protocol: nothing of it is read any more (its
        cluster trains without it), and it is told so (`Dropped`) and then sent nothing."""
        self.channel.disown(silo)
        why = _printable(str(err))  # names the sender, kind and round
        self.dropped[silo] = {"round": t, "from": self.channel.describe(silo), "why": why}
        self.expelled.add(silo)
        self.farewells.append(self.channel.isend(silo, Dropped(why[:MAX_WHY]), 0))
        text = f"round {t}: dropped {self.channel.describe(silo)}, which broke the protocol: {why}"
        warn(text)
        record_failure(self.out, f"cfl_mpi: {text}")

    def report_decisions(self, t: int, decisions: list[Decision]) -> list[Decision]:
        """The updates the aggregation rule did not accept as sent, each printed with its reason."""
        flagged = [d for d in decisions if d.action != "accepted"]
        for d in flagged:
            warn(f"round {t}: {d.action} the update of {self.channel.describe(d.silo)}: {d.reason}")
        return flagged

    def send_models(self, t: int, silos: list[int], clusters: np.ndarray) -> list[Pending]:
        """Each silo's start model of round t + 1 and its cluster: one message per distinct model
        and cluster, which travels once per rank and is shared there (Channel.isend_all)."""
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for c in silos:
            groups[(id(self.start_models[c]), int(clusters[c]))].append(c)
        return [
            self.channel.isend_all(members, StartModel(self.start_models[members[0]], k), t)
            for (_, k), members in groups.items()
        ]

    def evaluations(self, t: int, here: list[int]) -> dict:
        """Every present silo's accuracy on its test set, and the bytes every party sent."""
        accuracy = np.full(self.cfg.silos, np.nan)
        backdoor_acc = np.full(self.cfg.silos, np.nan)
        sent = np.zeros(len(self.kinds), dtype=np.int64)
        silo_wait = np.zeros(2)
        targets = self.targets
        steps = self.halves.silo.steps
        step_rows = []

        def declared(silo: int) -> type[Evaluation]:  # other silos' extra meta is ignored
            return BackdoorEvaluation if targets[silo] else Evaluation

        expects = {
            kind: kind.expect(t, kinds=len(self.kinds), steps=len(steps)) for kind in (Evaluation, BackdoorEvaluation)
        }
        for msg in self.channel.recv_each(
            here,
            lambda c: expects[declared(c)],
            self._leaving(t),
            self._refused(t),
        ):
            silo, report = msg.sender, declared(msg.sender).of(msg)
            if steps:
                step_rows.append(report.step_seconds)
            accuracy[silo] = report.accuracy
            if isinstance(report, BackdoorEvaluation):
                backdoor_acc[silo] = report.backdoor_acc
            sent += report.sent_bytes
            silo_wait += (report.wait_wall_s, report.wait_cpu_s)
        sent += [self.channel.sent_bytes.pop(kind.name, 0) for kind in self.kinds]
        waits = self.channel.waits
        record = {
            "round": t,
            "accuracy": [None if np.isnan(a) else round(float(a), 6) for a in accuracy],
            "avg_acc": float(np.nanmean(accuracy)),
            "worst_acc": float(np.nanmin(accuracy)),
            "bytes": {kind.name: int(n) for kind, n in zip(self.kinds, sent)},
            "wait_cpu_fraction": {
                "server": _fraction(waits.cpu_s, waits.wall_s),
                "silos": _fraction(silo_wait[1], silo_wait[0]),
            },
        }
        step_seconds = np.array(step_rows)
        if steps and step_seconds.any():  # per-step wall seconds of the silos' strategy work this round
            record["silo_steps"] = {
                k: {
                    "mean": round(float(step_seconds[:, i].mean()), 4),
                    "max": round(float(step_seconds[:, i].max()), 4),
                }
                for i, k in enumerate(steps)
            }
        record.update(_backdoor_record(accuracy, backdoor_acc, targets))
        return record

    def finish(self, recorder: RunRecorder, wall_s: float) -> dict:
        cfg, record = self.cfg, self.records[-1]
        clusters = self.strategy.clusters
        summary = {
            "strategy": cfg.strategy.name,
            "rounds": cfg.train.rounds,
            "silos": cfg.silos,
            "seed": cfg.seed,
            "n_clusters": record["n_clusters"],
            "ari": record["ari"],
            "avg_acc": record["avg_acc"],
            "worst_acc": record["worst_acc"],
            "wall_s": round(wall_s, 3),  # of this process: a resumed run counts from the resume
            "resumed_after_round": self.resumed_after,
            "devices": self.devices,  # of this process's silo ranks: a resumed run may have moved
            "seconds": {k: round(sum(r["seconds"][k] for r in self.records), 3) for k in record["seconds"]},
            "bytes": {k: sum(r["bytes"][k] for r in self.records) for k in record["bytes"]},
            **self.strategy.report(),
            **({"dropped": {str(c): d for c, d in self.dropped.items()}} if self.dropped else {}),
            **{k: record[k] for k in ("target_clean_acc", "target_backdoor_acc", "privacy") if k in record},
        }
        recorder.finish(summary, self.records, clusters, self.truth, self.strategy.artifacts)
        backdoor = (
            (
                f", target silos' clean acc {100 * summary['target_clean_acc']:.2f}, backdoor acc "
                f"{100 * summary['target_backdoor_acc']:.2f}"
            )
            if "target_clean_acc" in summary
            else ""
        )
        say(
            f"done: {cfg.strategy.name} ARI {_ari(summary['ari'])}, avg acc {100 * summary['avg_acc']:.2f}, "
            f"worst {100 * summary['worst_acc']:.2f}{backdoor}{_privacy_spent(summary)}, {summary['wall_s']:.1f} s; "
            f"results in {self.out}"
        )
        return summary


def updated(record: dict) -> list[int]:
    """The silos whose updates came in a round's record (its participants, in a record of a
    version that kept no `samples`)."""
    if "masked" in record:
        return list(record["masked"])
    if "samples" not in record:
        return list(record["participants"])
    return [c for c, n in enumerate(record["samples"]) if n is not None]


def _privacy_spent(summary: dict) -> str:
    spent = summary.get("privacy")
    return "" if spent is None else f", DP ε {spent['epsilon']:.2f} at δ {spent['delta']:g} (the most any silo spent)"


def start_server(
    cfg: Config,
    channel: Channel,
    out: Path,
    stop: StopRequest,
    resume: bool = False,
    cores: int = 1,
    devices: list[str] | None = None,
    absent: Absent | None = None,
) -> Server:
    """The server, ready to `run` (from the checkpoint in `out` with `resume`); its strategy
    may use `cores` cores for its own computations; `devices` says where the silos compute;
    `absent`: the silos out of the job before its first round (of those the resumed run
    dropped, the others are readmitted)."""
    server = Server(cfg, channel, out, stop, cores, devices)
    note = cfg.data.start_note(cfg.data_facts())
    if note:
        say(note)
    if resume:
        server.resume()
        say(f"resuming {out} after round {server.next_round - 1}")
    server.keep_out(absent or Absent())
    return server


def _backdoor_record(accuracy: np.ndarray, backdoor_acc: np.ndarray, targets: np.ndarray) -> dict:
    """Backdoor sets: each silo's backdoor accuracy (None where it has no backdoor test) and the
    target silos' average clean and backdoor accuracy (the EMD-CFL paper's Table 3); nothing otherwise."""
    if not targets.any():
        return {}
    return {
        "backdoor_acc": [None if np.isnan(a) else round(float(a), 6) for a in backdoor_acc],
        "target_clean_acc": float(np.nanmean(accuracy[targets])),
        "target_backdoor_acc": float(np.nanmean(backdoor_acc[targets])),
    }


def _printable(text: str) -> str:
    """A peer's words as printable text only: a control character never reaches the console."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _ari(ari: float | None) -> str:
    """The ARI as the console shows it: "-" where the data set knows no groups to score against."""
    return "-" if ari is None else f"{ari:.3f}"


def _fraction(cpu: float, wall: float) -> float:
    return round(cpu / wall, 4) if wall > 0 else 0.0


def _step(value: object) -> str:
    """A recorded step: seconds as `1.23s` (the silos': their mean and the slowest), any other
    fact as it is."""
    if isinstance(value, dict) and {"mean", "max"} <= value.keys():
        return f"{value['mean']:.2f}s (slowest {value['max']:.2f}s)"
    return f"{value:.2f}s" if isinstance(value, float) else str(value)
