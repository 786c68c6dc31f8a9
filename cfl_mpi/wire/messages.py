"""Typed messages: what a peer may send, and how a receiver states what it expects.

A message is a JSON header (kind, round, sender, array names/dtypes/shapes, scalar meta)
followed by one raw MPI buffer per array. Nothing a peer sends is ever unpickled.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

WIRE_VERSION = 1
MAX_HEADER_BYTES = 1 << 16
# Tags: a header travels on its kind's value, each array on PAYLOAD_TAG_OFFSET + kind.
PAYLOAD_TAG_OFFSET = 100
ALLOWED_DTYPES = frozenset({"float32", "float64", "int64", "uint8"})


class Kind(IntEnum):
    """Message kinds of SPEC.md's table, plus the small control messages a round needs."""

    MODEL = 1            # server → silo: model weights to train from / evaluate
    UPDATE = 2           # silo → server: trained weights + sample count
    EVAL = 3             # silo → server: test accuracy of the received model, byte counts
    PLAN = 4             # server → silo: partners to measure this round (EMD-CFL)
    HANDSHAKE = 5        # silo ↔ silo: X25519 public key
    EMBEDDING_MODEL = 6  # silo ↔ silo: embedding part ω of the silo's model
    EMBEDDINGS = 7       # silo → server: projected embeddings Z·R and τ
    PRINCIPAL_VECTORS = 8  # silo → server: PACFL's principal vectors U_c
    LOSSES = 9           # silo → server: IFCA's losses of the K cluster models on its data
    FEDWAD_MEASURE = 10  # server ↔ silo: a FedWaD interpolating measure ξ
    FEDWAD_DISTANCE = 11  # silo → server: Wp between its measure and the final ξ; EMD-CFL's τ_c in FedWaD mode
    CONTROL = 12         # server → silo: what to do in a round (train, evaluate, wait, stop)

    @property
    def label(self) -> str:
        return self.name.lower()


class ProtocolError(RuntimeError):
    """A peer sent something the protocol does not allow; names sender, kind/tag and round."""


@dataclass(frozen=True)
class ArraySpec:
    """What one array of an expected message must look like; None in `shape` is any length."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def check(self, dtype: str, shape: tuple[int, ...]) -> str | None:
        if dtype != self.dtype:
            return f"array {self.name!r} has dtype {dtype}, expected {self.dtype}"
        if len(shape) != len(self.shape) or any(e is not None and e != s for e, s in zip(self.shape, shape)):
            want = tuple("*" if e is None else e for e in self.shape)
            return f"array {self.name!r} has shape {shape}, expected {want}"
        return None


@dataclass(frozen=True)
class Expect:
    """A receiver's expectation: the kind, the round, the arrays and the meta keys."""

    kind: Kind
    round: int
    arrays: tuple[ArraySpec, ...] = ()
    meta: dict[str, type] = field(default_factory=dict)
    max_elements: int = 1 << 28  # refuse absurd declared sizes before allocating

    @staticmethod
    def like(kind: Kind, round: int, arrays: dict[str, np.ndarray], meta: dict[str, type] | None = None) -> "Expect":
        """Expect exactly the names, dtypes and shapes of `arrays` (e.g. a model's state)."""
        specs = tuple(ArraySpec(k, str(v.dtype), tuple(v.shape)) for k, v in arrays.items())
        return Expect(kind, round, specs, meta or {})


@dataclass
class Message:
    kind: Kind
    round: int
    sender: int
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]


def encode_header(kind: Kind, round: int, sender: int, arrays: dict[str, np.ndarray],
                  meta: dict[str, Any]) -> bytes:
    header = {
        "v": WIRE_VERSION, "kind": int(kind), "round": int(round), "sender": int(sender),
        "arrays": [[name, str(a.dtype), list(a.shape)] for name, a in arrays.items()],
        "meta": meta,
    }
    data = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {kind.label} is {len(data)} bytes, over {MAX_HEADER_BYTES}")
    return data


def decode_header(data: bytes, source: int, tag: int, expect: Expect) -> tuple[list[tuple[str, str, tuple[int, ...]]], dict[str, Any]]:
    """Parse and check a header against `expect`; raise ProtocolError naming sender, tag, round."""

    def fail(why: str) -> ProtocolError:
        return ProtocolError(f"rank {source} sent a bad message (tag {tag}, expected "
                             f"{expect.kind.label} of round {expect.round}): {why}")

    def non_finite(token: str) -> float:
        raise ValueError(f"non-finite number {token} in header")

    try:
        header = json.loads(data.decode(), parse_constant=non_finite)
    except (UnicodeDecodeError, ValueError) as err:  # JSONDecodeError is a ValueError
        raise fail(f"header is not JSON ({err})") from None
    if not isinstance(header, dict) or header.get("v") != WIRE_VERSION:
        raise fail(f"unknown header version {header.get('v') if isinstance(header, dict) else header!r}")
    if header.get("kind") != int(expect.kind) or tag != int(expect.kind):
        raise fail(f"kind {header.get('kind')} on tag {tag}")
    if header.get("sender") != source:
        raise fail(f"header claims sender {header.get('sender')}")
    if header.get("round") != expect.round:
        raise fail(f"message is for round {header.get('round')}")
    meta = header.get("meta")
    if not isinstance(meta, dict):
        raise fail("meta is not a mapping")
    for key, typ in expect.meta.items():
        value = meta.get(key)
        ok = isinstance(value, typ) and not (typ in (int, float) and isinstance(value, bool))
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise fail(f"meta {key!r} is {value!r}, expected {typ.__name__}")
    arrays = header.get("arrays")
    if not isinstance(arrays, list) or len(arrays) != len(expect.arrays):
        raise fail(f"declares {len(arrays) if isinstance(arrays, list) else arrays!r} arrays, "
                   f"expected {len(expect.arrays)}")
    parsed = []
    for spec, entry in zip(expect.arrays, arrays):
        if (not isinstance(entry, list) or len(entry) != 3 or entry[0] != spec.name
                or entry[1] not in ALLOWED_DTYPES or not isinstance(entry[2], list)
                or not all(isinstance(s, int) and s >= 0 for s in entry[2])):
            raise fail(f"array entry {entry!r} does not match {spec.name!r}")
        shape = tuple(entry[2])
        problem = spec.check(entry[1], shape)
        if problem:
            raise fail(problem)
        if int(np.prod(shape, dtype=np.int64)) > expect.max_elements:
            raise fail(f"array {spec.name!r} declares {shape}, over the size limit")
        parsed.append((spec.name, entry[1], shape))
    return parsed, meta
