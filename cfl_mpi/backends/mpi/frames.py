"""What the MPI backend's inbox files in the hub's queues (channel/local.py's `Frame`s): a
header from another rank (`RemoteHeader`) whose payloads follow as frames of their own
(`RemotePayload`, still in MPI until the receiver takes them), a small message whole
(`InlineFrame`), or a header too large to read (`OversizedHeader`); and the buffers a rank
sends: a small message in one (`inline_buffer`), a multicast's envelope (`envelope`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...channel.local import Fetch, Frame, expected
from ...wire.messages import MAX_HEADER_BYTES, Expect, ProtocolError, decode_header, read_header

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = [
    "INLINE_MAX_BYTES",
    "INLINE_MAX_MESSAGE",
    "InlineFrame",
    "OversizedHeader",
    "RemoteHeader",
    "RemotePayload",
    "carried",
    "envelope",
    "inline_buffer",
]


@dataclass(frozen=True)
class RemoteHeader(Frame):
    """A header from another rank; its arrays follow, one `RemotePayload` each, fetched by the
    receiving channel (`Fetch.payload`)."""

    header: bytes

    def header_json(self, who: str) -> object:
        return read_header(self.header)

    def contents(self, src: int, who: str, expect: Expect, fetch: Fetch | None) -> tuple[dict[str, np.ndarray], dict]:
        if fetch is None:
            return super().contents(src, who, expect, fetch)
        layout, meta = decode_header(self.header, src, who, expect)
        return fetch.payload(layout), meta


@dataclass(frozen=True)
class RemotePayload(Frame):
    """A payload matched by the inbox, still in MPI: `size` bytes, taken with `handle.Irecv`."""

    handle: MPI.Message
    size: int


@dataclass(frozen=True)
class OversizedHeader(Frame):
    """A header of `size` bytes, over MAX_HEADER_BYTES: refused without being read."""

    size: int

    def contents(self, src: int, who: str, expect: Expect, fetch: Fetch | None) -> tuple[dict[str, np.ndarray], dict]:
        raise ProtocolError(
            f"{who} sent a header of {self.size} bytes, over {MAX_HEADER_BYTES} (expected {expected(expect)})"
        )


# A message from another rank whose arrays hold up to this many bytes travels as one MPI
# message, header and arrays together (`InlineFrame`), not a header and a message per array:
# a second MPI message costs the receiving rank a match by its inbox, and the receiver a wait
# for its payload and a receive (docs/research/PERFORMANCE.md, "Small messages whole").
INLINE_MAX_BYTES = 1 << 16
_INLINE_MARK = 0  # an inline message's first byte; a header (JSON) starts with "{"
_INLINE_PREFIX = 8  # the mark, 3 bytes of padding, the header's length (uint32, little-endian)
INLINE_MAX_MESSAGE = _INLINE_PREFIX + MAX_HEADER_BYTES + 7 + INLINE_MAX_BYTES  # 7: the arrays' alignment


def _inline_start(header_bytes: int) -> int:
    """Where an inline message's arrays begin: after its prefix and header, 8-byte aligned."""
    return -(-(_INLINE_PREFIX + header_bytes) // 8) * 8


def inline_buffer(header: bytes, arrays: list[np.ndarray]) -> np.ndarray:
    """One buffer for a small message: prefix, header, padding, then each array's bytes."""
    start = _inline_start(len(header))
    buffer = np.zeros(start + sum(a.nbytes for a in arrays), dtype=np.uint8)
    buffer[:_INLINE_PREFIX] = np.frombuffer(
        bytes([_INLINE_MARK, 0, 0, 0]) + len(header).to_bytes(4, "little"), dtype=np.uint8
    )
    buffer[_INLINE_PREFIX : _INLINE_PREFIX + len(header)] = np.frombuffer(header, dtype=np.uint8)
    offset = start
    for a in arrays:
        buffer[offset : offset + a.nbytes] = a.reshape(-1).view(np.uint8)
        offset += a.nbytes
    return buffer


class InlineFrame(Frame):
    """A small message from another rank, header and arrays in one buffer (`inline_buffer`);
    its arrays are views of that buffer, which no one else holds."""

    def __init__(self, raw: bytearray) -> None:
        self.raw = raw

    def header_json(self, who: str) -> object:
        return read_header(self.header(who, "a message"))

    def contents(self, src: int, who: str, expect: Expect, fetch: Fetch | None) -> tuple[dict[str, np.ndarray], dict]:
        what = expected(expect)
        header = self.header(who, what)
        layout, meta = decode_header(header, src, who, expect)
        return self.arrays(layout, header, who, what), meta

    @staticmethod
    def marks(raw: bytearray) -> bool:
        return len(raw) > 0 and raw[0] == _INLINE_MARK

    def header(self, who: str, what: str) -> bytes:
        """The header, if its stated length is within the limit and the message."""
        length = int.from_bytes(self.raw[4:_INLINE_PREFIX], "little")
        if length > MAX_HEADER_BYTES or _INLINE_PREFIX + length > len(self.raw):
            raise ProtocolError(
                f"{who} sent a message of {len(self.raw)} bytes with a header of {length} bytes "
                f"(at most {MAX_HEADER_BYTES}; expected {what})"
            )
        return bytes(self.raw[_INLINE_PREFIX : _INLINE_PREFIX + length])

    def arrays(
        self, layout: list[tuple[str, str, tuple[int, ...]]], header: bytes, who: str, what: str
    ) -> dict[str, np.ndarray]:
        """The arrays the header declares, if the bytes after it are exactly theirs."""
        start = _inline_start(len(header))
        specs = [(name, np.dtype(dtype), shape, math.prod(shape)) for name, dtype, shape in layout]  # checked sizes
        declared = sum(d.itemsize * n for _, d, _, n in specs)
        if len(self.raw) != start + declared:
            raise ProtocolError(
                f"{who} sent a payload of {what} that does not fit its header: "
                f"{max(0, len(self.raw) - start)} bytes, header declared {declared}"
            )
        arrays, offset = {}, start
        for name, dtype, shape, count in specs:
            a = np.frombuffer(self.raw, dtype=dtype, count=count, offset=offset).reshape(shape)
            arrays[name] = a if a.flags.aligned else a.copy()
            offset += dtype.itemsize * count
        return arrays


def carried(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The arrays of a message that travel as payloads: an empty one is declared by its header
    alone (with many silos most plans of a staged plan are empty, as is one cloud of each
    one-way pair)."""
    return [a for a in arrays if a.nbytes]


ENVELOPE_FIXED = 8  # a multicast envelope's receiver count and payload count (uint32 each)


def envelope(receiver_slots: list[int], payloads: int, header: bytes) -> np.ndarray:
    """A multicast's first buffer: receiver count and payload count (uint32, little-endian),
    each receiver's slot on the rank, then the header."""
    head = np.array([len(receiver_slots), payloads, *receiver_slots], dtype="<u4").view(np.uint8)
    return np.concatenate([head, np.frombuffer(header, dtype=np.uint8)])
