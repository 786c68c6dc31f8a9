"""One hostile silo among three in a cluster: the honest silos' accuracy under each
aggregation rule, against a clean run (in-process: the project's own data, model, local
training and aggregation functions; no MPI).

    python benchmarks/robust_aggregation.py [--rounds 5] [--epochs 3] [--channels [32,64]] \
        [--seeds 0,1,2] [--clean-only]

The cluster is the three silos of the 0° rotation of the rotated digits (`configs/digits.yaml`
with 6 silos in two rotations); silo 2 is hostile. Every round the three train from the
cluster's model as the silos of a real run do (same seeds), the hostile silo replaces what it
sends, and the cluster's model is aggregated. Reported: the two honest silos' mean test
accuracy after the last round (mean over seeds), its difference from the clean FedAvg run,
and what the screening decided. A second table gives the honest spread the screening bounds
must tolerate: the largest update norm and sample count relative to the cluster median.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable

import numpy as np

from cfl_mpi.aggregation.rules import AggregationConfig, aggregate, update_norm
from cfl_mpi.config import load_config

Model = dict[str, np.ndarray]
HOSTILE, HONEST = 2, (0, 1)


def sign_flip(scale: float, count: int | None) -> Callable:
    """θ = s − scale·Δ with a claimed sample count (None: the honest one)."""

    def attack(start: Model, trained: Model, n: int) -> tuple[Model, int]:
        flipped = {
            k: (start[k] - scale * (v - start[k])).astype(v.dtype) if np.issubdtype(v.dtype, np.floating) else v
            for k, v in trained.items()
        }
        return flipped, n if count is None else count

    return attack


def huge_weights(start: Model, trained: Model, n: int) -> tuple[Model, int]:
    """Finite but huge weights (the wire lets them through: they are finite float32)."""
    rng = np.random.default_rng(0)
    return {
        k: (1e30 * rng.choice([-1.0, 1.0], size=v.shape)).astype(v.dtype) if np.issubdtype(v.dtype, np.floating) else v
        for k, v in trained.items()
    }, n


def inside_default_bounds(start: Model, trained: Model, n: int) -> tuple[Model, int]:
    """An adaptive attacker: a sign flip just inside the default screening bounds (0.95 x
    norm_ratio times its own honest update's norm), claiming twice its count."""
    flipped, _ = sign_flip(0.95 * AggregationConfig().norm_ratio, None)(start, trained, n)
    return flipped, 2 * n


SCENARIOS: dict[str, Callable | None] = {
    "clean": None,
    "sign flip x10, n = 10^9": sign_flip(10.0, 10**9),
    "huge weights (1e30)": huge_weights,
    "sign flip x3.8, n x2 (inside the default bounds)": inside_default_bounds,
}
RULES = {
    "fedavg, no screening (today)": AggregationConfig(screen=False),
    "fedavg + screening, reject (default)": AggregationConfig(),
    "fedavg + screening, clip": AggregationConfig(outliers="clip"),
    "fedavg + screening, counts bounded by 2 x the median": AggregationConfig(count_ratio=2.0),
    "median": AggregationConfig(rule="median", screen=False),
    "trimmed mean, β = 1/3": AggregationConfig(rule="trimmed_mean", trim=1 / 3, screen=False),
    "norm clip (M = median norm)": AggregationConfig(rule="norm_clip", screen=False),
}


def run(cfg, data, theta0: Model, agg: AggregationConfig, attack: Callable | None, rounds: int):
    """The cluster's rounds; returns (honest accuracies, decisions, honest spread per round, the
    final model: None where it diverged, its honest silos then at chance)."""
    import torch

    from cfl_mpi.models.build import build_model, load_arrays, state_arrays
    from cfl_mpi.training.local import evaluate, train_local

    model = build_model(cfg.architecture, load_weights=False)
    members = [0, 1, 2]
    start, first_counts, decisions, spread = theta0, {}, [], []
    for t in range(1, rounds + 1):
        trained, counts = [], []
        for c in members:
            load_arrays(model, start)
            seed = int(np.random.SeedSequence([cfg.seed, c, t]).generate_state(1)[0])  # as runtime/silo.py
            train_local(
                model,
                data[c].x_train,
                data[c].y_train,
                cfg.train,
                torch.Generator().manual_seed(seed),
                torch.device("cpu"),
            )
            trained.append({k: v.copy() for k, v in state_arrays(model).items()})  # not views of the model
            counts.append(len(data[c].y_train))
        norms = [update_norm(m, start) for m in trained]
        spread.append((t, max(norms) / np.median(norms), max(counts) / np.median(counts), float(np.median(norms))))
        if attack is not None:
            trained[HOSTILE], counts[HOSTILE] = attack(start, trained[HOSTILE], counts[HOSTILE])
        try:
            start, screened = aggregate(agg, t, members, trained, [start] * 3, counts, first_counts, cfg.train.work())
        except ValueError as err:  # the cluster's model diverged (a hostile update let through): chance
            assert "not finite" in str(err), err
            return [1 / cfg.data.num_classes()] * len(HONEST), decisions, spread, None
        first_counts.update(screened.first_counts)
        decisions += [d for d in screened.decisions if d.action != "accepted"]
    load_arrays(model, start)
    accuracy = [evaluate(model, data[c].x_test, data[c].y_test, torch.device("cpu"))[0] for c in HONEST]
    return accuracy, decisions, spread, start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--channels", default="[32,64]")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--clean-only", action="store_true", help="only the honest spread (clean run, two rules)")
    args = parser.parse_args()
    if args.clean_only:
        for name in list(SCENARIOS)[1:]:
            del SCENARIOS[name]
        for name in list(RULES)[2:]:
            del RULES[name]

    import torch

    from cfl_mpi.models.build import initial_model

    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[tuple[str, str], list[float]] = {}
    decided: dict[tuple[str, str], set[str]] = {}
    spreads: list[tuple[float, float]] = []
    identical = True
    start_time = time.monotonic()
    for seed in seeds:
        cfg = load_config(
            "configs/digits.yaml",
            [
                "silos=6",
                "data.rotations=[0,180]",
                f"seed={seed}",
                f"train.local_epochs={args.epochs}",
                f"model.channels={args.channels}",
            ],
        )
        data = {c: cfg.data.build(c, cfg.data_facts()) for c in (0, 1, 2)}
        theta0 = initial_model(cfg.architecture, cfg.seed)
        for scenario, attack in SCENARIOS.items():
            finals = {}
            for rule, agg in RULES.items():
                accuracy, decisions, spread, final = run(cfg, data, theta0, agg, attack, args.rounds)
                results.setdefault((scenario, rule), []).append(float(np.mean(accuracy)))
                decided.setdefault((scenario, rule), set()).update(
                    [f"{d.action}: {d.reason.split(' above')[0].split(' claims')[0]}" for d in decisions]
                    + (["model diverged (not finite)"] if final is None else [])
                )
                finals[rule] = final
                if scenario == "clean":
                    spreads += spread
            if scenario == "clean":  # the default with honest silos is today's FedAvg, bit for bit
                a, b = finals["fedavg, no screening (today)"], finals["fedavg + screening, reject (default)"]
                assert a is not None and b is not None
                identical &= all(np.array_equal(a[k], b[k]) for k in a)
    clean = np.mean(results["clean", "fedavg, no screening (today)"])
    print(
        f"digits, cluster of 3 silos (0°), silo 2 hostile; {args.rounds} rounds of {args.epochs} epoch(s), "
        f"channels {args.channels}; seeds {args.seeds}; {time.monotonic() - start_time:.0f} s\n"
    )
    print("| hostile silo | rule | honest accuracy | vs clean FedAvg | screening decisions |")
    print("|---|---|---|---|---|")
    for (scenario, rule), accs in results.items():
        what = "; ".join(sorted(decided[scenario, rule])) or "-"
        print(f"| {scenario} | {rule} | {100 * np.mean(accs):.1f} | {100 * (np.mean(accs) - clean):+.1f} | {what} |")
    rounds, norm_spread, count_spread, median_norm = np.array(spreads).T
    print(
        f"\nhonest spread over {len(spreads)} cluster-rounds: largest update norm / median "
        f"{norm_spread.max():.3f} (mean {norm_spread.mean():.3f}), largest count / median {count_spread.max():.3f}"
    )
    first, last = median_norm[rounds == 1].mean(), median_norm[rounds == args.rounds].mean()
    print(
        f"median update norm: round 1 (from θ(0)) {first:.3f}, round {args.rounds} {last:.3f}: a silo that "
        f"arrives late and trains from θ(0) beside members in round {args.rounds} is {first / last:.1f} x their median"
    )
    print(
        f"clean run, default (screening on) vs today's FedAvg: {'identical bit for bit' if identical else 'DIFFERENT'}"
    )
    print(f"default bounds: {dataclasses.asdict(AggregationConfig())}")


if __name__ == "__main__":
    main()
