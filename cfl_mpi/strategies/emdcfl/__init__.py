"""EMD-CFL: its parameters (the `strategy:` section), their checks and its registry entry.
Its server and silo halves are in server.py and silo.py, beside it (halves.py names them)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ...clustering.defaults import CLEAR_GAP, EPSILON, NOISE_MULTIPLE
from ..spec import ConfigFacts, Cut, Pairwise, PairwiseView, StrategyConfig, StrategySpec, setting


@dataclass(frozen=True)
class EmdCflConfig(StrategyConfig):
    """EMD-CFL (Zhang, Williams, Toni): one-shot clustering after round 1 on the W1 distances W
    between the silos' embeddings, measured through a secret random projection R per pair."""

    name: Literal["emdcfl"] = "emdcfl"
    # rule: neighbourhoods only: silos c and c' are neighbours when W < epsilon both ways.
    epsilon: float = EPSILON
    # dim(R) = ⌊proj_ratio · dim(Z)⌋: the fraction of the embedding's dimensions R keeps.
    proj_ratio: float = 0.9
    # How each pair's secret R is drawn: "orthonormal" columns (a random dim(R)-dimensional
    # subspace, kept exactly), or "gaussian" entries with rows normalised, as the paper and the
    # authors' code. A near-square Gaussian R distorts the embedding differently for every pair
    # secret, so W and with it the clusters change from run to run with ephemeral keys; an
    # orthonormal R holds them steady (beyond the paper: docs/methods/emdcfl-projection.md, "The projection R").
    projection: Literal["orthonormal", "gaussian"] = "orthonormal"
    # Embedding samples: n = min(⌈sample_fraction · |train|⌉, sample_cap) (the paper's text:
    # 10 %, at most 512); the authors' code takes min(|train|, 512): sample_fraction 1.0.
    # "auto": the paper's 10 %, or as many as the validation set holds where that is more, so
    # that τ is measured at W's sizes and small sites are not judged on a dozen embeddings
    # (docs/methods/emdcfl.md, "Sample sizes").
    # sample_cap bounds every sample a silo embeds (its validation sample for τ and the noise
    # too), so the server refuses a message of more rows, or a FedWaD support larger.
    sample_fraction: float | Literal["auto"] = "auto"
    sample_cap: int = 512
    # What a partner embeds under a silo's model: a sample of its "train"ing data, or of its
    # "val"idation data as the authors' code does (both samples then hold min(n, |val|) rows).
    partner_sample: Literal["train", "val"] = "train"
    # "eval": BatchNorm on its running statistics, no dropout; "train": as the authors' code
    # (batch statistics over batches of train.batch_size). Identical for the simple CNN.
    embed_mode: Literal["eval", "train"] = "eval"
    # τ_c = W1 between the silo's training and validation embeddings: "none" unprojected, "full"
    # through a fresh full-rank random projection (dim(Z) × dim(Z)) as the authors' code does
    # (with projection: gaussian; an orthonormal one is a rotation, which leaves τ as "none"),
    # "pair" once per pair through the pair's R, so line 16 subtracts it in the space W1 was
    # measured in (on small silos the projection makes much of W's spread: docs/research/SMALL_SILOS.md).
    tau_projection: Literal["none", "full", "pair"] = "none"
    # "fedwad": W1 between two silos' embeddings by FedWaD (strategies/emdcfl/fedwad.py),
    # the server never receives an embedding; needs a Euclidean ground cost (below).
    # "energy": the energy distance instead of W1, the debiased limit of the Sinkhorn
    # divergence, dimension-free in its sample size (ot/energy.py); on silos of ~100 images
    # it separates what W1 blurs (docs/research/SMALL_SILOS.md); no τ (it is unbiased), so no
    # validation images needed; needs ground_cost chordal or euclidean.
    distance: Literal["exact", "sinkhorn", "fedwad", "energy"] = "exact"
    # Entropic regularisation of the Sinkhorn solver (distance: sinkhorn).
    sinkhorn_reg: float = 0.1
    # "chordal": Euclidean cost between L2-normalised embeddings, sqrt(2 * cosine): the cosine
    # geometry in a form FedWaD can interpolate. fedwad takes chordal, euclidean, sqeuclidean.
    ground_cost: Literal["cosine", "chordal", "euclidean", "sqeuclidean"] = "cosine"
    # FedWaD mode: fedwad_iterations K, and fedwad_support, the support S of ξ (null: the
    # larger of the two clouds).
    fedwad_iterations: int = 20
    fedwad_support: int | None = None
    # Cluster extraction from W (clustering/extraction.py): "robust" cuts average-linkage
    # clusters at noise_multiple times each silo's measured noise; "neighbourhoods" is the
    # paper's rule (identical neighbourhoods at epsilon), for faithful reproduction.
    rule: Literal["robust", "neighbourhoods"] = "robust"
    noise_multiple: float = NOISE_MULTIPLE
    # W compares two silos' embeddings class by class: for every class both samples hold, as
    # many rows of each (drawn at random), so sites that differ only in their mix of labels are
    # one distribution and the groups a shift of the inputs makes stand out; the server then
    # receives the class of each row it measures, and takes τ on the matched rows (beyond the
    # paper: docs/methods/emdcfl.md, "Class by class"). "auto": on where the server measures W1
    # with τ (distance exact or sinkhorn, tau_projection none or pair; τ is then per pair,
    # through R); false: the whole samples, as the paper (its configs' tau_projection: full).
    match_classes: bool | Literal["auto"] = "auto"
    # The robust rule over all pairs keeps a split only where its clusters join at least
    # clear_gap times farther apart than the last merge that formed them (in noise units, that
    # merge floored at 1), else it joins them: silos skewed by label differ by a continuum, not
    # by groups (docs/methods/emdcfl.md, "A clear gap"). "auto": 3 (what the federation suite
    # supports) where W compares whole samples, null (the noise cut alone) where it matches
    # classes, which removes that continuum; null: the noise cut alone.
    clear_gap: float | None | Literal["auto"] = "auto"
    # Random halvings of the validation sample used to measure a silo's noise (the RMS of n
    # draws strays by about 1/√(2n) of the truth: ~13 % at 30, ~22 % at 10; a unit too small
    # can split a true pair). "auto": 100 where the halves hold under 32 embeddings (cheap
    # there), else 30.
    noise_splits: int | Literal["auto"] = 30
    # "ephemeral": X25519 keys from the OS's entropy, R is secret from everyone but the
    # pair (deploy with this). "seeded": keys derived from the run seed so that W is
    # bit-for-bit reproducible; anyone holding the config can rebuild R (experiments only).
    pair_keys: Literal["ephemeral", "seeded"] = "ephemeral"
    # Which pairs the clustering round measures: "all" of them (the paper), or "staged": all
    # pairs among pair_sample random silos, clustered by the robust rule, then each cluster's
    # `representatives` medoids against every other silo, which joins the cluster whose
    # representatives are within the cut; a silo near none is measured against `retest` more
    # members of its nearest cluster and joins it if within the cut on average over them all;
    # the silos still near none start again among themselves (strategies/emdcfl/staged_pairs.py):
    # about pair_sample²/2 + representatives·K·C pairs. A silo that first trains in a later round
    # (late_silos, participation) is placed then, against the members training with it.
    pairs: Literal["all", "staged"] = "all"
    pair_sample: int = 40
    representatives: int = 2
    retest: int = 4
    # How a staged plan measures a silo against the representatives (and retest members) it
    # is placed by: "one_way", W[r][c] alone (its data under the member's model: the member's
    # ω fans out and the member embeds nothing, half the work), or "both_ways", as all-pairs
    # (docs/research/PAIR_PLAN.md).
    placement: Literal["one_way", "both_ways"] = "one_way"

    @property
    def classes_matched(self) -> bool:
        """Whether W compares the silos class by class (`match_classes`, "auto" resolved)."""
        if self.match_classes == "auto":
            return self.distance in ("exact", "sinkhorn") and self.tau_projection != "full"
        return self.match_classes

    @property
    def gap(self) -> float | None:
        """The clear gap the robust rule applies (`clear_gap`, "auto" resolved)."""
        if self.clear_gap == "auto":
            return None if self.classes_matched else CLEAR_GAP
        return self.clear_gap

    @property
    def max_rows(self) -> int:
        """The most rows of any sample a silo embeds (its own, a partner's, its validation
        sample): what the server accepts in an embeddings message or a reference."""
        return self.sample_cap

    def problems(self, facts: ConfigFacts) -> Iterator[str]:
        if not 0 < self.proj_ratio <= 1:
            yield f"strategy.proj_ratio: must lie in (0, 1], got {self.proj_ratio}"
        if int(self.proj_ratio * facts.embedding_dim) < 1:
            yield "strategy.proj_ratio: projects the embedding to 0 dimensions (raise it)"
        if self.sample_fraction != "auto" and not 0 < self.sample_fraction <= 1:
            yield f"strategy.sample_fraction: must lie in (0, 1] or be auto, got {self.sample_fraction}"
        if self.sample_cap < 2:
            yield f"strategy.sample_cap: must be at least 2, got {self.sample_cap}"
        if self.sinkhorn_reg <= 0:
            yield f"strategy.sinkhorn_reg: must be positive, got {self.sinkhorn_reg}"
        if self.noise_multiple <= 0:
            yield f"strategy.noise_multiple: must be positive, got {self.noise_multiple}"
        if isinstance(self.clear_gap, float) and self.clear_gap < 1:
            yield f"strategy.clear_gap: must be at least 1 (1 keeps every split), null or auto, got {self.clear_gap}"
        if self.match_classes is True and self.distance in ("fedwad", "energy"):
            yield (
                f"strategy.match_classes: distance {self.distance} measures no τ on matched rows at the server; "
                "set match_classes to false (or auto), or distance to exact or sinkhorn"
            )
        if self.match_classes is True and self.tau_projection == "full":
            yield (
                "strategy.match_classes: matched classes take τ per pair through R on the matched rows; "
                "set tau_projection to pair or none, or match_classes to false"
            )
        if self.noise_splits != "auto" and self.noise_splits < 2:
            yield f"strategy.noise_splits: must be at least 2 or auto, got {self.noise_splits}"
        if self.distance == "fedwad" and self.tau_projection == "pair":
            yield (
                "strategy.tau_projection: pair needs the server to measure each pair from the embeddings "
                "(distance exact or sinkhorn); with distance fedwad use none or full"
            )
        if self.distance == "fedwad" and self.ground_cost == "cosine":
            yield (
                "strategy.ground_cost: distance fedwad needs a Euclidean cost (set ground_cost to chordal for "
                "the cosine geometry, or euclidean, or sqeuclidean)"
            )
        if self.distance == "energy" and self.ground_cost not in ("chordal", "euclidean"):
            yield (
                f"strategy.ground_cost: distance energy needs a Euclidean distance (chordal, for the cosine "
                f"geometry, or euclidean): with {self.ground_cost} it is not a distance between measures"
            )
        if self.distance == "energy" and self.tau_projection != "none":
            yield (
                "strategy.tau_projection: distance energy subtracts no τ (its estimate is unbiased: 0 on average "
                "between samples of one distribution); leave tau_projection at none"
            )
        if self.pair_sample < 2:
            yield f"strategy.pair_sample: must be at least 2, got {self.pair_sample}"
        if self.representatives < 1:
            yield f"strategy.representatives: must be at least 1, got {self.representatives}"
        if self.retest < 0:
            yield f"strategy.retest: must be at least 0, got {self.retest}"
        if self.pairs != "all" and self.rule != "robust":
            yield "strategy.pairs: staged places silos by the robust rule's cut in noise units (set rule: robust)"
        if self.fedwad_iterations < 1:
            yield f"strategy.fedwad_iterations: must be at least 1, got {self.fedwad_iterations}"
        if self.fedwad_support is not None and not 1 <= self.fedwad_support <= self.sample_cap:
            yield (
                f"strategy.fedwad_support: must lie between 1 and sample_cap ({self.sample_cap}) or be null, "
                f"got {self.fedwad_support}"
            )


W_LABEL = "distance W1 − τ, the larger of the two directions"


def w_view(artifacts: Mapping[str, Any], strategy: Any) -> PairwiseView:
    """W as the run's rule cuts it: the robust rule max(W[c][c']/noise_c, W[c'][c]/noise_c') at
    noise_multiple, the paper's max(W[c][c'], W[c'][c]) at epsilon."""
    energy = setting(strategy, EmdCflConfig, "distance") == "energy"
    both = "the larger of the two directions"
    if setting(strategy, EmdCflConfig, "rule") == "neighbourhoods":
        eps = float(setting(strategy, EmdCflConfig, "epsilon"))
        measure = "energy distance" if energy else "distance W1 − τ"
        return PairwiseView(None, Cut(eps, f"cut ε = {eps:g}"), f"{measure} (cut at ε = {eps:g}),\n{both}")
    noise = artifacts.get("noise")
    if noise is None:
        return PairwiseView(None, None, f"energy distance, {both}" if energy else W_LABEL)
    from ...clustering.extraction import noise_or_one  # numpy: only where a run is drawn

    multiple = float(setting(strategy, EmdCflConfig, "noise_multiple"))
    measure = "energy distance" if energy else "distance"
    label = f"{measure} in noise units (cut at {multiple:g}),\n{both}"
    return PairwiseView(noise_or_one(noise), Cut(multiple, f"cut {multiple:g}"), label)


SPEC = StrategySpec(
    EmdCflConfig,
    "EMD-CFL",
    f"{__name__}.halves",
    pairwise={"W": Pairwise(W_LABEL, directed=True, view=w_view)},
    validation=True,
)
