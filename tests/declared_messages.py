"""Every declared message (wire/payload.py), the round's and the strategies', with a valid
example of each: what the wire's round-trip and fuzz tests go through."""

from __future__ import annotations

import importlib

import numpy as np

from cfl_mpi.data.report import DataReport
from cfl_mpi.privacy.key_shares import SEALED_BYTES, SHARE_BYTES
from cfl_mpi.strategies import REGISTRY
from cfl_mpi.strategies.emdcfl.messages import EmbeddingModel, Embeddings, Handshake, PartnerLeft, Plan, ReferenceReport
from cfl_mpi.strategies.ifca.halves import CandidateLoss, ClusterModel, Losses
from cfl_mpi.strategies.pacfl.halves import PrincipalVectors
from cfl_mpi.strategies.shared.fedwad_exchange import FedWaDDistance, FedWaDMeasure, FedWaDRequest
from cfl_mpi.wire.messages import Expect
from cfl_mpi.wire.payload import Payload, StateField
from cfl_mpi.wire.round import BackdoorEvaluation, Control, Dropped, Evaluation, Hello, Leave, StartModel, Update
from cfl_mpi.wire.secure import (
    ForwardedShares,
    KeyShares,
    MaskedUpdate,
    MaskKey,
    RevealedShares,
    SecureSetup,
    UnmaskRequest,
)

for _spec in REGISTRY.values():  # each strategy's halves declare its messages
    importlib.import_module(_spec.halves)

MODEL = {
    "conv.weight": np.zeros((4, 1, 3, 3), np.float32),
    "conv.bias": np.zeros(4, np.float32),
    "steps": np.array(0, np.int64),
}
DECLARED: list[type[Payload]] = sorted(
    {cls for cls in Payload.DECLARED if cls.__module__.startswith("cfl_mpi.")},
    key=lambda cls: (cls.KIND.name, cls.__name__),
)
_RNG = np.random.default_rng(0)
_CLOUD = _RNG.normal(size=(2, 6, 5)).astype(np.float32)
VALID: dict[type[Payload], Payload] = {
    cls: example
    for example in [
        Hello(1),
        Control("train", 1, 0),
        StartModel({k: v + 2 for k, v in MODEL.items()}, -1),
        Update({k: v + 3 for k, v in MODEL.items()}, 90),
        Leave("OutOfMemoryError: CUDA out of memory"),
        Dropped("silo 3 sent a bad message (expected update of round 2)"),
        Evaluation(np.array([10, 0, 300], np.int64), np.zeros(0), 0.75, 0.5, 30, 1.5, 0.01),
        BackdoorEvaluation(np.array([10, 0, 300], np.int64), np.array([0.5, 0.25]), 0.75, 0.5, 30, 1.5, 0.01, 0.125),
        Plan(np.array([3, 1], np.int64), np.array([1, 3], np.uint8), 1),
        Handshake(np.arange(32, dtype=np.uint8)),
        EmbeddingModel({k: v + 1 for k, v in MODEL.items()}),
        Embeddings(
            np.array([4], np.int64),
            _CLOUD[:1],
            np.array([0.25]),
            np.array([7, 2], np.int64),
            _CLOUD,
            0.5,
            np.array([5], np.int64),
            np.zeros((1, _CLOUD.shape[1]), np.int64),
            _CLOUD[:1, :3],
            np.ones((1, 3), np.int64),
            np.arange(2 * _CLOUD.shape[1], dtype=np.int64).reshape(2, -1) % 10,
        ),
        PartnerLeft(5),
        ReferenceReport(0.1, 0.02, 40),
        FedWaDRequest(_RNG.normal(size=(3, 5)), np.full(3, 1 / 3), "interpolate", "0>1", 1, 0.4),
        FedWaDMeasure(_RNG.normal(size=(3, 5)), np.array([0.5, 0.25, 0.25]), "0>1", 1),
        FedWaDDistance("0>1", 11, 0.75),
        PrincipalVectors(np.linalg.qr(_RNG.normal(size=(12, 3)))[0]),
        ClusterModel({k: v - 1 for k, v in MODEL.items()}, 1, 4),
        Losses(np.array([0.5, 0.25, 2.0]), 1),
        CandidateLoss(np.array([0.75]), 2),
        DataReport(3, 1, 28, 28, 9, 10, 80, 9, 20),
        MaskKey(np.arange(32, dtype=np.uint8)),
        SecureSetup(
            2,
            1,
            np.array([1, 4, 6], np.int64),
            _RNG.integers(0, 256, size=(3, 32), dtype=np.uint8),
            np.array([[4, 6], [1, 6], [1, 4]], np.int64),
        ),
        KeyShares(_RNG.integers(0, 256, size=(2, SEALED_BYTES), dtype=np.uint8)),
        ForwardedShares(np.array([4], np.int64), _RNG.integers(0, 256, size=(1, 2, SEALED_BYTES), dtype=np.uint8)),
        MaskedUpdate(_RNG.integers(-(2**62), 2**62, size=9), _RNG.integers(0, 256, size=(1, 32), dtype=np.uint8)),
        UnmaskRequest(np.array([4], np.int64)),
        RevealedShares(_RNG.integers(0, 256, size=(1, SHARE_BYTES), dtype=np.uint8)),
    ]
    for cls in [type(example)]
}


def declared_expect(cls: type[Payload], round: int) -> Expect:
    """The receiver's expectation of `cls` with no length fixed (a model's arrays: MODEL's)."""
    has_state = any(isinstance(wire, StateField) for _, wire in cls.fields())
    return cls.expect(round, like=MODEL if has_state else None)
