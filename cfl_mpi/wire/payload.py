"""A message declared once: one class per message, whose fields say what travels (arrays
with their dtype and shape, scalars with their bounds). The sender builds an instance and
sends it; the receiver asks the class for its `Expect`, and the channel checks what arrives
against it, the lengths the fields share and the class's own `problem` included, before the
receiver reads the instance back with `of`.

    class Plan(Payload, kind="plan"):
        '''server → silo: the partners to measure with, and its role with each.'''
        partners: np.ndarray = array("int64", "partners")
        roles: np.ndarray = array("uint8", "partners")   # the same length: checked on receipt
        more: int = scalar(int, 0, 1)

    channel.send(silo, Plan(partners, roles, more=0), round)
    plan = Plan.of(channel.recv(SERVER, Plan.expect(round)))
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # a dependency below 3.11
    from typing_extensions import dataclass_transform

from .messages import ALLOWED_DTYPES, ArraySpec, Expect, Kind, Message, message_kind

__all__ = ["ArrayField", "Payload", "ScalarField", "StateField", "array", "scalar", "state"]

WIRE = "wire"  # the field metadata key of a field's declaration
Length = int | str | None  # a fixed length, a named one (the same wherever it appears), or any


@dataclass(frozen=True)
class ArrayField:
    """An array: its dtype and shape. A named length is the same in every array that names it,
    and the receiver may fix it (`expect(round, dim=16)`)."""

    dtype: str
    shape: tuple[Length, ...]


@dataclass(frozen=True)
class ScalarField:
    """A scalar of the header: its type and the closed range of a number."""

    type: type
    low: float = -math.inf
    high: float = math.inf


@dataclass(frozen=True)
class StateField:
    """A model's arrays, by name, whose names, dtypes and shapes the receiver's template gives
    (`expect(round, like=template)`); at most one per message, and its only arrays."""


def array(dtype: str, *shape: Length) -> Any:
    return dataclasses.field(metadata={WIRE: ArrayField(dtype, shape)})


def scalar(type: type, low: float = -math.inf, high: float = math.inf) -> Any:
    return dataclasses.field(metadata={WIRE: ScalarField(type, low, high)})


def state() -> Any:
    return dataclasses.field(metadata={WIRE: StateField()})


P = TypeVar("P", bound="Payload")


@dataclass_transform(frozen_default=True, field_specifiers=(array, scalar, state))
class Payload:
    """The base of a declared message: `class X(Payload, kind=...)` makes X a frozen dataclass
    of its fields, sent under `kind` (a name, declared here, or a `Kind` several messages
    share, e.g. a request and its reply)."""

    KIND: ClassVar[Kind]
    DECLARED: ClassVar[list[type[Payload]]] = []  # every declared message, for the fuzz tests
    # derived from the fields once, when the class is made: what every message reads
    _FIELDS: ClassVar[tuple[tuple[str, ArrayField | ScalarField | StateField], ...]]
    _LENGTHS: ClassVar[frozenset[str]]  # the named lengths
    _NUMBERS: ClassVar[frozenset[str]]  # the numeric scalars

    def __init_subclass__(cls, kind: str | Kind, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(frozen=True, eq=False)(cls)  # eq: numpy arrays have no truth value
        undeclared = [f.name for f in dataclasses.fields(cls) if WIRE not in f.metadata]  # type: ignore[arg-type]
        if undeclared:
            raise TypeError(f"{cls.__name__}: declare {undeclared} with array(), scalar() or state()")
        fields = cls._FIELDS = tuple((f.name, f.metadata[WIRE]) for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        cls._LENGTHS = frozenset(
            n for _, w in fields if isinstance(w, ArrayField) for n in w.shape if isinstance(n, str)
        )
        cls._NUMBERS = frozenset(n for n, w in fields if isinstance(w, ScalarField) and w.type in (int, float))
        states = [f for f in fields if isinstance(f[1], StateField)]
        if len(states) > 1 or (states and any(isinstance(w, ArrayField) for _, w in fields)):
            raise TypeError(f"{cls.__name__}: a model's arrays travel alone (one state field, no other arrays)")
        unknown = [w.dtype for _, w in fields if isinstance(w, ArrayField) and w.dtype not in ALLOWED_DTYPES]
        if unknown:
            raise TypeError(f"{cls.__name__}: dtypes {unknown} do not travel (wire/messages.py: ALLOWED_DTYPES)")
        cls.KIND = message_kind(kind) if isinstance(kind, str) else kind
        Payload.DECLARED.append(cls)

    @classmethod
    def fields(cls) -> tuple[tuple[str, ArrayField | ScalarField | StateField], ...]:
        return cls._FIELDS

    # ------------------------------------------------------------------ the sender's side
    def arrays(self) -> dict[str, np.ndarray]:
        """What travels as raw buffers, in the declared order; an array of another dtype or rank
        than declared is the sender's own bug, raised here rather than blamed on it remotely."""
        out: dict[str, np.ndarray] = {}
        for name, wire in self.fields():
            value = getattr(self, name)
            if isinstance(wire, StateField):
                out.update(value)
            elif isinstance(wire, ArrayField):
                if value.dtype != wire.dtype or value.ndim != len(wire.shape):
                    raise TypeError(
                        f"{type(self).__name__}.{name}: {value.dtype} of rank {value.ndim}, declared "
                        f"{wire.dtype} of rank {len(wire.shape)}"
                    )
                out[name] = value
        return out

    def meta(self) -> dict[str, Any]:
        """What travels in the header, each scalar as its declared type (a numpy scalar is none
        that JSON takes)."""
        return {name: wire.type(getattr(self, name)) for name, wire in self.fields() if isinstance(wire, ScalarField)}

    # ------------------------------------------------------------------ the receiver's side
    @classmethod
    def expect(
        cls,
        round: int,
        *,
        like: dict[str, np.ndarray] | None = None,
        max_elements: int | None = None,
        ranges: dict[str, tuple[float, float]] | None = None,
        **lengths: int,
    ) -> Expect:
        """What the receiver accepts in `round`: the declared arrays, with the named lengths in
        `lengths` fixed (the others any, but equal wherever they are named), a state's arrays
        those of `like`, and the scalars in their ranges (`ranges` narrows them to what this
        receiver allows); then the class's `problem`."""
        has_state = any(isinstance(w, StateField) for _, w in cls._FIELDS)
        wrong = (
            sorted(set(lengths) - cls._LENGTHS)
            + sorted(set(ranges or {}) - cls._NUMBERS)
            + (["like"] if like is not None and not has_state else [])
        )
        if wrong:
            raise TypeError(f"{cls.__name__}.expect: {wrong} name no length, number or model of the message")
        specs: list[ArraySpec] = []
        meta: dict[str, type] = {}
        bounds: dict[str, tuple[float, float]] = {}
        for name, wire in cls.fields():
            if isinstance(wire, StateField):
                if like is None:
                    raise TypeError(f"{cls.__name__}.expect: pass the template of its model's arrays (like=)")
                specs += ArraySpec.each_of(like)
            elif isinstance(wire, ArrayField):
                shape = tuple(
                    n if isinstance(n, int) else lengths.get(n) if isinstance(n, str) else None for n in wire.shape
                )
                specs.append(ArraySpec(name, wire.dtype, shape))
            else:
                meta[name] = wire.type
                if wire.type in (int, float):
                    low, high = (ranges or {}).get(name, (wire.low, wire.high))
                    bounds[name] = (max(low, wire.low), min(high, wire.high))
        extra = {} if max_elements is None else {"max_elements": max_elements}
        return Expect(cls.KIND, round, tuple(specs), meta, bounds=bounds, check=cls._problem_of, **extra)

    @classmethod
    def of(cls: type[P], msg: Message) -> P:
        """The received message as this class (the channel has checked it against `expect`)."""
        return cls._build(msg.arrays, msg.meta)

    @classmethod
    def _build(cls: type[P], arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> P:
        values: dict[str, Any] = {}
        for name, wire in cls.fields():
            if isinstance(wire, StateField):
                values[name] = arrays
            elif isinstance(wire, ArrayField):
                values[name] = arrays[name]
            else:  # JSON's 1 for a float field is the float 1.0
                values[name] = float(meta[name]) if wire.type is float else meta[name]
        return cls(**values)

    @classmethod
    def _problem_of(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> str | None:
        """What is wrong with a message that fits the declared dtypes and ranks: named lengths
        that differ between arrays, or the class's own `problem`."""
        seen: dict[str, tuple[str, int]] = {}
        for name, wire in cls.fields():
            if not isinstance(wire, ArrayField):
                continue
            for axis, length in enumerate(wire.shape):
                if isinstance(length, str):
                    got = arrays[name].shape[axis]
                    first = seen.setdefault(length, (name, got))
                    if first[1] != got:
                        return (
                            f"{name!r} of {got} along {length!r} where {first[0]!r} has {first[1]} "
                            "(the same length in both)"
                        )
        try:
            return cls._build(arrays, meta).problem()
        except Exception as err:  # whatever a peer sends ends as its ProtocolError, never this party's crash
            return f"content {cls.__name__} cannot read ({type(err).__name__}: {str(err)[:120]})"

    def problem(self) -> str | None:
        """What a well-formed message of this class may still get wrong (e.g. a plan repeating
        a partner): None, or the reason to refuse it. Checks that need the receiver's state
        (what it asked for, what came before) stay with the receiver."""
        return None
