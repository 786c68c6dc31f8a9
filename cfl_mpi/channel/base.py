"""The seam between *what* a strategy exchanges and *how* it travels.

A `Channel` is one party's line to the others (Flower's and pfl-research's backend idea):
typed messages addressed by silo index, or `SERVER`. Strategies and the runtime talk only
to it; the backends decide the transport: in-process queues (`local.py`) or MPI ranks
(`backends/mpi/channel.py`), including several silos on one rank.

Waiting polls with an exponential back-off sleep, never spinning (MPICH and Open MPI spin a
core inside blocking calls, stealing it from the silos that train); a backend may cut a
sleep short when a message arrives in-process.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np

from ..wire.messages import Expect, Kind, Message, ProtocolError, encode_header
from ..wire.payload import Payload

__all__ = [
    "SERVER",
    "Alternative",
    "Channel",
    "ChannelClosed",
    "Notice",
    "Pending",
    "PeerTimeout",
    "WaitStats",
    "party_name",
]

SERVER: Final = -1  # the server's address; silos are addressed by their index 0..C-1


def party_name(address: int) -> str:
    return "the server" if address == SERVER else f"silo {address}"


class PeerTimeout(RuntimeError):
    """A peer stayed silent longer than the configured message timeout."""


class ChannelClosed(RuntimeError):
    """Another party of this process failed: waiting for its messages is pointless."""


@dataclass
class WaitStats:
    """How long this party waited, and how much CPU it burnt doing so (should be ~0)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


class Alternative(NamedTuple):
    """A message a source may send in place of the one awaited (`recv_each`): its kind, how
    it is read from a source, and what takes it."""

    kind: Kind
    expect: Callable[[int], Expect]
    take: Callable[[Message], None]


class Notice(NamedTuple):
    """A message the server may send a silo ahead of any other (`Channel.notices`, by kind): a
    silo's receive that may take a message from the server takes the notices waiting first,
    each by `take`, then goes on waiting for what it expects. A `take` may raise to end the
    wait: the server's farewell (`Dropped`) ends the silo; a partner's leaving ends a wait for
    that partner (EMD-CFL)."""

    expect: Expect
    take: Callable[[Message], None]


class Pending(ABC):
    """A message on its way; its arrays must not be modified until `wait` returns."""

    @abstractmethod
    def wait(self) -> None: ...

    @abstractmethod
    def done(self) -> bool:
        """Whether the message has left (its buffers are then released; in-process, whether the
        receiver has taken its copy); never waits."""


def wait_all(sends: Iterable[Pending]) -> None:
    """Wait for every send of a fan-out started together: posting them all before waiting on
    any lets them move at once (a blocking send per silo waits on each receiver in turn)."""
    for pending in list(sends):
        pending.wait()


class Channel(ABC):
    """Sends and receives `Message`s for the party at address `me`; counts bytes per kind."""

    def __init__(self, me: int, timeout_s: float, max_sleep_s: float) -> None:
        self.me = me
        self.timeout_s = timeout_s
        self.max_sleep_s = max_sleep_s
        self.sent_bytes: Counter[str] = Counter()
        self.waits = WaitStats()
        self.notices: dict[str, Notice] = {}  # a silo's, by kind: see Notice

    # ------------------------------------------------------------------ the protocol
    def isend(
        self, dest: int, kind: Kind | Payload, round: int, arrays: dict[str, np.ndarray] | None = None, **meta: object
    ) -> Pending:
        """Start sending a message, a declared one (wire/payload.py) or a kind with its arrays and
        meta; call `.wait()` on the result before reusing the arrays."""
        header, payload = self._encode(kind, round, arrays, meta, copies=1)
        return self._post(dest, header, payload)

    def isend_all(
        self,
        dests: Sequence[int],
        kind: Kind | Payload,
        round: int,
        arrays: dict[str, np.ndarray] | None = None,
        **meta: object,
    ) -> Pending:
        """Start sending one message to every party in `dests`, each receiving it as if it were
        sent to it alone. It travels once per receiving process (once per MPI rank), and the
        receivers of a process share its arrays, read-only: a representative's ω for its
        hundreds of partners is one copy per rank, not one per partner. Its bytes count once
        per receiving process."""
        dests = list(dests)
        if len(set(dests)) != len(dests) or self.me in dests:
            raise ValueError(f"{party_name(self.me)} cannot send to {dests}: repeated or itself")
        header, payload = self._encode(kind, round, arrays, meta, copies=self._processes(dests))
        return self._post_all(dests, header, payload)

    def _encode(
        self,
        kind: Kind | Payload,
        round: int,
        arrays: dict[str, np.ndarray] | None,
        meta: dict[str, object],
        copies: int,
    ) -> tuple[bytes, list[np.ndarray]]:
        """The header and contiguous payload of a message, its bytes counted `copies` times."""
        if isinstance(kind, Payload):
            if arrays is not None or meta:
                raise TypeError(f"a {type(kind).__name__} carries its own arrays and meta")
            message = kind
            kind, arrays, meta = message.KIND, message.arrays(), message.meta()
        # np.require keeps 0-d arrays (e.g. BatchNorm's step counter) 0-d; ascontiguousarray would not.
        arrays = {k: np.require(v, requirements="C") for k, v in (arrays or {}).items()}
        header = encode_header(kind, round, self.me, arrays, meta)
        self.sent_bytes[kind.name] += copies * (len(header) + sum(a.nbytes for a in arrays.values()))
        return header, list(arrays.values())

    def send(
        self, dest: int, kind: Kind | Payload, round: int, arrays: dict[str, np.ndarray] | None = None, **meta: object
    ) -> None:
        self.isend(dest, kind, round, arrays, **meta).wait()

    def send_header_only(
        self, dest: int, kind: Kind, round: int, arrays: dict[str, np.ndarray], **meta: object
    ) -> None:
        """Send a message's header and withhold its payload, as a broken or hostile peer would
        (`runtime.fault` kind `header_only`); honest code never calls this."""
        self._post(dest, encode_header(kind, round, self.me, arrays, meta), []).wait()

    def recv(self, source: int, expect: Expect) -> Message:
        """Receive the next message from `source`, which must match `expect`."""
        return self.recv_any([source], lambda _: expect)

    def recv_any(self, sources: Iterable[int], expect: Callable[[int], Expect]) -> Message:
        """Receive the first message to arrive from any of `sources`; `expect(source)` checks it.
        The server's notices are taken on the way (`Notice`)."""
        sources = list(sources)
        while True:
            source = self._await(sources)
            notice = self.notices.get(self._header(source).get("kind", "")) if source == SERVER else None
            if notice is None:
                return self._receive(source, expect(source))
            notice.take(self._receive(source, notice.expect))

    def recv_any_or(
        self, sources: Iterable[int], expect: Callable[[int], Expect], instead: Alternative | None
    ) -> Message | None:
        """As `recv_any`, where a source may send `instead`'s kind (if any) in place of its
        message: that one goes to `instead.take`, and None comes back."""
        source = self._await(list(sources))
        if self._took_instead(source, instead):
            return None
        return self._receive(source, expect(source))

    def _took_instead(self, source: int, instead: Alternative | None) -> bool:
        """Whether the message waiting from `source` was `instead`'s kind, and went to its take."""
        if instead is None or self._header(source).get("kind") != instead.kind.name:
            return False
        instead.take(self._receive(source, instead.expect(source)))
        return True

    def _await(self, sources: list[int]) -> int:
        """Wait until one of `sources` has a message waiting; the first such."""
        return self._await_some(sources, lambda: [] if (first := self.ready(sources)) is None else [first])[0]

    def _await_some(self, sources: Collection[int], look: Callable[[], list[int]]) -> list[int]:
        """Wait until `look` names sources with a message waiting (of `sources`); those."""
        found: list[int] = []

        def any_ready() -> bool:
            found[:] = look()
            return bool(found)

        def what() -> str:
            named = sorted(sources)
            return (
                "a message from " + ", ".join(self.describe(s) for s in named[:4]) + (" ..." if len(named) > 4 else "")
            )

        if any_ready():
            return found
        self._awaiting(sources)
        first, longest = self._arrival_sleeps()
        self.wait_until(any_ready, what, self._patience(sources), longest, first_sleep_s=first)
        return found

    def recv_each(
        self,
        sources: Iterable[int],
        expect: Callable[[int], Expect],
        instead: Alternative | None = None,
        refused: Callable[[int, ProtocolError], None] | None = None,
    ) -> Iterator[Message]:
        """Yield one message from each source, in the order they arrive. A source may send
        `instead`'s kind in place of its message: that one goes to `instead.take`, not out.
        With `refused`, a message that breaks the protocol goes to `refused(source, error)`
        instead of raising, and its source is awaited no more."""
        for _, message in self.recv_in_turn(sources, [expect], instead, refused):
            yield message

    def recv_in_turn(
        self,
        sources: Iterable[int],
        expects: Sequence[Callable[[int], Expect]],
        instead: Alternative | None = None,
        refused: Callable[[int, ProtocolError], None] | None = None,
    ) -> Iterator[tuple[int, Message]]:
        """`recv_each` for sources that each send len(expects) messages, the i-th as
        `expects[i]` reads it: yields (i, message) in the order they arrive, so one source's
        second message need not wait for every source's first. `instead` and `refused` as in
        `recv_each`; either ends what is awaited from that source."""
        pending = set(sources)
        step = dict.fromkeys(pending, 0)
        while pending:
            # every source already waiting, from one look; a look per message is quadratic in a
            # round's thousands of silos (docs/research/PERFORMANCE.md, "Messages taken as they wait")
            for source in self._await_some(pending, lambda: self.ready_among(pending)):
                pending.remove(source)
                i = step[source]
                try:
                    if self._took_instead(source, instead):
                        continue
                    message = self._receive(source, expects[i](source))
                except ProtocolError as err:
                    if refused is None:
                        raise
                    refused(source, err)
                    continue
                if i + 1 < len(expects):
                    pending.add(source)
                    step[source] = i + 1
                yield i, message

    def disown(self, source: int) -> None:
        """Take nothing from `source` any more: what waits from it and whatever it sends later
        is dropped unread (its payloads received and discarded, so that its sends complete)."""
        raise NotImplementedError(f"{type(self).__name__} cannot disown a peer")

    def next_kind(self, source: int) -> tuple[str, int]:
        """Wait for the next message from `source`; the kind and round its header declares (it
        stays waiting, to be received)."""
        header = self._header(self._await([source]))
        kind, round = header.get("kind"), header.get("round")
        return (kind, round) if isinstance(kind, str) and isinstance(round, int) else ("", -1)

    def take_as_declared(self, source: int) -> Message:
        """Receive the next message from `source` as its header declares it, whatever its kind:
        how a silo that left takes what was already on its way to it."""
        source = self._await([source])
        return self._receive(source, Expect.as_declared(self._header(source), self.describe(source)))

    @abstractmethod
    def ready(self, sources: Iterable[int]) -> int | None:
        """The first of `sources` with a message waiting for this party, or None; never waits
        (for a party that also waits on other work, e.g. computations on a pool)."""

    @abstractmethod
    def ready_among(self, sources: Collection[int]) -> list[int]:
        """Those of `sources` with a message waiting for this party, in order; never waits."""

    def _patience(self, sources: Collection[int]) -> float:
        """The message timeout, doubled for a silo waiting on the server alone. The server's
        wait restarts with each silo's message, so a silo that sent early would otherwise time
        out first when another falls silent, and blame the server; the server, which can name
        the silent silo, must speak first."""
        alone = len(sources) == 1 and SERVER in sources
        return 2 * self.timeout_s if self.me != SERVER and alone else self.timeout_s

    def _awaiting(self, sources: Collection[int]) -> None:
        """Called when this party starts waiting for a message from one of `sources`."""

    def _arrival_sleeps(self) -> tuple[float, float]:
        """(first, longest) sleep between two looks for a message: the back-off, unless the
        backend wakes a waiting party when a message arrives."""
        return 5e-5, self.max_sleep_s

    def describe(self, address: int) -> str:
        """How errors name a party ("silo 3", or with its rank where there are ranks)."""
        return party_name(address)

    def host_of(self, address: int) -> str | None:
        """The host a party runs on, where the backend knows it (the round's timings name the
        node of the slowest silo)."""
        return None

    def closed(self) -> bool:
        """Whether another party of this process failed (waiting then raises ChannelClosed)."""
        return False

    # ------------------------------------------------------------------ what a backend provides
    @abstractmethod
    def _post(self, dest: int, header: bytes, arrays: list[np.ndarray]) -> Pending:
        """Start moving one encoded message to `dest`."""

    @abstractmethod
    def _post_all(self, dests: list[int], header: bytes, arrays: list[np.ndarray]) -> Pending:
        """Start moving one encoded message to every party in `dests`, once per process."""

    @abstractmethod
    def _processes(self, dests: list[int]) -> int:
        """How many processes host `dests` (what a message to all of them costs)."""

    @abstractmethod
    def _receive(self, source: int, expect: Expect) -> Message:
        """Take the waiting message from `source`, checked against `expect`."""

    @abstractmethod
    def _header(self, source: int) -> dict[str, Any]:
        """The header of the message waiting from `source`, read but not taken ({} if it is not
        a mapping); ProtocolError if it cannot be read."""

    def _before_poll(self) -> None:
        """Called before each poll: raise ChannelClosed if the run is failing."""

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    # ------------------------------------------------------------------ waiting
    def wait_until(
        self,
        ready: Callable[[], bool],
        what: Callable[[], str],
        timeout_s: float | None = None,
        max_sleep_s: float | None = None,
        spin_s: float = 0.0,
        first_sleep_s: float = 5e-5,
    ) -> None:
        """Poll `ready` until true or the timeout (default: the message timeout) expires: for
        the first `spin_s` seconds without sleeping (only yielding to other threads), then with
        exponential back-off from `first_sleep_s` capped at `max_sleep_s` (default: the
        channel's), and never past the timeout."""
        if ready():
            return
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        max_sleep_s = self.max_sleep_s if max_sleep_s is None else max_sleep_s
        start, cpu0 = time.monotonic(), time.thread_time()
        sleep = min(first_sleep_s, max_sleep_s)
        try:
            while True:
                self._before_poll()
                if ready():
                    return
                waited = time.monotonic() - start
                if waited > timeout_s:
                    raise PeerTimeout(f"{self.describe(self.me)}: waited {timeout_s:.0f} s for {what()}")
                if waited < spin_s:
                    time.sleep(0)
                    continue
                self._sleep(min(sleep, timeout_s - waited + 1e-3))
                sleep = min(sleep * 2, max_sleep_s)
        finally:
            self.waits.wall_s += time.monotonic() - start
            # this thread's CPU only: other parties of the process may be training meanwhile
            self.waits.cpu_s += time.thread_time() - cpu0
