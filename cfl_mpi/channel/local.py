"""In-process backend: parties in one process (threads), a FIFO per (sender, receiver) pair.

The simulator runs every party this way, and the MPI backend uses the same hub for the
silos that share a rank. A message is encoded and checked exactly as on MPI (header against
the receiver's `Expect`, finite payload), and its arrays are copied when sent, so a party can
reuse its buffers at once and never shares memory with another.
"""
from __future__ import annotations

import threading
from collections import defaultdict, deque

import numpy as np

from ..wire.messages import Expect, Message, ProtocolError, check_payload, decode_header
from .base import Channel, ChannelClosed, Pending

__all__ = ["LocalChannel", "LocalHub"]

Frame = tuple[bytes, tuple[np.ndarray, ...]]


class LocalHub:
    """The post office of one process: queues, a bell per receiver, and the run's failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[int, int], deque[Frame]] = defaultdict(deque)
        self._bells: dict[int, threading.Event] = {}
        self.failure: str | None = None

    def bell(self, address: int) -> threading.Event:
        """Rung when a message for `address` arrives (or the run fails): its waits end early."""
        with self._lock:
            return self._bells.setdefault(address, threading.Event())

    def post(self, src: int, dest: int, header: bytes, arrays: list[np.ndarray]) -> None:
        frame = (header, tuple(np.array(a, copy=True) for a in arrays))
        with self._lock:
            self._queues[(src, dest)].append(frame)
        self.bell(dest).set()

    def waiting(self, src: int, dest: int) -> bool:
        with self._lock:
            return bool(self._queues.get((src, dest)))

    def receive(self, src: int, dest: int, who: str, expect: Expect) -> Message:
        with self._lock:
            header, payload = self._queues[(src, dest)].popleft()
        layout, meta = decode_header(header, src, who, expect)
        if len(payload) != len(layout) or any(str(a.dtype) != dtype or a.shape != shape
                                               for (_, dtype, shape), a in zip(layout, payload)):
            raise ProtocolError(f"{who} sent a payload of {expect.kind} (round {expect.round}) "
                                "that does not fit its header")
        arrays = {name: a for (name, _, _), a in zip(layout, payload)}
        check_payload(arrays, who, expect)
        return Message(expect.kind, expect.round, src, arrays, meta, who)

    def fail(self, why: str) -> None:
        """A party failed: every party of the process stops waiting (ChannelClosed)."""
        self.failure = why
        with self._lock:
            bells = list(self._bells.values())
        for bell in bells:
            bell.set()


class _Delivered(Pending):
    """An in-process send is complete as soon as it is queued."""

    def wait(self) -> None:
        return None

    def done(self) -> bool:
        return True


class LocalChannel(Channel):
    """A party whose peers live in the same process."""

    def __init__(self, me: int, hub: LocalHub, timeout_s: float, max_sleep_s: float) -> None:
        super().__init__(me, timeout_s, max_sleep_s)
        self.hub = hub
        self._bell = hub.bell(me)

    def _post(self, dest: int, header: bytes, arrays: list[np.ndarray]) -> Pending:
        self.hub.post(self.me, dest, header, arrays)
        return _Delivered()

    def _arrived(self, source: int) -> bool:
        return self.hub.waiting(source, self.me)

    def _receive(self, source: int, expect: Expect) -> Message:
        return self.hub.receive(source, self.me, self.describe(source), expect)

    def closed(self) -> bool:
        return self.hub.failure is not None

    def _before_poll(self) -> None:
        self._bell.clear()
        if self.hub.failure is not None:
            raise ChannelClosed(self.hub.failure)

    def _sleep(self, seconds: float) -> None:
        self._bell.wait(seconds)
