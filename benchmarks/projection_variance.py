"""How much EMD-CFL's clusters depend on the pairs' secret projections R.

    python -m benchmarks.projection_variance [--config digits|mnist16|FILE] [--draws 30]
        [--set KEY=VALUE ...] [--variant KEY=VALUE[,KEY=VALUE] ...] [--check-run RUN_DIR]

With ephemeral pair keys (the default) every run draws a fresh R per pair, and that is the
only thing that differs between two runs of one config: training, the samples and each
silo's noise estimate are functions of the seed. So the silos are trained once, exactly as
round 1 of a run trains them, their embeddings taken as the silos take them, and the
clustering round is then replayed for `--draws` independent sets of pair seeds, each a run
as the MPI job would compute it (the same W, noise and rule code). `--variant` replays other
clustering settings (R's distribution, τ's projection, the noise's draws, the cut) on the same
trained silos and draws, side by side. `--check-run` compares the replay with a finished run
made with `strategy.pair_keys=seeded`, whose pair seeds the replay derives too: the two W
must agree to float rounding.

Prints, per setting, over the draws: how often ARI is 1, the worst and median of the rule's
two distances to the cut (`min_between` − cut and cut − `max_within`, noise units), and for
the pairs that decide (the closest pair of silos of different clusters, the loosest pair
inside one) the mean and spread over R of the rule's pair distance: the spread is what the
projection adds from run to run, the mean what the run's samples fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score
from threadpoolctl import threadpool_limits

from cfl_mpi.clustering.extraction import robust_clusters
from cfl_mpi.config import Config, load_config
from cfl_mpi.models.build import build_model, initial_model, load_arrays
from cfl_mpi.privacy.handshake import pair_seed, projection_matrix, public_bytes
from cfl_mpi.runtime.placement import usable_cores
from cfl_mpi.strategies.emdcfl import EmdCflConfig
from cfl_mpi.strategies.emdcfl.distances import pair_distance, projected_dim, sample_size
from cfl_mpi.strategies.emdcfl.parts import distance_of
from cfl_mpi.strategies.emdcfl.silo import pair_context, round_key
from cfl_mpi.training.local import embed, train_local

from .runs import MNIST

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "digits": ("configs/digits.yaml", []),
    "mnist16": ("configs/rotated_mnist_test.yaml", ["silos=16", f"data.root={MNIST}", "data.download=false"]),
}
# what a variant may change: the clustering round's settings, not what the silos embed
CLUSTERING_KEYS = [
    f
    for f in dataclasses.fields(EmdCflConfig)
    if f.name
    in (
        "projection",
        "proj_ratio",
        "tau_projection",
        "noise_splits",
        "noise_multiple",
        "distance",
        "sinkhorn_reg",
        "ground_cost",
    )
]


@dataclass
class Silo:
    """What a silo measures its pairs with after round 1's training (unprojected)."""

    z_own: np.ndarray  # Z_{c|c}: its sample under its own model
    z_val: np.ndarray  # Z^val_{c|c}
    rng_state: dict  # its round's generator after the sample's draw: the noise's draws
    cross: dict[int, np.ndarray]  # partner r → Z_{c|r}: its sample under r's model
    tau: float | None = None  # τ_c (None: per pair), and the noise, for the settings last given
    noise: float = 0.0


def trained_silos(cfg: Config) -> list[Silo]:
    """Round 1 of a run, silo by silo: θ(0), local training with the run's generator, the
    sample from the run's own draws, then every silo's sample under every other silo's model;
    τ and the noise as the run computes them (`with_references`)."""
    s = cfg.strategy
    theta0 = initial_model(cfg.architecture, cfg.seed)
    models, samples, silos = [], [], []
    for c in range(cfg.silos):
        data = cfg.data.build(c, cfg.data_facts())
        model = build_model(cfg.architecture, load_weights=False)
        load_arrays(model, theta0)
        seed = int(np.random.SeedSequence([cfg.seed, c, 1]).generate_state(1)[0])
        train_local(model, data.x_train, data.y_train, cfg.train, torch.Generator().manual_seed(seed), "cpu")
        rng = np.random.default_rng([cfg.seed, 11, c, 1])
        rows = np.sort(
            rng.choice(
                len(data.y_train),
                sample_size(s.sample_fraction, s.max_rows, len(data.y_train), len(data.y_val)),
                replace=False,
            )
        )
        z_own = embed(model.embedding, data.x_train[rows], "cpu")
        z_val = embed(model.embedding, data.x_val[: s.max_rows], "cpu")
        models.append(model)
        samples.append(data.x_train[rows])
        silos.append(Silo(z_own, z_val, rng.bit_generator.state, {}))
    for c, silo in enumerate(silos):
        silo.cross = {r: embed(models[r].embedding, samples[c], "cpu") for r in range(cfg.silos) if r != c}
    return with_references(cfg, silos)


def with_references(cfg: Config, silos: list[Silo]) -> list[Silo]:
    """Each silo's τ and noise under cfg's clustering settings, from the run's own draws, with
    the BLAS threads a simulated run gives each silo (its share of the cores): a threaded
    product sums in another order, and τ would differ from the run's in its last bit."""
    distance, dim_r = distance_of(cfg.strategy), projected_dim(cfg.strategy.proj_ratio, cfg.model.embedding_dim)
    with threadpool_limits(max(1, usable_cores() // cfg.silos)):
        for silo in silos:
            rng = np.random.default_rng()
            rng.bit_generator.state = silo.rng_state
            silo.tau, silo.noise = distance.reference(silo.z_own, silo.z_val, dim_r, rng)
    return silos


def seeded_pair_seeds(cfg: Config) -> dict[tuple[int, int], bytes]:
    """The pair seeds a run with `pair_keys: seeded` derives in round 1."""
    keys = [round_key(True, cfg.seed, 1, c) for c in range(cfg.silos)]
    context = pair_context(cfg.seed, 1)
    return {
        (a, b): pair_seed(keys[a], public_bytes(keys[b]), a, b, context)
        for a in range(cfg.silos)
        for b in range(a + 1, cfg.silos)
    }


def random_pair_seeds(cfg: Config, rng: np.random.Generator) -> dict[tuple[int, int], bytes]:
    """A fresh secret per pair, as ephemeral keys give (drawn from `rng` so the study repeats)."""
    return {(a, b): rng.bytes(32) for a in range(cfg.silos) for b in range(a + 1, cfg.silos)}


def replay_w(cfg: Config, silos: list[Silo], seeds: dict[tuple[int, int], bytes]) -> np.ndarray:
    """W of the clustering round for these pair seeds: W[r][c] = W1(Z_{r|r}R, Z_{c|r}R) − τ_r."""
    s, distance = cfg.strategy, distance_of(cfg.strategy)
    dim_z, dim_r = cfg.model.embedding_dim, projected_dim(s.proj_ratio, cfg.model.embedding_dim)
    W = np.zeros((cfg.silos, cfg.silos))
    for (a, b), seed in seeds.items():
        R = projection_matrix(seed, dim_z, dim_r, s.projection)
        for r, c in ((a, b), (b, a)):
            own = silos[r].z_own @ R
            tau = silos[r].tau if silos[r].tau is not None else distance.pair_reference(own, silos[r].z_val, R)
            W[r, c] = pair_distance(distance, own, silos[c].cross[r] @ R) - tau
    return W


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="digits", help=f"one of {sorted(CASES)} or a config file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="clustering settings to replay side by side on the same trained silos (strategy "
        "keys that do not change what a silo embeds); the config's own come first",
    )
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--study-seed", type=int, default=0)
    parser.add_argument("--check-run", type=Path, help="a run of the same config with strategy.pair_keys=seeded")
    parser.add_argument("--json", type=Path, help="write every draw's figures here (one file per variant)")
    args = parser.parse_args(argv)
    path, overrides = CASES.get(args.config, (args.config, []))
    cfg = load_config(ROOT / path, [*overrides, *args.set])
    s = cfg.strategy
    if (
        s.name != "emdcfl"
        or s.pairs != "all"
        or s.distance == "fedwad"
        or s.partner_sample != "train"
        or s.embed_mode != "eval"
    ):
        raise SystemExit(
            "the replay is of EMD-CFL's direct all-pairs round with strategy.partner_sample: train and embed_mode: eval"
        )
    torch.set_num_threads(1)
    threadpool_limits(1)
    start = time.monotonic()
    silos = trained_silos(cfg)
    print(f"{cfg.name}: {cfg.silos} silos trained and embedded in {time.monotonic() - start:.0f} s", flush=True)
    if args.check_run:
        W_run = np.load(args.check_run / "W.npy")
        W = replay_w(cfg, silos, seeded_pair_seeds(cfg))
        print(
            f"replay against the seeded run: largest |ΔW| {np.nanmax(np.abs(W - W_run)):.3g} "
            f"(largest |W| {np.nanmax(np.abs(W_run)):.3g})",
            flush=True,
        )
    for k, variant in enumerate(["", *args.variant]):
        sets = [*overrides, *args.set, *filter(None, variant.split(","))]
        this = load_config(ROOT / path, sets)
        if (
            dataclasses.replace(this.strategy, **{f.name: getattr(cfg.strategy, f.name) for f in CLUSTERING_KEYS})
            != cfg.strategy
        ):
            raise SystemExit(f"--variant {variant}: only {[f.name for f in CLUSTERING_KEYS]} may change")
        rows, Ws = replay(this, with_references(this, silos), args.draws, args.study_seed)
        noise = np.array([x.noise for x in silos])
        print(f"=== {variant or 'the config as given'}: noise {np.round(noise, 5).tolist()}")
        print(summary(rows, Ws, noise, cfg.data.true_clusters(cfg.silos), this.strategy.noise_multiple), flush=True)
        if args.json:
            out = args.json if not k else args.json.with_name(f"{args.json.stem}-{k}{args.json.suffix}")
            out.write_text(
                json.dumps(
                    {
                        "variant": variant,
                        "rows": rows,
                        "W": Ws.tolist(),
                        "noise": noise.tolist(),
                        "truth": cfg.data.true_clusters(cfg.silos).tolist(),
                    }
                )
            )


def replay(cfg: Config, silos: list[Silo], draws: int, seed: int) -> tuple[list[dict], np.ndarray]:
    """`draws` clustering rounds of fresh pair secrets: each one's ARI and distances to the cut, and W."""
    cut, rng, rows, Ws = cfg.strategy.noise_multiple, np.random.default_rng(seed), [], []
    noise, truth = np.array([x.noise for x in silos]), cfg.data.true_clusters(cfg.silos)
    for _ in range(draws):
        W = replay_w(cfg, silos, random_pair_seeds(cfg, rng))
        labels, report = robust_clusters(W, noise, noise_multiple=cut)
        rows.append(
            {
                "ari": adjusted_rand_score(truth, labels),
                "clusters": report.n_clusters,
                "between": report.min_between - cut if report.min_between is not None else None,
                "within": cut - report.max_within if report.max_within is not None else None,
            }
        )
        Ws.append(W)
    return rows, np.stack(Ws)


def summary(rows: list[dict], Ws: np.ndarray, noise: np.ndarray, truth: np.ndarray, cut: float) -> str:
    """Over the draws: ARI, the worst distances to the cut, and the spread over R of the rule's
    pair distance max(W[c][c'], W[c'][c]) in noise units, for the pairs that decide: the closest
    pair of silos of different clusters and the loosest pair inside one (on average over R)."""
    aris = np.array([r["ari"] for r in rows])
    between = [r["between"] for r in rows if r["between"] is not None]
    within = [r["within"] for r in rows if r["within"] is not None]
    units = Ws / noise[None, :, None]
    D = np.maximum(units, units.transpose(0, 2, 1))
    upper = np.triu(np.ones_like(D[0], dtype=bool), 1)
    same = (truth[:, None] == truth[None, :]) & upper
    across = (truth[:, None] != truth[None, :]) & upper
    mean, spread = D.mean(axis=0), D.std(axis=0)
    closest = tuple(int(i) for i in np.unravel_index(np.where(across, mean, np.inf).argmin(), mean.shape))
    loosest = tuple(int(i) for i in np.unravel_index(np.where(same, mean, -np.inf).argmax(), mean.shape))
    nearest = min(8, int(across.sum()))
    below, above = merge_heights(D, len(np.unique(truth)))
    return "\n".join(
        [
            f"ARI 1.0 in {int((aris == 1).sum())} of {len(aris)} draws (lowest {aris.min():.3f})",
            f"min_between − cut: worst {min(between):.2f}, median {np.median(between):.2f}",
            f"cut − max_within: worst {min(within):.2f}, median {np.median(within):.2f}",
            f"the rule's own decision, its average-linkage merges: the last to the true number of clusters "
            f"worst {below.max():.2f}, median {np.median(below):.2f}; the next worst {above.min():.2f}, median "
            f"{np.median(above):.2f} (cut {cut})",
            f"max(W, Wᵀ) in noise units over R (mean ± std): closest pair across clusters {closest} "
            f"{mean[closest]:.2f} ± {spread[closest]:.2f}; loosest pair inside one {loosest} "
            f"{mean[loosest]:.2f} ± {spread[loosest]:.2f}",
            f"its std over R, median over pairs: inside a cluster {np.median(spread[same]):.2f}, across the "
            f"{nearest} closest pairs {np.median(spread[across][np.argsort(mean[across])[:nearest]]):.2f}",
        ]
    )


def merge_heights(D: np.ndarray, clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """Per draw, the average-linkage merge that leaves `clusters` groups and the one after it:
    the rule finds that many clusters while its cut lies between them (scipy's UPGMA, which the
    rule's own linkage equals when every pair is measured)."""
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    heights = np.stack([linkage(squareform(d - np.diag(np.diag(d)), checks=False), "average")[:, 2] for d in D])
    return heights[:, -clusters], heights[:, -clusters + 1]


if __name__ == "__main__":
    main()
