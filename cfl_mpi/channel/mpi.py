"""MPI backend: each party lives on a rank (`RankLayout`); raw buffers behind a typed header.

Parties on the same rank (several silos per rank) reach each other through the process's
`LocalHub`; every other message is an MPI header (the JSON of `wire.messages`) followed by
one raw buffer per array, never a pickle. Each ordered pair of parties has its own header
tag and payload tag, derived from their slots on their ranks: co-located parties never take
each other's messages, and MPI's non-overtaking rule keeps every payload right behind its
header. MPI calls of the threads of one rank go through one lock (MPI_THREAD_SERIALIZED
suffices), and none of them blocks.
"""
from __future__ import annotations

import threading

import numpy as np
from mpi4py import MPI

from ..wire.messages import MAX_HEADER_BYTES, Expect, Message, ProtocolError, check_payload, decode_header
from .base import Pending, PeerTimeout
from .layout import RankLayout
from .local import LocalChannel, LocalHub

__all__ = ["MpiChannel"]

# Polling a payload whose header has arrived. An honest peer posts the payload right behind
# its header, so the wait is as long as the copy (45 MB: ~7 ms here, 3.5 MB: 0.3 ms); the
# doubling back-off alone would overshoot it by up to the time already waited (a 45 MB payload
# was taken 12.7 ms after its header, benchmarks/wire.py). So the receiver polls without
# sleeping for as long as a large copy takes, then at most 1 ms apart: a peer that withholds
# its payload costs it 10 ms of CPU, not payload_timeout_s.
PAYLOAD_SPIN_S = 10e-3
PAYLOAD_MAX_SLEEP_S = 1e-3


class _MpiPending(Pending):
    """Requests of a message in flight; its buffers stay referenced until they complete."""

    def __init__(self, channel: "MpiChannel", requests: list[MPI.Request], buffers: list[np.ndarray]) -> None:
        self.channel, self.requests, self.buffers = channel, requests, buffers

    def wait(self) -> None:
        self.channel._wait(self.done, lambda: "a send to complete")

    def done(self) -> bool:
        with self.channel.mpi_lock:
            complete = MPI.Request.Testall(self.requests)
        if complete:
            self.buffers.clear()
        return complete


class MpiChannel(LocalChannel):
    """A party on an MPI rank: co-located parties through the hub, the others through MPI."""

    def __init__(self, me: int, comm: MPI.Comm, layout: RankLayout, hub: LocalHub, mpi_lock: threading.Lock,
                 timeout_s: float, max_sleep_s: float, payload_timeout_s: float) -> None:
        super().__init__(me, hub, timeout_s, max_sleep_s)
        self.comm, self.layout, self.mpi_lock = comm, layout, mpi_lock
        self.payload_timeout_s = payload_timeout_s
        self.rank = comm.Get_rank()
        if layout.rank_of(me) != self.rank or layout.world_size != comm.Get_size():
            raise ValueError(f"{layout.describe(me)} cannot live on rank {self.rank} of {comm.Get_size()}")
        highest = 2 * layout.slots * layout.slots - 1
        if highest > comm.Get_attr(MPI.TAG_UB):
            raise ValueError(f"{layout.slots} parties per rank need MPI tags up to {highest}, over this MPI's "
                             f"limit {comm.Get_attr(MPI.TAG_UB)} (use fewer silos per rank)")

    def describe(self, address: int) -> str:
        return self.layout.describe(address)

    def _remote(self, peer: int) -> bool:
        return self.layout.rank_of(peer) != self.rank

    def tag_of(self, src: int, dest: int) -> int:
        """The header tag of messages from `src` to `dest`; their payloads travel on tag + 1."""
        return 2 * (self.layout.slot_of(src) * self.layout.slots + self.layout.slot_of(dest))

    def _post(self, dest: int, header: bytes, arrays: list[np.ndarray]) -> Pending:
        if not self._remote(dest):
            return super()._post(dest, header, arrays)
        rank, tag = self.layout.rank_of(dest), self.tag_of(self.me, dest)
        buffers = [np.frombuffer(header, dtype=np.uint8), *(a.reshape(-1).view(np.uint8) for a in arrays)]
        with self.mpi_lock:
            requests = [self.comm.Isend([buffers[0], MPI.BYTE], dest=rank, tag=tag)]
            requests += [self.comm.Isend([b, MPI.BYTE], dest=rank, tag=tag + 1) for b in buffers[1:]]
        return _MpiPending(self, requests, buffers)

    def _arrived(self, source: int) -> bool:
        if not self._remote(source):
            return super()._arrived(source)
        with self.mpi_lock:
            return self.comm.Iprobe(source=self.layout.rank_of(source), tag=self.tag_of(source, self.me))

    def _receive(self, source: int, expect: Expect) -> Message:
        if not self._remote(source):
            return super()._receive(source, expect)
        rank, tag, who = self.layout.rank_of(source), self.tag_of(source, self.me), self.describe(source)
        status = MPI.Status()
        with self.mpi_lock:  # only this party receives on this tag: the probed message is still there
            self.comm.Iprobe(source=rank, tag=tag, status=status)
            size = status.Get_count(MPI.BYTE)
            if size > MAX_HEADER_BYTES:
                raise ProtocolError(f"{who} sent a header of {size} bytes, over {MAX_HEADER_BYTES} (expected "
                                    f"{expect.kind} of round {expect.round})")
            raw = bytearray(size)
            self.comm.Recv([raw, MPI.BYTE], source=rank, tag=tag)
        layout, meta = decode_header(bytes(raw), source, who, expect)
        arrays = {name: np.empty(shape, dtype=dtype) for name, dtype, shape in layout}
        statuses = [MPI.Status() for _ in arrays]
        with self.mpi_lock:
            requests = [self.comm.Irecv([a.reshape(-1).view(np.uint8), MPI.BYTE], source=rank, tag=tag + 1)
                        for a in arrays.values()]

        def arrived() -> bool:
            with self.mpi_lock:
                return MPI.Request.Testall(requests, statuses)

        try:
            self._wait(arrived, lambda: f"the payload of {expect.kind} from {who}", self.payload_timeout_s,
                       min(PAYLOAD_MAX_SLEEP_S, self.max_sleep_s), PAYLOAD_SPIN_S)
        except PeerTimeout:  # an honest peer posts the payload right behind the header
            raise ProtocolError(f"{who} sent a header of {expect.kind} (round {expect.round}) whose payload did "
                                f"not follow within {self.payload_timeout_s:g} s") from None
        except MPI.Exception as err:  # e.g. MPI_ERR_TRUNCATE: more bytes than declared
            raise ProtocolError(f"{who} sent a payload of {expect.kind} (round {expect.round}) that does not "
                                f"fit its header: {err}") from None
        for (name, a), st in zip(arrays.items(), statuses):
            if st.Get_count(MPI.BYTE) != a.nbytes:
                raise ProtocolError(f"{who} sent {st.Get_count(MPI.BYTE)} bytes for array {name!r} of "
                                    f"{expect.kind} (round {expect.round}), header declared {a.nbytes}")
        check_payload(arrays, who, expect)
        return Message(expect.kind, expect.round, source, arrays, meta, who)

