"""Fuzzing the wire: generated and mutated messages against the receivers' real expectations.

Whatever a peer sends — valid JSON of any shape, mutated bytes of a good header, arrays that
do not fit their header, huge or non-finite numbers — the receiving side either accepts a
message that fits its `Expect` or raises ProtocolError naming the sender, the kind and the
round; nothing else escapes, and nothing hangs. Over 10,000 messages per run (the example
counts below), in well under a minute.
"""

from __future__ import annotations

import json
import math

import numpy as np
from declared_messages import DECLARED, declared_expect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cfl_mpi.channel import SERVER, LocalChannel, LocalHub
from cfl_mpi.strategies.emdcfl.messages import Embeddings
from cfl_mpi.wire.messages import (
    ALLOWED_DTYPES,
    FINITE_ROW,
    Expect,
    ProtocolError,
    all_finite,
    decode_header,
    encode_header,
)
from cfl_mpi.wire.round import BackdoorEvaluation

ROUND = 3
EXPECTS = [
    BackdoorEvaluation.expect(ROUND, kinds=5, steps=2),  # lengths a receiver fixes
    Embeddings.expect(ROUND, dim_r=5, max_elements=64 * 5),
    *(declared_expect(cls, ROUND) for cls in DECLARED),  # every declared message: the round's and the strategies'
]
SENDER = 2
# Fresh random examples in every run (no database, not derandomised): each CI run searches
# anew, so a run's share of examples is kept to what fits the suite's time.
FUZZ = settings(max_examples=1200, suppress_health_check=list(HealthCheck), database=None)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def good_header(expect: Expect, rows: int = 4) -> tuple[bytes, list[np.ndarray]]:
    """A header and payload that `expect` accepts (the honest sender's bytes)."""
    arrays = {a.name: np.ones(tuple(rows if d is None else d for d in a.shape), dtype=a.dtype) for a in expect.arrays}
    meta = {k: ("x" if t is str else 0.5 if t is float else 1) for k, t in expect.meta.items()}
    meta.update({k: lo for k, (lo, _) in expect.bounds.items() if k in meta and lo > -math.inf})
    return encode_header(expect.kind, ROUND, SENDER, arrays, meta), list(arrays.values())


def decodes_or_refuses(data: bytes, expect: Expect) -> None:
    try:
        layout, meta = decode_header(data, SENDER, f"silo {SENDER}", expect)
    except ProtocolError as err:
        assert f"silo {SENDER}" in str(err) and str(expect.kind) in str(err) and f"round {ROUND}" in str(err)
        return
    assert [name for name, _, _ in layout] == [a.name for a in expect.arrays]
    for (_, dtype, shape), spec in zip(layout, expect.arrays):
        assert dtype in ALLOWED_DTYPES and spec.check(dtype, shape) is None and math.prod(shape) <= expect.max_elements
    for key, typ in expect.meta.items():
        low, high = expect.bounds.get(key, (-math.inf, math.inf))
        assert isinstance(meta[key], typ) or typ is float and isinstance(meta[key], int)
        assert typ is str or low <= meta[key] <= high


@FUZZ
@given(
    header=st.dictionaries(st.sampled_from(["v", "kind", "round", "sender", "arrays", "meta", "x"]), json_values),
    which=st.integers(0, len(EXPECTS) - 1),
)
def test_any_json_header_is_decoded_or_refused(header, which):
    decodes_or_refuses(json.dumps(header).encode(), EXPECTS[which])


@FUZZ
@given(which=st.integers(0, len(EXPECTS) - 1), data=st.data())
def test_mutated_good_headers_are_decoded_or_refused(which, data):
    expect = EXPECTS[which]
    raw = bytearray(good_header(expect)[0])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw)))
        how = data.draw(st.sampled_from(["flip", "insert", "delete", "digits", "truncate"]))
        if how == "flip" and at < len(raw):
            raw[at] = data.draw(st.integers(0, 255))
        elif how == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del raw[at : at + data.draw(st.integers(1, 8))]
        elif how == "digits":  # grow a number: huge counts, shapes and exponents
            raw[at:at] = b"9" * data.draw(st.integers(1, 400))
        else:
            del raw[at:]
    decodes_or_refuses(bytes(raw), expect)


@FUZZ
@given(which=st.integers(0, len(EXPECTS) - 1), data=st.data())
def test_the_receive_path_accepts_only_what_fits(which, data):
    """Through a real channel: a header (good, or with a mutated meta value) and arrays of any
    dtype, shape and content."""
    expect = EXPECTS[which]
    header, payload = good_header(expect)
    if data.draw(st.booleans()):
        decoded = json.loads(header)
        key = data.draw(st.sampled_from(sorted(decoded["meta"]) or ["none"]))
        decoded["meta"][key] = data.draw(json_values)
        header = json.dumps(decoded).encode()
    arrays = []
    for a in payload:
        dtype = data.draw(st.sampled_from([a.dtype.name, "float64", "float32", "int64", "uint8"]))
        shape = data.draw(st.sampled_from([a.shape, (2,), (), (1, *a.shape)]))
        fill = data.draw(st.sampled_from([0.0, 1e30, np.inf, np.nan, -1.0]))
        with np.errstate(invalid="ignore", over="ignore"):  # NaN or inf cast to an integer type is garbage: fine
            arrays.append(np.full(shape, fill).astype(dtype))
    hub = LocalHub()
    hub.post(SENDER, SERVER, header, arrays)
    server = LocalChannel(SERVER, hub, timeout_s=5, max_sleep_s=0.01)
    try:
        msg = server.recv(SENDER, expect)
    except ProtocolError as err:
        assert f"silo {SENDER}" in str(err) and str(expect.kind) in str(err) and f"round {ROUND}" in str(err)
        return
    for a in msg.arrays.values():
        assert a.dtype.kind != "f" or np.isfinite(a).all()
    assert expect.check is None or expect.check(msg.arrays, msg.meta) is None


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 3 * FINITE_ROW + 7),
    dtype=st.sampled_from(["float16", "float32", "float64"]),
    bad=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    where=st.floats(0, 1),
    shape_2d=st.booleans(),
    overflowing=st.booleans(),
)
def test_the_finite_check_agrees_with_numpy(size, dtype, bad, where, shape_2d, overflowing):
    """Bad values anywhere, row edges and the tail included, are found; finite arrays pass,
    those whose row sums overflow too (one row or many of the type's largest values)."""
    if overflowing:
        a = np.full(size, np.finfo(dtype).max, dtype)
        a[1::3] *= -1
    else:
        big = 6e4 if dtype == "float16" else 1e30
        a = np.linspace(-big, big, size).astype(dtype)
    if bad is not None and size:
        a[min(int(where * size), size - 1)] = bad
    if shape_2d and size % 2 == 0:
        a = a.reshape(2, -1)
    assert all_finite(a) == bool(np.isfinite(a).all())
    assert all_finite(np.array(bad if bad is not None else 1.0, dtype)) == (bad is None)  # 0-d
