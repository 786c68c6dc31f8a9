"""Point-to-point transport of typed messages over MPI buffers, without busy waiting.

MPICH and Open MPI spin a core inside blocking calls. A rank that waits here instead
polls non-blocking requests with an exponential back-off sleep (as mpi4py's demos do),
so an idle server or a silo waiting for its partner leaves the cores to ranks that train.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .messages import (MAX_HEADER_BYTES, PAYLOAD_TAG_OFFSET, Expect, Kind, Message,
                       ProtocolError, decode_header, encode_header)


class PeerTimeout(RuntimeError):
    """A peer stayed silent longer than the configured message timeout."""


@dataclass
class WaitStats:
    """How long this rank waited, and how much CPU it burnt doing so (should be ~0)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


@dataclass
class PendingSend:
    """Requests of a message still in flight; the buffers stay referenced until `wait`."""

    transport: "Transport"
    requests: list[MPI.Request]
    buffers: list[object] = field(repr=False)

    def wait(self) -> None:
        self.transport._wait(lambda: MPI.Request.Testall(self.requests), "send to complete")
        self.buffers.clear()

    def done(self) -> bool:
        """Whether the message has left (its buffers are then released); never waits."""
        if MPI.Request.Testall(self.requests):
            self.buffers.clear()
            return True
        return False


class Transport:
    """Sends and receives `Message`s on one communicator; counts bytes per message kind."""

    def __init__(self, comm: MPI.Comm, timeout_s: float, max_sleep_s: float) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.timeout_s = timeout_s
        self.max_sleep_s = max_sleep_s
        self.sent_bytes: Counter[str] = Counter()
        self.waits = WaitStats()

    # ------------------------------------------------------------------ waiting
    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Poll `ready` with exponential back-off until true or the timeout expires."""
        if ready():
            return
        start, cpu0 = time.monotonic(), time.process_time()
        sleep = 5e-5
        try:
            while not ready():
                if time.monotonic() - start > self.timeout_s:
                    raise PeerTimeout(f"rank {self.rank}: waited {self.timeout_s:.0f} s for {what}")
                time.sleep(sleep)
                sleep = min(sleep * 2, self.max_sleep_s)
        finally:
            self.waits.wall_s += time.monotonic() - start
            self.waits.cpu_s += time.process_time() - cpu0

    # ------------------------------------------------------------------ sending
    def isend(self, dest: int, kind: Kind, round: int, arrays: dict[str, np.ndarray] | None = None,
              **meta: object) -> PendingSend:
        """Start sending a message; call `.wait()` on the result before reusing the arrays."""
        # np.require keeps 0-d arrays (e.g. BatchNorm's step counter) 0-d; ascontiguousarray would not.
        arrays = {k: np.require(v, requirements="C") for k, v in (arrays or {}).items()}
        header = np.frombuffer(encode_header(kind, round, self.rank, arrays, meta), dtype=np.uint8)
        requests = [self.comm.Isend([header, MPI.BYTE], dest=dest, tag=int(kind))]
        for a in arrays.values():
            requests.append(self.comm.Isend([a.reshape(-1).view(np.uint8), MPI.BYTE], dest=dest,
                                            tag=PAYLOAD_TAG_OFFSET + int(kind)))
        self.sent_bytes[kind.label] += header.nbytes + sum(a.nbytes for a in arrays.values())
        return PendingSend(self, requests, [header, *arrays.values()])

    def send(self, dest: int, kind: Kind, round: int, arrays: dict[str, np.ndarray] | None = None,
             **meta: object) -> None:
        self.isend(dest, kind, round, arrays, **meta).wait()

    # ---------------------------------------------------------------- receiving
    def recv(self, source: int, expect: Expect) -> Message:
        """Receive the next message from `source`, which must match `expect`."""
        status = MPI.Status()
        self._wait(lambda: self.comm.Iprobe(source=source, tag=MPI.ANY_TAG, status=status),
                   f"{expect.kind.label} of round {expect.round} from rank {source}")
        return self._receive_probed(status, expect)

    def recv_any(self, sources: Iterable[int], expect: Callable[[int], Expect]) -> Message:
        """Receive the first message to arrive from any of `sources`; `expect(source)` checks it."""
        sources = list(sources)
        status = MPI.Status()

        def any_ready() -> bool:
            return any(self.comm.Iprobe(source=src, tag=MPI.ANY_TAG, status=status) for src in sources)

        self._wait(any_ready, f"a message from ranks {sources}")
        return self._receive_probed(status, expect(status.Get_source()))

    def recv_each(self, sources: Iterable[int], expect: Callable[[int], Expect]) -> Iterator[Message]:
        """Yield one message from each source, in the order they arrive."""
        pending = set(sources)
        while pending:
            message = self.recv_any(sorted(pending), expect)
            pending.remove(message.sender)
            yield message

    def _receive_probed(self, status: MPI.Status, expect: Expect) -> Message:
        source, tag, size = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
        if tag != int(expect.kind) or size > MAX_HEADER_BYTES:
            # Drain it so the error is about this message, not a later mismatch.
            self.comm.Recv([bytearray(size), MPI.BYTE], source=source, tag=tag)
            raise ProtocolError(f"rank {source} sent an unexpected message (tag {tag}, {size} bytes) "
                                f"while rank {self.rank} expected {expect.kind.label} of round {expect.round}")
        raw = bytearray(size)
        self.comm.Recv([raw, MPI.BYTE], source=source, tag=tag)
        layout, meta = decode_header(bytes(raw), source, tag, expect)
        arrays = {name: np.empty(shape, dtype=dtype) for name, dtype, shape in layout}
        statuses = [MPI.Status() for _ in arrays]
        requests = [self.comm.Irecv([a.reshape(-1).view(np.uint8), MPI.BYTE], source=source,
                                    tag=PAYLOAD_TAG_OFFSET + tag) for a in arrays.values()]
        try:
            self._wait(lambda: MPI.Request.Testall(requests, statuses),
                       f"payload of {expect.kind.label} from rank {source}")
        except MPI.Exception as err:  # e.g. MPI_ERR_TRUNCATE: more bytes than declared
            raise ProtocolError(f"rank {source} sent a payload of {expect.kind.label} (round "
                                f"{expect.round}) that does not fit its header: {err}") from None
        for (name, a), st in zip(arrays.items(), statuses):
            if st.Get_count(MPI.BYTE) != a.nbytes:
                raise ProtocolError(f"rank {source} sent {st.Get_count(MPI.BYTE)} bytes for array {name!r} "
                                    f"of {expect.kind.label} (round {expect.round}), header declared {a.nbytes}")
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise ProtocolError(f"rank {source} sent non-finite values in {name!r} of "
                                    f"{expect.kind.label} (round {expect.round})")
        return Message(expect.kind, expect.round, source, arrays, meta)
