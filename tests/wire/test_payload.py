"""Declared messages (wire/payload.py): each travels and comes back as it was sent, and the
receiver refuses, naming the sender, the kind and the round, whatever its declaration rules
out — a dtype, a length, a length two arrays must share, a scalar out of its range, or the
class's own problem."""

from __future__ import annotations

import math

import numpy as np
import pytest
from declared_messages import DECLARED, MODEL, VALID, declared_expect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cfl_mpi.channel import SERVER, LocalChannel, LocalHub
from cfl_mpi.wire.messages import ProtocolError
from cfl_mpi.wire.payload import ArrayField, Payload, StateField, array, scalar

ROUND = 5
SENDER = 3


def channels() -> tuple[LocalChannel, LocalChannel]:
    hub = LocalHub()
    return LocalChannel(SENDER, hub, timeout_s=5, max_sleep_s=0.01), LocalChannel(
        SERVER, hub, timeout_s=5, max_sleep_s=0.01
    )


def through(message: Payload, arrays: dict | None = None, meta: dict | None = None) -> Payload:
    """`message` sent (or its arrays and meta, as a hostile peer would change them) and
    received against its class's declaration."""
    sender, receiver = channels()
    if arrays is None and meta is None:
        sender.send(SERVER, message, ROUND)
    else:
        sender.send(
            SERVER,
            message.KIND,
            ROUND,
            arrays if arrays is not None else message.arrays(),
            **(meta if meta is not None else message.meta()),
        )
    cls = type(message)
    return cls.of(receiver.recv(SENDER, declared_expect(cls, ROUND)))


def same(a: Payload, b: Payload) -> bool:
    return (
        a.arrays().keys() == b.arrays().keys()
        and a.meta() == b.meta()
        and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a.arrays().values(), b.arrays().values()))
    )


def refused(message: Payload, words: str = "", **change) -> None:
    with pytest.raises(ProtocolError) as err:
        through(message, **change)
    text = str(err.value)
    assert f"silo {SENDER}" in text and message.KIND.name in text and f"round {ROUND}" in text and words in text, text


def test_every_declared_message_has_a_valid_example():
    assert set(VALID) == set(DECLARED) and len(DECLARED) >= 18


@pytest.mark.parametrize("cls", DECLARED, ids=lambda cls: cls.__name__)
def test_a_valid_message_comes_back_as_it_was_sent(cls):
    example = VALID[cls]
    assert example.problem() is None
    assert same(through(example), example)


@pytest.mark.parametrize("cls", DECLARED, ids=lambda cls: cls.__name__)
def test_each_array_and_scalar_is_checked_against_its_declaration(cls):
    example = VALID[cls]
    arrays, meta = example.arrays(), example.meta()
    for name, wire in cls.fields():
        if isinstance(wire, (ArrayField, StateField)):
            name = name if isinstance(wire, ArrayField) else next(iter(arrays))
            other = "float32" if arrays[name].dtype != np.float32 else "float64"
            refused(example, f"{name!r} has dtype {other}", arrays={**arrays, name: arrays[name].astype(other)})
            refused(example, f"{name!r} has shape", arrays={**arrays, name: arrays[name][None]})
        else:
            wrong = "x" if wire.type is not str else 1
            refused(example, f"meta {name!r}", meta={**meta, name: wrong})
            if wire.low > -math.inf:
                refused(example, "outside", meta={**meta, name: wire.type(wire.low - 1)})
            if wire.high < math.inf:
                refused(example, "outside", meta={**meta, name: wire.type(wire.high + 1)})


@pytest.mark.parametrize(
    "cls",
    [
        cls
        for cls in DECLARED
        if any(sum(isinstance(n, str) for w in [wire] for n in getattr(w, "shape", ())) for _, wire in cls.fields())
    ],
    ids=lambda cls: cls.__name__,
)
def test_a_length_two_arrays_share_is_the_same_in_both(cls):
    """Lengthen each array along a named length alone: the arrays that share it disagree."""
    example = VALID[cls]
    arrays = example.arrays()
    for name, wire in cls.fields():
        if not isinstance(wire, ArrayField):
            continue
        for axis, length in enumerate(wire.shape):
            shared = [n for n, w in cls.fields() if n != name and isinstance(w, ArrayField) and length in w.shape]
            if isinstance(length, str) and shared:
                longer = np.concatenate(
                    [
                        arrays[name],
                        np.take(arrays[name], [0] * 1, axis=axis)
                        if arrays[name].shape[axis]
                        else np.zeros_like(
                            arrays[name], shape=tuple(1 if i == axis else s for i, s in enumerate(arrays[name].shape))
                        ),
                    ],
                    axis=axis,
                )
                refused(example, f"along {length!r}", arrays={**arrays, name: longer})


def _values(cls: type[Payload], draw) -> Payload:
    """An instance of `cls` from its declaration alone: lengths, dtypes, ranges."""
    lengths: dict[str, int] = {}
    values = {}
    for name, wire in cls.fields():
        if isinstance(wire, StateField):
            values[name] = {k: np.full(v.shape, draw(st.integers(-3, 3)), v.dtype) for k, v in MODEL.items()}
        elif isinstance(wire, ArrayField):
            shape = tuple(
                n
                if isinstance(n, int)
                else lengths.setdefault(n, draw(st.integers(0, 3)))
                if isinstance(n, str)
                else draw(st.integers(0, 3))
                for n in wire.shape
            )
            values[name] = np.asarray(
                draw(st.lists(st.integers(0, 3), min_size=math.prod(shape), max_size=math.prod(shape))),
                dtype=wire.dtype,
            ).reshape(shape)
        elif wire.type is str:
            values[name] = draw(st.text(max_size=8))
        else:
            low, high = max(wire.low, -4), min(wire.high, 4)
            values[name] = draw(
                st.integers(int(math.ceil(low)), int(high)) if wire.type is int else st.floats(low, high)
            )
    return cls(**values)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_any_instance_of_a_declaration_comes_back_or_is_refused_for_its_problem(data):
    """Drawn from each declaration alone: it comes back as sent where its class finds no
    problem with it, and is refused with that problem where it does."""
    cls = data.draw(st.sampled_from(DECLARED))
    message = _values(cls, data.draw)
    problem = message.problem()
    if problem is None:
        assert same(through(message), message)
    else:
        refused(message, problem)


class _Probe(Payload, kind="payload_test_probe"):
    """A message of the tests' own: two arrays sharing a length, a fixed width, a range."""

    ids: np.ndarray = array("int64", "n")
    rows: np.ndarray = array("float32", "n", 3)
    share: float = scalar(float, 0.0, 1.0)

    def problem(self) -> str | None:
        return "negative ids" if (self.ids < 0).any() else None


def test_a_receiver_fixes_a_named_length_and_narrows_a_range():
    sender, receiver = channels()
    probe = _Probe(np.arange(2), np.zeros((2, 3), np.float32), 0.5)
    sender.send(SERVER, probe, ROUND)
    assert same(_Probe.of(receiver.recv(SENDER, _Probe.expect(ROUND, n=2, ranges={"share": (0.25, 0.75)}))), probe)
    for expect, words in (
        (_Probe.expect(ROUND, n=3), "shape"),
        (_Probe.expect(ROUND, ranges={"share": (0, 0.25)}), "outside"),
    ):
        sender.send(SERVER, probe, ROUND)
        with pytest.raises(ProtocolError, match=words):
            receiver.recv(SENDER, expect)
    sender.send(SERVER, _Probe(np.array([-1]), np.zeros((1, 3), np.float32), 0.5), ROUND)
    with pytest.raises(ProtocolError, match="payload_test_probe of round 5 with negative ids"):
        receiver.recv(SENDER, _Probe.expect(ROUND))


def test_a_declaration_is_checked_when_the_class_is_made():
    with pytest.raises(TypeError, match="declare"):

        class _Bare(Payload, kind="payload_test_bare"):
            x: int = 0

    with pytest.raises(TypeError, match="travel alone"):
        from cfl_mpi.wire.payload import state

        class _Two(Payload, kind="payload_test_two"):
            a: dict = state()
            b: np.ndarray = array("int64", 1)


def test_a_receiver_names_only_what_the_declaration_has():
    with pytest.raises(TypeError, match="name no length"):
        _Probe.expect(ROUND, m=2)
    with pytest.raises(TypeError, match="name no length"):
        _Probe.expect(ROUND, ranges={"shares": (0, 1)})
    with pytest.raises(TypeError, match="name no length"):
        _Probe.expect(ROUND, like=MODEL)


def test_a_sender_s_own_wrong_array_is_its_error_before_anything_travels():
    sender, _ = channels()
    with pytest.raises(TypeError, match="_Probe.rows: float64 of rank 2, declared float32"):
        sender.send(SERVER, _Probe(np.arange(2), np.zeros((2, 3)), 0.5), ROUND)
    assert not sender.sent_bytes


class _Fragile(Payload, kind="payload_test_fragile"):
    """A message whose own check fails on content it did not foresee."""

    ids: np.ndarray = array("int64", None)

    def problem(self) -> str | None:
        return None if int(self.ids[0]) >= 0 else "negative"


def test_a_check_that_fails_on_hostile_content_refuses_the_message():
    sender, receiver = channels()
    sender.send(SERVER, _Fragile.KIND, ROUND, {"ids": np.zeros(0, np.int64)})  # ids[0]: IndexError
    with pytest.raises(ProtocolError, match="payload_test_fragile of round 5 with content _Fragile cannot read"):
        receiver.recv(SENDER, _Fragile.expect(ROUND))


def test_a_message_shared_by_receivers_is_checked_once_for_each_class_they_read_it_as():
    """One frame to two parties of a process, each reading it as another class of the kind:
    each class's checks run (a cached pass of the first must not let the second's refusal by)."""

    class _Lenient(Payload, kind=_Fragile.KIND):
        ids: np.ndarray = array("int64", None)

    hub = LocalHub()
    sender = LocalChannel(SENDER, hub, timeout_s=5, max_sleep_s=0.01)
    lenient, strict = (LocalChannel(c, hub, timeout_s=5, max_sleep_s=0.01) for c in (0, 1))
    sender.isend_all([0, 1], _Lenient(np.array([-1])), ROUND).wait()
    assert _Lenient.of(lenient.recv(SENDER, _Lenient.expect(ROUND))).ids.tolist() == [-1]
    with pytest.raises(ProtocolError, match="with negative"):
        strict.recv(SENDER, _Fragile.expect(ROUND))
