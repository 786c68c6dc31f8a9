"""Where EMD-CFL's separation goes when silos are small (docs/research/SMALL_SILOS.md).

    python -m benchmarks.small_silos RUN_DIR [RUN_DIR ...]
    python -m benchmarks.small_silos --factors [--silos 100] [--per-group 8] [--set key=value ...]
    python -m benchmarks.small_silos --table COMPARE_DIR [COMPARE_DIR ...]

The first form reads what a run recorded (W.npy, noise.npy, clusters.json, config.yaml) and prints, in the
noise units the robust rule cuts in:
- the mean of max(W, Wᵀ) within each true group and between each pair of groups;
- the pair margin under the *true* partition (closest pair across groups over the loosest
  pair inside one): what any cut of the pairs could achieve at best;
- ARI and margin of the rule as run, and of the same W cut at other multiples and linkages.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.clustering.extraction import robust_clusters, symmetrised

from .runs import MNIST, ROOT

CUTS = (1.0, 1.5, 2.0, 2.5, 3.5)
# Forms of line 16 the factor study compares, as strategy settings (on rotated_mnist_test.yaml).
FORMS = {
    "paper": {},
    "tau_same_R": {"tau_projection": "pair"},
    "energy": {"distance": "energy", "ground_cost": "chordal"},
}


def load(run: Path) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """(config, W, noise, true groups) of a run folder."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    truth = np.array(list(json.loads((run / "clusters.json").read_text())["truth"].values()))
    return cfg, np.load(run / "W.npy"), np.load(run / "noise.npy"), truth  # noise: NaN for a silo that served no pair


def group_means(D: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Mean of D over the off-diagonal pairs of each (group, group) block."""
    groups = np.unique(truth)
    means = np.zeros((len(groups), len(groups)))
    for a in groups:
        for b in groups:
            block = D[np.ix_(truth == a, truth == b)]
            if a == b:
                block = block[~np.eye(len(block), dtype=bool)]
            means[a, b] = np.nanmean(block)
    return means


def pair_margin(D: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    """(min between, max within, their ratio with max within floored at 1) under `truth`."""
    same = truth[:, None] == truth[None, :]
    off = ~np.eye(len(truth), dtype=bool)
    within, between = np.nanmax(D[same & off]), np.nanmin(D[~same])
    return float(between), float(within), float(between / max(within, 1.0))


def describe(run: Path) -> str:
    cfg, W, noise, truth = load(run)
    D = symmetrised(W, noise)
    lines = [
        f"## {run}",
        f"silos {len(truth)}, median noise {np.nanmedian(noise):.4g} "
        f"(spread {np.nanpercentile(noise, 10):.3g}–{np.nanpercentile(noise, 90):.3g}), "
        f"strategy {json.dumps({k: v for k, v in cfg['strategy'].items() if k != 'name'})}",
    ]
    means = group_means(D, truth)
    lines.append("mean max(W, Wᵀ) in noise units, group × group:")
    lines += ["  " + " ".join(f"{v:6.2f}" for v in row) for row in means]
    between, within, margin = pair_margin(D, truth)
    lines.append(f"true partition: min between {between:.2f}, max within {within:.2f}, margin {margin:.2f}")
    for how in ("average", "complete"):
        row = []
        for cut in CUTS:
            labels, report = robust_clusters(W, noise, noise_multiple=cut, linkage_method=how)
            row.append(f"{cut}: k={report.n_clusters} ARI {adjusted_rand_score(truth, labels):.2f}")
        lines.append(f"{how:8s} " + " | ".join(row))
    return "\n".join(lines)


def factors(
    silos: int, per_group: int, overrides: list[str], epochs: tuple[int, ...], fractions: tuple[float, ...]
) -> str:
    """The second form: silos of the rotated MNIST test split trained for round 1 from θ(0)
    exactly as a run does, then W[c][c'] of every ordered pair among `per_group` silos of
    groups 0 (0°), 2 (180°) and 1 (90°) under variants of line 16, at each sample fraction
    and local-epoch count. Reports the separation of 0° from 180° in units of the spread of
    W within a group: (mean between − mean within) / sd within, and the pair gap
    (min between − max within) / sd within; W in units of the row's silo noise, as the
    robust rule reads it, so "within" says where the within-group level sits against the
    cut. Variants (FORMS): `paper` W1(Z R, Z' R) − τ with τ unprojected (as run);
    `tau_same_R` τ through the pair's R; `energy` the energy distance (chordal cost), no τ;
    `energy_tau_same_R` minus a τ through R all the same; `no_projection` W1 with R = I
    (raw units)."""
    import dataclasses

    import torch

    from cfl_mpi.config import load_config
    from cfl_mpi.models.build import build_model, initial_model, load_arrays
    from cfl_mpi.ot.wasserstein import w1
    from cfl_mpi.privacy.handshake import random_projection
    from cfl_mpi.strategies.emdcfl.distances import pair_distance, projected_dim, sample_size
    from cfl_mpi.strategies.emdcfl.parts import distance_of
    from cfl_mpi.training.local import embed, train_local

    base = load_config(
        ROOT / "configs/rotated_mnist_test.yaml",
        [f"silos={silos}", f"data.root={MNIST}", "data.download=false", *overrides],
    )
    per = silos // len(base.data.rotations)
    chosen = [g * per + i for g in (0, 2, 1) for i in range(per_group)]
    group = np.array([c // per for c in chosen])
    cpu = torch.device("cpu")
    data = {c: base.data.build(c, base.data_facts()) for c in chosen}
    lines = [
        f"{silos} silos, {per_group} of each of groups 0°, 180°, 90°; train "
        f"{len(data[chosen[0]].y_train)}, val {len(data[chosen[0]].y_val)} images per silo"
    ]
    for epochs_ in epochs:
        cfg = dataclasses.replace(base, train=dataclasses.replace(base.train, local_epochs=epochs_))
        models = {}
        for c in chosen:
            model = build_model(cfg.architecture, load_weights=False)
            load_arrays(model, initial_model(cfg.architecture, cfg.seed))
            seed = int(np.random.SeedSequence([cfg.seed, c, 1]).generate_state(1)[0])
            train_local(model, data[c].x_train, data[c].y_train, cfg.train, torch.Generator().manual_seed(seed), cpu)
            models[c] = model.embedding
        for fraction in fractions:
            s = dataclasses.replace(cfg.strategy, sample_fraction=fraction)
            rng = np.random.default_rng([cfg.seed, 99])
            n = sample_size(s.sample_fraction, s.max_rows, len(data[chosen[0]].y_train), len(data[chosen[0]].y_val))
            x = {c: data[c].x_train[np.sort(rng.choice(len(data[c].y_train), n, replace=False))] for c in chosen}
            dim_r = projected_dim(cfg.strategy.proj_ratio, cfg.model.embedding_dim)
            forms = {name: distance_of(dataclasses.replace(s, **kw)) for name, kw in FORMS.items()}
            variants: dict[str, dict] = {name: {} for name in [*FORMS, "no_projection", "energy_tau_same_R"]}
            noise = {name: [] for name in forms}
            for c in chosen:
                z = {d: embed(models[c], x[d], cpu) for d in chosen}  # every sample under c's model
                v = embed(models[c], data[c].x_val[: s.sample_cap], cpu)
                tau = {}
                for name, form in forms.items():
                    tau[name], sd = form.reference(z[c], v, dim_r, rng)
                    noise[name].append(sd)
                for d in chosen:
                    if d == c:
                        continue
                    r = random_projection(rng, z[c].shape[1], dim_r, s.projection)
                    for name, form in forms.items():
                        t = tau[name] if tau[name] is not None else form.pair_reference(z[c] @ r, v, r)
                        variants[name][c, d] = (pair_distance(form, z[c] @ r, z[d] @ r) - t) / noise[name][-1]
                    variants["no_projection"][c, d] = w1(z[c], z[d], s.ground_cost) - tau["paper"]
                    variants["energy_tau_same_R"][c, d] = (
                        variants["energy"][c, d] - pair_distance(forms["energy"], z[c] @ r, v @ r) / noise["energy"][-1]
                    )
            lines.append(
                f"E = {epochs_}, sample_fraction {fraction} (n = {n}), median noise "
                + ", ".join(f"{k} {np.median(v):.4g}" for k, v in noise.items())
                + " (W in those units):"
            )
            for name, entries in variants.items():
                lines.append(f"  {name:14s} " + separation(entries, chosen, group))
    return "\n".join(lines)


def separation(entries: dict[tuple[int, int], float], chosen: list[int], group: np.ndarray) -> str:
    """0° against 180° (groups 0, 2) and 0° against 90° in units of the within-group spread."""
    where = {c: i for i, c in enumerate(chosen)}
    pairs: dict[str, list[float]] = {"within": [], "0-180": [], "0-90": []}
    for (c, d), value in entries.items():
        a, b = sorted((group[where[c]], group[where[d]]))
        key = "within" if a == b else "0-180" if (a, b) == (0, 2) else "0-90" if (a, b) == (0, 1) else None
        if key:
            pairs[key].append(value)
    within = np.array(pairs["within"])
    sd = within.std()
    # the part of that spread each row shares (τ_c's own error shifts all of row c)
    rows: dict[int, list[float]] = {}
    for (c, d), value in entries.items():
        if group[where[c]] == group[where[d]]:
            rows.setdefault(c, []).append(value)
    centred = np.concatenate([np.asarray(v) - np.mean(v) for v in rows.values()])
    out = [f"within {within.mean():.3g} ± {sd:.3g} ({centred.std() / sd:.2f} of it left when each row is centred)"]
    for key in ("0-180", "0-90"):
        between = np.array(pairs[key])
        out.append(
            f"{key}: gap {(between.mean() - within.mean()) / sd:6.2f} sd, "
            f"pairs {(between.min() - within.max()) / sd:6.2f} sd"
        )
    return ", ".join(out)


def round_walls(run: Path) -> list[float]:
    """Each round's wall seconds at the server (its phases added up), from metrics.jsonl."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [sum(r["seconds"].values()) for r in records]


def table(folders: list[Path]) -> str:
    """The third form: one markdown row per run folder (`<method>_s<seed>` under each
    `python -m cfl_mpi.experiments.compare` folder): ARI, the rule's margin, accuracies after the last
    round, and the cost of clustering as the rounds' wall time beyond FedAvg's in the same
    folder and seed (IFCA pays on every round, EMD-CFL on its first)."""
    runs = sorted(p.parent for f in folders for p in f.glob("*/summary.json"))
    rows = [
        "| C | run | clusters | ARI | margin | avg acc | worst acc | first round / later rounds (s) "
        "| rounds' wall beyond FedAvg's (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        walls = round_walls(run)
        fedavg = run.parent / f"fedavg_s{run.name.rpartition('_s')[2]}"
        extra = "–"
        if (fedavg / "metrics.jsonl").exists() and run != fedavg:
            extra = f"{sum(walls) - sum(round_walls(fedavg)):.1f}"
        margin = (summary.get("extraction") or {}).get("margin")
        later = f"{np.median(walls[1:]):.1f}" if len(walls) > 1 else "–"
        rows.append(
            f"| {summary['silos']} | {run.parent.name}/{run.name} | {summary['n_clusters']} | "
            f"{summary['ari']:.2f} | {'–' if margin is None else f'{margin:.2f}'} | "
            f"{100 * summary['avg_acc']:.1f} | {100 * summary['worst_acc']:.1f} | "
            f"{walls[0]:.1f} / {later} | {extra} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--factors", action="store_true")
    parser.add_argument("--table", type=Path, nargs="+")
    parser.add_argument("--silos", type=int, default=100)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--epochs", type=int, nargs="+", default=[1])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
    if args.factors:
        print(factors(args.silos, args.per_group, args.overrides, tuple(args.epochs), tuple(args.fractions)))
    for run in args.runs:
        print(describe(run), end="\n\n")


if __name__ == "__main__":
    main()
