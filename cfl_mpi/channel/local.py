"""In-process backend: parties in one process (threads), a FIFO per (sender, receiver) pair.

The simulator runs every party this way, and a backend of several processes uses the same
hub for the parties that share one: its receiving thread files what arrives from the others
as frames of its own (the MPI backend's: backends/mpi/frames.py). A message is encoded and checked
exactly as between processes (header against the receiver's `Expect`, finite payload), and
its arrays are copied when sent, so a party can reuse its buffers at once and never shares
memory with another.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from ..wire.messages import Expect, Message, ProtocolError, check_payload, decode_header, read_header
from .base import Channel, ChannelClosed, Pending

__all__ = ["Fetch", "Frame", "LocalChannel", "LocalFrame", "LocalHub", "SharedFrame"]


def expected(expect: Expect) -> str:
    """What a receiver expects, as its errors say it."""
    return f"{expect.kind} (round {expect.round})"


class Fetch(Protocol):
    """What a receiving channel offers for a message whose arrays its transport still holds
    (another process's: the MPI backend's frames, backends/mpi/frames.py)."""

    def payload(self, layout: list) -> dict[str, np.ndarray]:
        """The arrays that follow a header, as its `layout` declares them."""

    def shared(self, frame: SharedFrame, layout: list) -> tuple[np.ndarray, ...]:
        """The arrays of a message to several parties of this process."""


class Frame:
    """What a pair's queue holds: a message, or the part of one that its transport filed.
    The hub asks a frame for its header and its contents, and knows nothing of how it
    travelled; a frame that is not a message's start (a payload) refuses both."""

    def header_json(self, who: str) -> object:
        """The header, read (a look ahead at the next message: `Channel.peek`)."""
        raise ProtocolError(f"{who} sent a payload or an oversized header where a header belongs")

    def contents(self, src: int, who: str, expect: Expect, fetch: Fetch | None) -> tuple[dict[str, np.ndarray], dict]:
        """(the arrays by name, the header's fields), the header checked against `expect` and
        the arrays against the header (their values are `check`'s)."""
        raise ProtocolError(f"{who} sent a payload where a header of {expected(expect)} belongs")

    def check(self, arrays: dict[str, np.ndarray], meta: dict, who: str, expect: Expect) -> None:
        """The arrays' values (finite, and the checks of the class `expect` reads them as)."""
        check_payload(arrays, meta, who, expect)


@dataclass(frozen=True)
class LocalFrame(Frame):
    """A message posted in this process: its header and a copy of its arrays."""

    header: bytes
    arrays: tuple[np.ndarray, ...]

    def header_json(self, who: str) -> object:
        return read_header(self.header)

    def contents(self, src: int, who: str, expect: Expect, fetch: Fetch | None) -> tuple[dict[str, np.ndarray], dict]:
        layout, meta = decode_header(self.header, src, who, expect)
        return _fitted(self.arrays, layout, who, expected(expect)), meta


# A party whose bell rings on every arrival looks this often anyway (its timeout ends its
# sleep on time): a shorter interval wakes every idle silo thread of a rank for nothing, which
# adds up with thousands of them (docs/research/PERFORMANCE.md, "Bells and wake-ups").
ARRIVAL_CHECK_S = 30.0  # see LocalChannel._arrival_sleeps


class SharedFrame(Frame):
    """One message for several receivers of this process (`Channel.isend_all`), the same
    object in each receiver's queue. Its arrays exist once, read-only: copied when posted
    in-process; from another process, fetched by the first receiver to take it (until then
    they stay with the sender) from the `payloads` its transport files (`Fetch.shared`).
    Its header is read and its arrays checked once too (their values finite, and the checks of
    the class a receiver reads it as: payload.py): a representative's ω goes to
    every silo of the rank, and reading its JSON and checking its values per receiver would
    repeat the same work for each of them (docs/research/PERFORMANCE.md, "Shared messages read once")."""

    def __init__(self, header: bytes, payloads: int, arrays: tuple[np.ndarray, ...] | None = None) -> None:
        self.header = header
        self.expected_payloads = payloads
        self.payloads: list[object] = []  # the transport's handles, in order
        self.complete = threading.Event()  # every payload handle is filed
        self.fetcher: threading.Event | None = None  # the bell of the receiver waiting for them
        if arrays is not None or not payloads:
            self.complete.set()
        self._arrays = arrays
        self._json: object = None  # the header read, once a receiver has
        self._checked: set[object] = set()  # the checks the message passed (payload.py's, by class)
        self._errors: dict[object, ProtocolError] = {}  # ... and those it failed
        self._fetch_error: ProtocolError | None = None  # why its payload could not be fetched
        self._lock = threading.Lock()

    def completed(self) -> None:
        """Every payload handle is filed: the receiver fetching them (if one waits) is rung,
        and only it: the others wait on the frame, not on their bells."""
        self.complete.set()
        if self.fetcher is not None:
            self.fetcher.set()

    # The later receivers read what the first one left without taking the lock (an attribute
    # read is atomic under the GIL, and each is set once): hundreds of a rank's silo threads
    # read one frame at once, and would queue on its lock, each handing the lock and the GIL on
    # in turn (docs/research/PERFORMANCE.md, "Silo-thread locks").
    def cached_json(self, data: bytes) -> object:
        """`read_header(self.header)`, read by the first receiver (the receivers still check
        it against what each expects)."""
        if self._json is None:
            with self._lock:
                if self._json is None:
                    self._json = read_header(data)
        return self._json

    def header_json(self, who: str) -> object:
        return self.cached_json(self.header)

    def contents(self, src: int, who: str, expect: Expect, fetch: Fetch | None) -> tuple[dict[str, np.ndarray], dict]:
        layout, meta = decode_header(self.header, src, who, expect, self.cached_json)
        fetch_shared = None if fetch is None else partial(fetch.shared, layout=layout)
        return _fitted(self.arrays(fetch_shared, who, expected(expect)), layout, who, expected(expect)), meta

    def check(self, arrays: dict[str, np.ndarray], meta: dict, who: str, expect: Expect) -> None:
        self.check_once(expect.check, lambda: check_payload(arrays, meta, who, expect))

    def check_once(self, key: object, check: Callable[[], None]) -> None:
        """`check()` (the finite check of the arrays, and the checks of the class a receiver
        reads the message as: `key`) for the first receiver with that key; its error for every
        later one."""
        if key in self._checked:
            return
        with self._lock:
            if key in self._errors:
                raise self._errors[key]
            if key not in self._checked:
                try:
                    check()
                except ProtocolError as err:
                    self._errors[key] = err
                    raise
                self._checked.add(key)

    def arrays(
        self, fetch: Callable[[SharedFrame], tuple[np.ndarray, ...]] | None, who: str, what: str
    ) -> tuple[np.ndarray, ...]:
        """The message's arrays, fetched once by `fetch` (the receivers after the first wait for
        it, or get its error; a value check that fails later is `check_once`'s to raise)."""
        if self._arrays is not None:
            return self._arrays
        with self._lock:
            if self._fetch_error is not None:
                raise self._fetch_error
            if self._arrays is None:
                if fetch is None:
                    raise ProtocolError(f"{who} sent {what} whose payload cannot be fetched here")
                try:
                    self._arrays = tuple(read_only(a) for a in fetch(self))
                except ProtocolError as err:
                    self._fetch_error = err
                    raise
            return self._arrays


def read_only(a: np.ndarray) -> np.ndarray:
    """`a`, no longer writeable: arrays that several receivers share."""
    a.flags.writeable = False
    return a


class LocalHub:
    """The post office of one process: queues, a bell per receiver, and the run's failure.

    Queues change under one lock; the looks that only read (`bell`, `first_waiting`,
    `waiting`, `taken`) take none: under the GIL a dict or set look-up is atomic, a stale
    answer is a look again after the next bell, and only the receiver takes from its queues.
    With many silos the clustering round wakes every silo thread of a rank at once, and a lock
    taken to look would queue hundreds of them, each handing the lock and the GIL on in turn
    (docs/research/PERFORMANCE.md, "Silo-thread locks")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[int, int], deque[Frame]] = defaultdict(deque)
        self._posted: Counter[tuple[int, int]] = Counter()  # frames queued, per (src, dest)
        self._taken: Counter[tuple[int, int]] = Counter()  # frames taken by the receiver
        self._senders: dict[int, set[int]] = defaultdict(set)  # per receiver: whose queues hold frames
        self._bells: dict[int, threading.Event] = {}
        self._disowned: dict[tuple[int, int], Callable[[Frame], None]] = {}  # (src, dest): what drops their frames
        self.failure: str | None = None

    def bell(self, address: int) -> threading.Event:
        """Rung when a message for `address` arrives (or the run fails): its waits end early."""
        bell = self._bells.get(address)
        if bell is None:
            with self._lock:
                bell = self._bells.setdefault(address, threading.Event())
        return bell

    def post(self, src: int, dest: int, header: bytes, arrays: list[np.ndarray]) -> int:
        """Queue a copy of a message for `dest`; its number among those from `src` to `dest`."""
        return self.deliver(src, dest, LocalFrame(header, tuple(np.array(a, copy=True) for a in arrays)))

    def deliver(self, src: int, dest: int, frame: Frame) -> int:
        """Queue a frame for `dest` and ring its bell (or drop it, from a sender `dest`
        disowned); the frame's number (see `taken`)."""
        return self.deliver_all(src, [dest], frame)[0]

    def deliver_all(self, src: int, dests: list[int], frame: Frame) -> list[int]:
        """`deliver` to each of `dests` under one taking of the lock: a message to every silo
        of a rank wakes them all, and they take the lock to take it; an inbox that took it once
        per receiver would queue behind them each time, for seconds at 1,200 silos a rank
        (docs/research/PERFORMANCE.md, "One delivery to many")."""
        numbers, rung, discards = [], [], []
        with self._lock:
            for dest in dests:
                numbers.append(self._posted[(src, dest)])
                self._posted[(src, dest)] += 1
                discard = self._disowned.get((src, dest))
                if discard is None:
                    self._queues[(src, dest)].append(frame)
                    self._senders[dest].add(src)
                    rung.append(dest)
                else:
                    self._taken[(src, dest)] += 1
                    discards.append(discard)
        for discard in discards:
            discard(frame)
        for dest in rung:
            self.bell(dest).set()
        return numbers

    def disown(self, src: int, dest: int, discard: Callable[[Frame], None]) -> None:
        """`dest` takes nothing from `src` any more: each frame waiting from it, and each that
        comes later, goes to `discard` instead (a silo the server dropped for breaking the
        protocol: its messages are never read, and never in the way)."""
        with self._lock:
            self._disowned[(src, dest)] = discard
            frames = list(self._queues.pop((src, dest), ()))
            self._senders[dest].discard(src)
            self._taken[(src, dest)] += len(frames)
        for frame in frames:
            discard(frame)

    def first_waiting(self, dest: int, sources: Iterable[int]) -> int | None:
        """The first of `sources` whose frames wait for `dest`."""
        senders = self._senders.get(dest)
        if not senders:
            return None
        return next((s for s in sources if s in senders), None)

    def waiting_among(self, dest: int, sources: Collection[int]) -> list[int]:
        """Those of `sources` whose frames wait for `dest`, in order: one set intersection
        (atomic under the GIL, over the smaller of the two)."""
        senders = self._senders.get(dest)
        if not senders:
            return []
        return sorted(senders.intersection(sources))

    def waiting(self, src: int, dest: int) -> bool:
        return bool(self._queues.get((src, dest)))

    def take(self, src: int, dest: int) -> Frame:
        """The next frame from `src` to `dest`. The sender's bell stays silent: no send waits
        to be taken (`_Queued.wait` returns at once), and a representative whose key and ω
        every silo of a rank takes would be woken twice a silo while it waits for their keys."""
        with self._lock:
            queue = self._queues[(src, dest)]
            frame = queue.popleft()
            if not queue:
                self._senders[dest].discard(src)
            self._taken[(src, dest)] += 1
        return frame

    def header(self, src: int, dest: int, who: str) -> dict[str, Any]:
        """The header of the next frame from `src` to `dest`, read and left in the queue ({} if
        it is not a mapping); ProtocolError if there is none to read."""
        with self._lock:
            frame = self._queues[(src, dest)][0]
        try:
            header = frame.header_json(who)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ProtocolError(f"{who} sent a header that is not JSON") from None
        return header if isinstance(header, dict) else {}

    def taken(self, src: int, dest: int, number: int) -> bool:
        """Whether `dest` has taken the frame `number` from `src`."""
        return self._taken[(src, dest)] > number

    def receive(self, src: int, dest: int, who: str, expect: Expect, fetch: Fetch | None = None) -> Message:
        """The next message from `src` to `dest`, checked against `expect`; `fetch` gets the
        arrays its transport still holds."""
        frame = self.take(src, dest)
        arrays, meta = frame.contents(src, who, expect, fetch)
        frame.check(arrays, meta, who, expect)
        return Message(expect.kind, expect.round, src, arrays, meta, who)

    def fail(self, why: str) -> None:
        """A party failed: every party of the process stops waiting (ChannelClosed)."""
        self.failure = why
        with self._lock:
            bells = list(self._bells.values())
        for bell in bells:
            bell.set()


def _fitted(payload: tuple[np.ndarray, ...], layout: list, who: str, what: str) -> dict[str, np.ndarray]:
    """The arrays by name, if they are what the header declared."""
    # dtype against its name (`decode_header` allowed it): str(dtype) runs numpy's Python code,
    # far slower than the comparison, once per array and receiver of a shared ω
    if len(payload) != len(layout) or any(
        a.dtype != dtype or a.shape != shape for (_, dtype, shape), a in zip(layout, payload)
    ):
        raise ProtocolError(f"{who} sent a payload of {what} that does not fit its header")
    return {name: a for (name, _, _), a in zip(layout, payload)}


@dataclass(frozen=True)
class _Queued(Pending):
    """An in-process send: its arrays were copied into the queue, so `wait` returns at once;
    `done` once every receiver has taken it (the copies live until then)."""

    hub: LocalHub
    src: int
    numbers: tuple[tuple[int, int], ...]  # (receiver, the frame's number from src to it)

    def wait(self) -> None:
        return None

    def done(self) -> bool:
        return all(self.hub.taken(self.src, dest, number) for dest, number in self.numbers)


class LocalChannel(Channel):
    """A party whose peers live in the same process."""

    def __init__(self, me: int, hub: LocalHub, timeout_s: float, max_sleep_s: float) -> None:
        super().__init__(me, timeout_s, max_sleep_s)
        self.hub = hub
        self._bell = hub.bell(me)

    def _post(self, dest: int, header: bytes, arrays: list[np.ndarray]) -> Pending:
        return _Queued(self.hub, self.me, ((dest, self.hub.post(self.me, dest, header, arrays)),))

    def _post_all(self, dests: list[int], header: bytes, arrays: list[np.ndarray]) -> Pending:
        frame = SharedFrame(header, len(arrays), tuple(read_only(np.array(a, copy=True)) for a in arrays))
        return _Queued(self.hub, self.me, tuple(zip(dests, self.hub.deliver_all(self.me, dests, frame))))

    def _processes(self, dests: list[int]) -> int:
        return 1 if dests else 0

    def ready(self, sources: Iterable[int]) -> int | None:
        return self.hub.first_waiting(self.me, sources)

    def ready_among(self, sources: Collection[int]) -> list[int]:
        return self.hub.waiting_among(self.me, sources)

    def _receive(self, source: int, expect: Expect) -> Message:
        return self.hub.receive(source, self.me, self.describe(source), expect)

    def _header(self, source: int) -> dict[str, Any]:
        return self.hub.header(source, self.me, self.describe(source))

    def disown(self, source: int) -> None:
        self.hub.disown(source, self.me, lambda frame: None)  # in-process frames hold nothing else

    def closed(self) -> bool:
        return self.hub.failure is not None

    def _arrival_sleeps(self) -> tuple[float, float]:
        """Every arrival (and the run's failure; over MPI, the completion of the party's send
        too: `_MpiPending.wait`) rings the party's bell, so a waiting party sleeps until then,
        from its first look: polling at the back-off cap costs a rank CPU in
        proportion to its waiting silos, and a back-off from 50 µs wakes each silo waiting for
        the server's message many times, while the inbox that delivers it queues behind them for
        the GIL (benchmarks/wire.py; docs/research/PERFORMANCE.md, "Bells and wake-ups")."""
        longest = max(self.max_sleep_s, ARRIVAL_CHECK_S)
        return longest, longest

    def _before_poll(self) -> None:
        self._bell.clear()
        if self.hub.failure is not None:
            raise ChannelClosed(self.hub.failure)

    def _sleep(self, seconds: float) -> None:
        self._bell.wait(seconds)
