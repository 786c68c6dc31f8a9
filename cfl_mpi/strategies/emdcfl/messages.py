"""EMD-CFL's messages, each declared once (wire/payload.py): what the server and the silos
send each other in a clustering round."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...privacy.handshake import PUBLIC_KEY_BYTES
from ...wire.payload import Payload, array, scalar, state
from ..shared.fedwad_exchange import FEDWAD_KINDS
from .pairs import MEASURE, SERVE

ROLES = (SERVE, MEASURE, SERVE | MEASURE)


class Plan(Payload, kind="plan"):
    """server → silo: the partners to measure with in a stage, in tournament order, its role
    with each (1 serve, 2 measure, 3 both: pairs.py), and whether another plan follows in the
    round (a staged plan's next stage)."""

    partners: np.ndarray = array("int64", "partners")
    roles: np.ndarray = array("uint8", "partners")
    more: int = scalar(int, 0, 1)

    def problem(self) -> str | None:
        if len(set(self.partners.tolist())) != len(self.partners) or not set(self.roles.tolist()) <= set(ROLES):
            return f"partners {self.partners.tolist()[:8]}, roles {self.roles.tolist()[:8]} (repeated, or no role)"
        return None


class Handshake(Payload, kind="handshake"):
    """silo ↔ silo: the public half of the silo's X25519 key of the round."""

    public_key: np.ndarray = array("uint8", PUBLIC_KEY_BYTES)


class PartnerLeft(Payload, kind="partner_left"):
    """server → silo, ahead of anything else it awaits (a notice: channel/base.py): a partner
    of the round left the federation (`runtime.on_silo_failure: drop`), so the silo waits for
    nothing more from it and skips the pairs with it it has not sent."""

    silo: int = scalar(int, 0, math.inf)


class EmbeddingModel(Payload, kind="embedding_model"):
    """silo ↔ silo: the embedding part ω of a silo's model, to a partner it serves."""

    omega: dict[str, np.ndarray] = state()


@dataclass(frozen=True)
class Projected:
    """A silo's projected clouds for partner c' (both by the pair's R): Z_{c|c}R where it
    serves c', with its τ and noise (they belong to W[c][c']); Z_{c|c'}R where it measures."""

    partner: int
    own: np.ndarray | None  # Z_{c|c}R, where the silo serves the partner
    cross: np.ndarray | None  # Z_{c|c'}R, where it measures with the partner
    tau: float = 0.0
    noise: float = 0.0
    classes: Classes | None = None  # the rows' labels, where classes are matched (classes.py)


@dataclass(frozen=True)
class Classes:
    """What class matching adds to a pair's clouds: the label of each row, and where the silo
    serves, its validation sample through the pair's R (the server takes τ on matched rows)."""

    own: np.ndarray | None  # labels of Z_{c|c}'s rows, where it serves
    val: np.ndarray | None  # Z^val_{c|c}R, where it serves
    val_labels: np.ndarray | None
    cross: np.ndarray | None  # labels of Z_{c|c'}'s rows, where it measures


class Embeddings(Payload, kind="embeddings"):
    """silo → server: a batch of pairs' clouds, as its plan gave it the roles: its own cloud
    and τ for the partners it serves, its cross cloud for those it measures with; its noise
    where it serves one, else 0 (the noise belongs to the rows of W it serves). One size of
    cloud in all of a silo's batches of a round: the server checks it across them."""

    served: np.ndarray = array("int64", "served")
    own: np.ndarray = array("float32", "served", None, "dim_r")
    tau: np.ndarray = array("float64", "served")
    measured: np.ndarray = array("int64", "measured")
    cross: np.ndarray = array("float32", "measured", None, "dim_r")
    noise: float = scalar(float, 0.0, math.inf)
    skipped: np.ndarray = array("int64", "skipped")  # partners that left: their pairs not sent, never will be
    # where classes are matched (else empty): each row's label, and Z^val_{c|c}R per partner served
    own_labels: np.ndarray = array("int64", None, None)
    val: np.ndarray = array("float32", None, None, "dim_r")
    val_labels: np.ndarray = array("int64", None, None)
    cross_labels: np.ndarray = array("int64", None, None)

    @staticmethod
    def batch(ready: list[Projected], dim_r: int, skipped: list[int] | None = None) -> Embeddings:
        """The message of the pairs `ready`, and of the partners whose pairs the silo skips
        because they left (`PartnerLeft`)."""
        served = [p for p in ready if p.own is not None]
        measured = [p for p in ready if p.cross is not None]

        def clouds(arrays: list[np.ndarray | None]) -> np.ndarray:
            kept = [a for a in arrays if a is not None]
            return np.stack(kept) if kept else np.zeros((0, 0, dim_r), dtype=np.float32)

        def labels(arrays: list[np.ndarray | None]) -> np.ndarray:
            kept = [a for a in arrays if a is not None]
            return np.stack(kept).astype(np.int64) if kept else np.zeros((0, 0), dtype=np.int64)

        served_classes = [p.classes for p in served if p.classes is not None]
        measured_classes = [p.classes for p in measured if p.classes is not None]
        return Embeddings(
            np.asarray([p.partner for p in served], dtype=np.int64),
            clouds([p.own for p in served]),
            np.asarray([p.tau for p in served], dtype=np.float64),
            np.asarray([p.partner for p in measured], dtype=np.int64),
            clouds([p.cross for p in measured]),
            next((p.noise for p in served), 0.0),
            np.asarray(skipped or [], dtype=np.int64),
            labels([k.own for k in served_classes]),
            clouds([k.val for k in served_classes]),
            labels([k.val_labels for k in served_classes]),
            labels([k.cross for k in measured_classes]),
        )

    def problem(self) -> str | None:
        if not (len(self.served) or len(self.measured) or len(self.skipped)):
            return "no cloud and no partner skipped (at least one)"
        if len(set(self.skipped.tolist())) != len(self.skipped) or set(self.skipped.tolist()) & set(
            self.served.tolist() + self.measured.tolist()
        ):
            return f"partners skipped {self.skipped[:8].tolist()}: repeated, or also sent"
        if (self.tau < 0).any():
            return f"τ {self.tau[:8].tolist()} (at least 0)"
        if not len(self.served) and self.noise != 0.0:
            return f"noise {self.noise} where it serves no partner (0: the noise belongs to the rows it serves)"
        return self._classes_problem()

    def _classes_problem(self) -> str | None:
        """Labels either absent (classes not matched) or one per row of the clouds they label,
        with a validation cloud per partner served; none negative (the server bounds them by
        the run's classes)."""
        served, measured = len(self.served), len(self.measured)
        matched = any(a.size for a in (self.own_labels, self.val, self.val_labels, self.cross_labels))
        if not matched:
            return None
        shapes = (self.own_labels.shape, self.val_labels.shape, self.cross_labels.shape)
        clouds = (self.own.shape[:2], self.val.shape[:2], self.cross.shape[:2])
        own_ok = not served or (shapes[0] == clouds[0] and len(self.val) == served)
        cross_ok = not measured or shapes[2] == clouds[2]
        if not (own_ok and cross_ok and shapes[1] == clouds[1]):
            return f"labels of shapes {shapes} for clouds of {clouds} rows ({len(self.val)} validation clouds)"
        if not served and (self.own_labels.size or self.val.size):
            return "labels of its own cloud where it serves no partner"
        if not measured and self.cross_labels.size:
            return "labels of cross clouds where it measures with no partner"
        if any((a < 0).any() for a in (self.own_labels, self.val_labels, self.cross_labels)):
            return "a negative label"
        return None


class ReferenceReport(Payload, kind="reference"):
    """silo → server, in FedWaD mode (fedwad.py): τ_c, its noise scale and the size of its
    sample, before it serves the FedWaD jobs of its pairs."""

    tau: float = scalar(float, 0.0, math.inf)
    noise: float = scalar(float, 0.0, math.inf)
    n_samples: int = scalar(int, 2, math.inf)  # the server bounds it by max_rows too


KINDS = (
    Plan.KIND,
    Handshake.KIND,
    EmbeddingModel.KIND,
    Embeddings.KIND,
    ReferenceReport.KIND,
    *FEDWAD_KINDS,
    PartnerLeft.KIND,
)
