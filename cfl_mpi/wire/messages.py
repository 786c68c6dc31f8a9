"""Typed messages: what a peer may send, and how a receiver states what it expects.

A message is a JSON header (kind, round, sender, array names/dtypes/shapes, scalar meta)
followed by one raw buffer per array. Nothing a peer sends is ever unpickled.

The wire knows no algorithm: the runtime and each strategy declare each message they
exchange as a class (payload.py), which declares its kind with `message_kind`, and a
receiver checks a message against its `Expect`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "ALLOWED_DTYPES",
    "MAX_HEADER_BYTES",
    "ArraySpec",
    "Expect",
    "Kind",
    "Message",
    "ProtocolError",
    "check_payload",
    "decode_header",
    "encode_header",
    "message_kind",
]

WIRE_VERSION = 2
MAX_HEADER_BYTES = 1 << 16
ALLOWED_DTYPES = frozenset({"float32", "float64", "int64", "uint8"})
MAX_NDIM = 8
INT64_LIMIT = 1 << 63  # JSON integers are unbounded; what travels must fit int64


@dataclass(frozen=True)
class Kind:
    """A kind of message, by the name it travels under (and is counted under in metrics)."""

    name: str

    def __str__(self) -> str:
        return self.name


_DECLARED: dict[str, Kind] = {}


def message_kind(name: str) -> Kind:
    """Declare a message kind once, in the module of whoever sends it."""
    if not name.isidentifier() or name in _DECLARED:
        raise ValueError(f"message kind {name!r} is not an identifier or is declared twice")
    _DECLARED[name] = Kind(name)
    return _DECLARED[name]


def declared_kind(name: object) -> Kind | None:
    """The kind declared under `name`, if any."""
    return _DECLARED.get(name) if isinstance(name, str) else None


class ProtocolError(RuntimeError):
    """A peer sent something the protocol does not allow; names sender, kind and round."""


@dataclass(frozen=True)
class ArraySpec:
    """What one array of an expected message must look like; None in `shape` is any length."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    @staticmethod
    def each_of(arrays: dict[str, np.ndarray]) -> tuple[ArraySpec, ...]:
        """The spec of each array, exactly its name, dtype and shape (e.g. a model's state)."""
        return tuple(ArraySpec(k, str(v.dtype), tuple(v.shape)) for k, v in arrays.items())

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
    # closed ranges of numeric meta values, e.g. {"accuracy": (0, 1)}: well-formed is not plausible
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    # what else a message that fits the above must satisfy (a declared message's, payload.py):
    # None, or why it is refused
    check: Callable[[dict[str, np.ndarray], dict[str, Any]], str | None] | None = None

    @staticmethod
    def like(
        kind: Kind,
        round: int,
        arrays: dict[str, np.ndarray],
        meta: dict[str, type] | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
    ) -> Expect:
        """Expect exactly the names, dtypes and shapes of `arrays` (e.g. a model's state)."""
        specs = ArraySpec.each_of(arrays)
        return Expect(kind, round, specs, meta or {}, bounds=bounds or {})

    @staticmethod
    def as_declared(header: Any, who: str) -> Expect:
        """Whatever a read header declares (a declared kind, arrays of any shape of their
        declared rank): how a silo that left the federation takes, and discards, what was
        already on its way to it. ProtocolError if it declares no such thing."""
        fields: dict[str, Any] = header if isinstance(header, dict) else {}
        kind, round, arrays = declared_kind(fields.get("kind")), fields.get("round"), fields.get("arrays")
        if kind is None or not isinstance(round, int) or not _is_int(round) or not isinstance(arrays, list):
            raise ProtocolError(f"{who} sent a message that declares no known kind, round and arrays")
        if not all(isinstance(e, list) and len(e) == 3 and isinstance(e[2], list) for e in arrays):
            raise ProtocolError(f"{who} sent a {kind} whose arrays are not [name, dtype, shape] entries")
        specs = tuple(ArraySpec(e[0], e[1], (None,) * len(e[2])) for e in arrays)
        return Expect(kind, round, specs)


@dataclass
class Message:
    """A received message; `sender` is the silo index (or SERVER), `who` names it in errors."""

    kind: Kind
    round: int
    sender: int
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    who: str = ""


def encode_header(kind: Kind, round: int, sender: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    header = {
        "v": WIRE_VERSION,
        "kind": kind.name,
        "round": int(round),
        "sender": int(sender),
        "arrays": [[name, str(a.dtype), list(a.shape)] for name, a in arrays.items()],
        "meta": meta,
    }
    data = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {kind} is {len(data)} bytes, over {MAX_HEADER_BYTES}")
    return data


Layout = list[tuple[str, str, tuple[int, ...]]]


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):  # "1e400" parses to inf
        raise ValueError(f"non-finite number {token[:20]} in header")
    return value


def _int64(token: str) -> int:
    if len(token) > 20 or not -INT64_LIMIT <= int(token) < INT64_LIMIT:
        raise ValueError(f"integer {token[:20]}... out of int64 range in header")
    return int(token)


def _non_finite(token: str) -> float:
    raise ValueError(f"non-finite number {token} in header")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(data: bytes) -> Any:
    """A header's JSON, every number finite and within int64; ValueError (or RecursionError)
    otherwise. Not yet checked against anything a receiver expects (`decode_header`)."""
    return json.loads(data.decode(), parse_constant=_non_finite, parse_float=_finite_float, parse_int=_int64)


def decode_header(
    data: bytes, sender: int, who: str, expect: Expect, read: Callable[[bytes], Any] = read_header
) -> tuple[Layout, dict[str, Any]]:
    """Parse (`read`: a message for several receivers is read once, channel/local.py) and check
    a header that came from `sender` (named `who`) against `expect`; ProtocolError naming the
    sender, the kind and the round otherwise, whatever the bytes."""

    def fail(why: str) -> ProtocolError:
        return ProtocolError(f"{who} sent a bad message (expected {expect.kind} of round {expect.round}): {why}")

    try:
        header = read(data)
    except (UnicodeDecodeError, ValueError) as err:  # JSONDecodeError is a ValueError
        raise fail(f"header is not JSON ({str(err)[:200]})") from None
    except RecursionError:
        raise fail("header nests too deeply") from None
    if not isinstance(header, dict) or header.get("v") != WIRE_VERSION:
        version = header.get("v") if isinstance(header, dict) else type(header).__name__
        raise fail(f"unknown header version {str(version)[:40]!r}")
    if header.get("kind") != expect.kind.name:
        raise fail(f"an unexpected message of kind {str(header.get('kind'))[:40]!r}")
    if header.get("sender") != sender or not _is_int(header.get("sender")):
        raise fail(f"header claims sender {str(header.get('sender'))[:40]}")
    if header.get("round") != expect.round or not _is_int(header.get("round")):
        raise fail(f"message is for round {str(header.get('round'))[:40]}")
    meta = header.get("meta")
    if not isinstance(meta, dict) or len(meta) > 32:
        raise fail("meta is not a mapping of at most 32 entries")
    for key, value in meta.items():
        if not (
            value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 256)
        ):
            raise fail(f"meta {str(key)[:40]!r} is not a scalar")
    for key, typ in expect.meta.items():
        given: Any = meta.get(key)
        ok = isinstance(given, typ) and not (typ in (int, float) and isinstance(given, bool))
        if typ is float and _is_int(given):
            ok = True
        if not ok:
            raise fail(f"meta {key!r} is {str(given)[:40]!r}, expected {typ.__name__}")
        low, high = expect.bounds.get(key, (-math.inf, math.inf))
        if typ in (int, float) and not low <= given <= high:
            raise fail(f"meta {key!r} is {given!r}, outside [{low}, {high}]")
    arrays = header.get("arrays")
    if not isinstance(arrays, list) or len(arrays) != len(expect.arrays):
        count = len(arrays) if isinstance(arrays, list) else str(arrays)[:40]
        raise fail(f"declares {count} arrays, expected {len(expect.arrays)}")
    parsed = []
    for spec, entry in zip(expect.arrays, arrays):
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or entry[0] != spec.name
            or entry[1] not in ALLOWED_DTYPES
            or not isinstance(entry[2], list)
            or len(entry[2]) > MAX_NDIM
            or not all(_is_int(s) and s >= 0 for s in entry[2])
        ):
            raise fail(f"array entry {str(entry)[:80]} does not match {spec.name!r}")
        shape = tuple(entry[2])
        problem = spec.check(entry[1], shape)
        if problem:
            raise fail(problem)
        if math.prod(shape) > expect.max_elements:  # Python integers: no overflow
            raise fail(f"array {spec.name!r} declares {shape}, over the size limit")
        parsed.append((spec.name, entry[1], shape))
    return parsed, dict(meta)  # the receiver's own: `read` may share the header


# The finite check reads every received float once, as row sums: a matrix-vector product with
# ones, which BLAS runs at memory speed, faster than np.isfinite over the same bytes
# (docs/research/PERFORMANCE.md, "Wire checks"). IEEE arithmetic carries NaN and ±inf into every sum they
# enter (inf − inf is NaN), so a finite sum proves its row finite; finite values can also
# overflow a sum (near float32's 3.4e38), and only such a row is read again, element by element.
FINITE_ROW = 4096
_ONES = {np.dtype(t): np.ones(FINITE_ROW, dtype=t) for t in ("float32", "float64")}


def all_finite(a: np.ndarray) -> bool:
    """Whether every element of a floating array is finite (neither NaN nor ±inf)."""
    flat = a.reshape(-1)
    ones = _ONES.get(flat.dtype)
    if ones is None or flat.size < FINITE_ROW:  # float16 and other widths: no BLAS; under a row: no gain
        return bool(np.isfinite(flat).all())
    body = flat.size - flat.size % FINITE_ROW
    rows = flat[:body].reshape(-1, FINITE_ROW)
    with np.errstate(over="ignore", invalid="ignore"):  # what the check looks for
        suspects = np.flatnonzero(~np.isfinite(rows @ ones))
    return all(np.isfinite(rows[i]).all() for i in suspects) and bool(np.isfinite(flat[body:]).all())


def check_payload(arrays: dict[str, np.ndarray], meta: dict[str, Any], who: str, expect: Expect) -> None:
    """Floating arrays must be finite (NaN or inf would poison every aggregate downstream), and
    the message must pass the expectation's own `check`."""
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not all_finite(a):
            raise ProtocolError(f"{who} sent non-finite values in {name!r} of {expect.kind} (round {expect.round})")
    if expect.check is not None and (problem := expect.check(arrays, meta)):
        raise ProtocolError(f"{who} sent {expect.kind} of round {expect.round} with {problem}")
