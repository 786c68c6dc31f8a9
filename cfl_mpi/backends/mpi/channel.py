"""MPI channels: each party lives on a rank (`RankLayout`); raw buffers behind a typed header.

Parties on the same rank (several silos per rank) reach each other through the process's
`LocalHub`; every other message is an MPI header (the JSON of `wire.messages`) followed by
one raw buffer per array, never a pickle. Each ordered pair of parties has its own header
tag and payload tag, derived from their slots on their ranks.

One thread per rank, the `MpiInbox`, matches whatever arrives for the rank (MPI's matched
probe): it receives each header and files it, and the handle of each payload, in the hub's
queue of its (sender, receiver) pair, and rings the receiver's bell. So a rank's waiting
parties sleep on their bells instead of each polling MPI, which would cost a rank CPU in
proportion to its waiting silos (docs/research/PERFORMANCE.md, "Inbox"); the inbox alone polls, with
the same back-off. MPI's non-overtaking rule keeps every payload right behind its
header in the pair's queue. A message to several parties of a rank (`isend_all`) travels
once, on its sender's multicast tags: an envelope (the receivers, the payload count, the
header), then its payloads; the inbox files one `SharedFrame` in each receiver's queue. MPI
calls of the threads of one rank go through one lock (MPI_THREAD_SERIALIZED suffices), and
none of them blocks.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import cast

import numpy as np
from mpi4py import MPI

from ...channel.base import SERVER, PeerTimeout, Pending
from ...channel.layout import RankLayout
from ...channel.local import Frame, LocalChannel, LocalHub, SharedFrame
from ...wire.messages import MAX_HEADER_BYTES, Expect, Message, ProtocolError
from .frames import (
    ENVELOPE_FIXED,
    INLINE_MAX_BYTES,
    INLINE_MAX_MESSAGE,
    InlineFrame,
    OversizedHeader,
    RemoteHeader,
    RemotePayload,
    carried,
    envelope,
    inline_buffer,
)
from .liveness import Liveness

__all__ = ["MpiChannel", "MpiInbox"]

# Polling MPI for a payload being received (until then the receiver sleeps on its bell, which
# the inbox rings when it files the payload). An honest peer posts the payload right behind
# its header, so the wait is as long as the copy; the doubling back-off alone would overshoot
# it by up to the time already waited (benchmarks/wire.py times the transfers). So the
# receiver polls without sleeping for as long as a large copy takes, then at most 1 ms apart:
# a peer that withholds its payload costs it 10 ms of CPU, not payload_timeout_s.
PAYLOAD_SPIN_S = 10e-3
PAYLOAD_MAX_SLEEP_S = 1e-3
# A party waiting for the inbox to file a payload (it rings the party then) looks this often
# whether the payload is late (`MpiChannel._await_payload`).
PAYLOAD_LATE_CHECK_S = 0.25
# A large send moves only while its rank calls MPI (MPICH copies it through shared memory in
# chunks, each on a progress call): while any send of the rank is in flight the inbox polls
# at most this far apart. With only its back-off, a rank whose parties all wait for replies
# polls every runtime.max_poll_sleep_ms, and its large sends (a server's models to hundreds of
# silos) crawl (docs/research/PERFORMANCE.md, "Sends in flight").
SENDING_MAX_SLEEP_S = 1e-3
# The inbox tests this many of its rank's sends a poll, in turn (those still in flight go to
# the back): a server slower than its silos leaves thousands of them in flight, and one
# Testsome over all of them (and a list rebuilt) on every poll would make a poll's cost grow
# with them (docs/research/PERFORMANCE.md, "Sends tested per poll"). MPI progresses every request on any
# call; the inbox rings a send's owner when it sees it complete ("Sends waited on the bell").
SENDS_TESTED = 64
MAX_ENVELOPE_PAYLOADS = 4096  # arrays in one message: far above any model's state dict
# How often a busy inbox (messages arriving back to back) still beats and checks its peers.
LIVENESS_EVERY_S = 0.1
# A disowned peer's payloads are received and dropped so that its sends complete; one larger
# than this (no model's state dict is) stays unreceived, and only that peer's send waits.
DISCARD_MAX_BYTES = 1 << 30


class MpiInbox:
    """The rank's receiving end: one thread matches every message MPI holds for the rank's
    parties and files it in the hub (headers as bytes, payloads as `RemotePayload`). Use it as
    a context manager: the thread must stop before MPI is finalized. With `liveness` it also
    beats to the ranks it watches, and calls `on_lost` with why one of them is lost (which is
    to end the job: the hub fails too, should it return)."""

    def __init__(
        self,
        comm: MPI.Comm,
        layout: RankLayout,
        hub: LocalHub,
        mpi_lock: threading.Lock,
        max_sleep_s: float,
        liveness: Liveness | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.comm, self.layout, self.hub, self.mpi_lock = comm, layout, hub, mpi_lock
        self.max_sleep_s = max_sleep_s
        self.liveness, self.on_lost = liveness, on_lost
        self._next_beat = 0.0
        self.rank = comm.Get_rank()
        if layout.world_size != comm.Get_size():
            raise ValueError(f"the layout has {layout.world_size} ranks, the communicator {comm.Get_size()}")
        highest = self.multicast_tag(layout.slots - 1) + 1
        limit = comm.Get_attr(MPI.TAG_UB)
        if limit is None or highest > limit:
            raise ValueError(
                f"{layout.slots} parties per rank need MPI tags up to {highest}, over this MPI's "
                f"limit {limit} (use fewer silos per rank)"
            )
        self._stop = threading.Event()
        self._nudged = threading.Event()
        self.idle_at = 0.0  # when a poll last found nothing more in MPI for the rank (monotonic)
        # the rank's sends in flight and their owners' bells, in the order they are tested (under mpi_lock)
        self._sends: deque[tuple[MPI.Request, threading.Event | None]] = deque()
        # by sender: frames whose payloads are to come
        self._filling: dict[int, deque[SharedFrame]] = defaultdict(deque)
        self._thread = threading.Thread(target=self._run, name=f"mpi-inbox-{self.rank}", daemon=True)
        self._thread.start()

    def __enter__(self) -> MpiInbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._nudged.set()
        self._thread.join()
        if self.liveness is not None:
            with self.mpi_lock:
                self.liveness.goodbye()

    def nudge(self) -> None:
        """A party starts waiting for a message from another rank: the inbox polls at its
        shortest again, as that party's own back-off would (after an idle spell it may be
        sleeping runtime.max_poll_sleep_ms, which a reply that comes at once would wait out)."""
        self._nudged.set()

    def tag_of(self, src: int, dest: int) -> int:
        """The header tag of messages from `src` to `dest`; their payloads travel on tag + 1."""
        return 2 * (self.layout.slot_of(src) * self.layout.slots + self.layout.slot_of(dest))

    def multicast_tag(self, src_slot: int) -> int:
        """The envelope tag of messages from the party in slot `src_slot` to several parties of
        a rank (after every pair's tags); their payloads travel on tag + 1."""
        return 2 * (self.layout.slots * self.layout.slots + src_slot)

    def track(self, requests: list[MPI.Request], bell: threading.Event | None = None) -> None:
        """Requests just posted (`mpi_lock` held): the inbox keeps MPI progressing them, and
        rings `bell` (their owner's) when it sees one complete."""
        self._sends.extend((request, bell) for request in requests)
        self._nudged.set()

    def _sending(self) -> bool:
        """Whether a send of the rank is still in flight (testing them progresses them). One
        Testsome for the next `SENDS_TESTED` in turn, not a Testall per message: a poll's cost
        stays the same however many sends are in flight. The owners of those it sees complete
        are rung: they sleep on their bell until then."""
        with self.mpi_lock:
            sends = self._sends
            tested = [sends.popleft() for _ in range(min(SENDS_TESTED, len(sends)))]
            if tested:
                MPI.Request.Testsome([request for request, _ in tested])  # completed ones are null
                sends.extend(entry for entry in tested if entry[0])  # the rest wait for their turn
            in_flight = bool(sends)
        for request, bell in tested:
            if not request and bell is not None:
                bell.set()
        return in_flight

    def _run(self) -> None:
        sleep, tested = 5e-5, 0.0
        try:
            while not self._stop.is_set():
                self._beat()
                if self._take_one():
                    sleep = 5e-5
                    if self._sends and time.monotonic() - tested > SENDING_MAX_SLEEP_S:
                        self._sending()  # messages arriving back to back: the rank's sends still move
                        tested = time.monotonic()
                    continue
                self.idle_at = time.monotonic()
                sending, tested = self._sending(), time.monotonic()
                longest = SENDING_MAX_SLEEP_S if sending else self.max_sleep_s
                if self._nudged.wait(min(sleep, longest)):
                    self._nudged.clear()
                    sleep = 5e-5
                else:
                    sleep = min(sleep * 2, longest)
        except Exception as err:  # noqa: BLE001 - a broken inbox must stop every party of the rank
            self.hub.fail(f"the MPI inbox of rank {self.rank} failed: {type(err).__name__}: {err}")

    def _beat(self) -> None:
        """Heartbeats (liveness.py), at most every LIVENESS_EVERY_S."""
        now = time.monotonic()
        if self.liveness is None or now < self._next_beat:
            return
        self._next_beat = now + LIVENESS_EVERY_S
        with self.mpi_lock:
            lost = self.liveness.poll(now)
        if lost is not None:
            if self.on_lost is not None:
                self.on_lost(lost)
            self.hub.fail(lost)
            self._stop.set()

    def _take_one(self) -> bool:
        """File the next message MPI holds for this rank, if any."""
        status = MPI.Status()
        with self.mpi_lock:
            handle = self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if handle is None:
                return False
            size, rank, tag = status.Get_count(MPI.BYTE), status.Get_source(), status.Get_tag()
            if self.liveness is not None:
                self.liveness.heard_from(rank, time.monotonic())
            delivery: tuple[int, list[int], Frame] | None
            if tag >= self.multicast_tag(0):
                delivery = self._file_multicast(handle, size, rank, tag)
            else:
                src, dest = self._parties(rank, tag)
                delivery = (src, [dest], self._frame(handle, size, tag))
        if delivery is not None:
            self.hub.deliver_all(*delivery)
        return True

    @staticmethod
    def _frame(handle: MPI.Message, size: int, tag: int) -> Frame:
        """What a pair's queue holds for a matched message (`mpi_lock` held): a payload's handle,
        a header's bytes, a small message whole (`InlineFrame`), or an `OversizedHeader` (the
        job fails on it; one over an inline message's limit is never read)."""
        if tag % 2:
            return RemotePayload(handle, size)
        if size > INLINE_MAX_MESSAGE:
            return OversizedHeader(size)
        raw = bytearray(size)
        handle.Recv([raw, MPI.BYTE])
        if InlineFrame.marks(raw):
            return InlineFrame(raw)
        return OversizedHeader(size) if size > MAX_HEADER_BYTES else RemoteHeader(bytes(raw))

    def _file_multicast(
        self, handle: MPI.Message, size: int, rank: int, tag: int
    ) -> tuple[int, list[int], SharedFrame] | None:
        """A payload: filed with the sender's oldest `SharedFrame` still missing some (the
        receiver fetching it is rung, if that completes it). An envelope: (sender, its
        receivers, the frame) to deliver (`mpi_lock` held). A malformed one fails the rank's
        inbox, naming the sender: its receivers cannot be known."""
        src_slot = (tag - self.multicast_tag(0)) // 2
        senders = [SERVER] if rank == 0 else self.layout.silos_on(rank)
        if src_slot >= len(senders):
            raise ProtocolError(f"rank {rank} sent a message with tag {tag}, which names none of its parties")
        src, who = senders[src_slot], self.layout.describe(senders[src_slot])
        if tag % 2:
            filling = self._filling[src]
            if not filling:
                raise ProtocolError(f"{who} sent a payload to several parties of rank {self.rank} without an envelope")
            frame = filling[0]
            frame.payloads.append(RemotePayload(handle, size))
            if len(frame.payloads) == frame.expected_payloads:
                filling.popleft()
                frame.completed()
            return None
        receivers = [SERVER] if self.rank == 0 else self.layout.silos_on(self.rank)
        if not ENVELOPE_FIXED <= size <= ENVELOPE_FIXED + 4 * len(receivers) + MAX_HEADER_BYTES:
            raise ProtocolError(f"{who} sent an envelope of {size} bytes to rank {self.rank}")
        raw = bytearray(size)
        handle.Recv([raw, MPI.BYTE])
        count, payloads = (int(x) for x in np.frombuffer(raw, dtype="<u4", count=2))
        fits = 1 <= count <= len(receivers) and size >= ENVELOPE_FIXED + 4 * count
        slots = (
            np.frombuffer(raw, dtype="<u4", count=count, offset=ENVELOPE_FIXED) if fits else np.zeros(0, dtype="<u4")
        )
        if not (
            fits
            and payloads <= MAX_ENVELOPE_PAYLOADS
            and len(np.unique(slots)) == count
            and slots.max() < len(receivers)
        ):
            raise ProtocolError(
                f"{who} sent an envelope of {size} bytes to rank {self.rank} for {count} receivers "
                f"{slots[:8].tolist()} with {payloads} payloads; expected 1 to {len(receivers)} "
                f"distinct slots below {len(receivers)} and at most {MAX_ENVELOPE_PAYLOADS} payloads"
            )
        frame = SharedFrame(bytes(raw[ENVELOPE_FIXED + 4 * count :]), payloads)
        named = [receivers[int(slot)] for slot in slots]
        if payloads:
            self._filling[src].append(frame)
        return src, named, frame

    def _parties(self, rank: int, tag: int) -> tuple[int, int]:
        """(sender, receiver) of a message from `rank` with `tag`; an error if none is."""
        pair = tag // 2
        src_slot, dest_slot = divmod(pair, self.layout.slots)
        senders = [SERVER] if rank == 0 else self.layout.silos_on(rank)
        receivers = [SERVER] if self.rank == 0 else self.layout.silos_on(self.rank)
        if not (src_slot < len(senders) and dest_slot < len(receivers)):
            raise ProtocolError(
                f"rank {rank} sent a message with tag {tag}, which names no pair of its parties and rank {self.rank}'s"
            )
        return senders[src_slot], receivers[dest_slot]


class _AllSent(Pending):
    """The parts of one message to several processes."""

    def __init__(self, parts: list[Pending]) -> None:
        self.parts = parts

    def wait(self) -> None:
        for part in self.parts:
            part.wait()

    def done(self) -> bool:
        return all(part.done() for part in self.parts)


class _MpiPending(Pending):
    """Requests of a message in flight; its buffers stay referenced until they complete."""

    def __init__(self, channel: MpiChannel, requests: list[MPI.Request], buffers: list[np.ndarray]) -> None:
        self.channel, self.requests, self.buffers = channel, requests, buffers

    def wait(self) -> None:
        """On the owner's bell, which the inbox rings when it sees a request complete: a rank's
        silos waiting for the server to take their updates would otherwise wake at the back-off
        cap, hundreds of times a second together, and take the GIL and the MPI lock from the
        compute workers and the inbox (docs/research/PERFORMANCE.md, "Sends waited on the bell")."""
        first, longest = self.channel._arrival_sleeps()
        self.channel.wait_until(self.done, lambda: "a send to complete", None, longest, first_sleep_s=first)

    def done(self) -> bool:
        """Without the rank's MPI lock where the inbox has seen every request complete (mpi4py
        nulls a request in place once a test has seen it complete): the silo threads of a rank
        look at their sends at once, and would queue hundreds deep on that lock
        (docs/research/PERFORMANCE.md, "Silo-thread locks")."""
        if any(self.requests):
            with self.channel.mpi_lock:
                complete = MPI.Request.Testall(self.requests)
        else:
            complete = True
        if complete:
            self.buffers.clear()
        return complete


@dataclass(frozen=True)
class RankFetch:
    """The arrays of a message from `source` that MPI still holds, fetched by its receiver."""

    channel: MpiChannel
    source: int
    expect: Expect

    def payload(self, layout: list) -> dict[str, np.ndarray]:
        return self.channel.payload(self.source, self.expect, layout)

    def shared(self, frame: SharedFrame, layout: list) -> tuple[np.ndarray, ...]:
        return self.channel.shared_payload(self.source, self.expect, frame, layout)


class MpiChannel(LocalChannel):
    """A party on an MPI rank: co-located parties through the hub, the others through MPI;
    what arrives from either waits in the hub, filed by the rank's `MpiInbox`."""

    def __init__(
        self, me: int, inbox: MpiInbox, timeout_s: float, max_sleep_s: float, payload_timeout_s: float
    ) -> None:
        super().__init__(me, inbox.hub, timeout_s, max_sleep_s)
        self.inbox, self.comm, self.layout, self.mpi_lock = inbox, inbox.comm, inbox.layout, inbox.mpi_lock
        self.payload_timeout_s = payload_timeout_s
        self.rank = inbox.rank
        self._discarding: list[tuple[MPI.Request, np.ndarray]] = []  # a disowned peer's payloads in flight
        if self.layout.rank_of(me) != self.rank:
            raise ValueError(f"{self.layout.describe(me)} cannot live on rank {self.rank}")

    def describe(self, address: int) -> str:
        return self.layout.describe(address)

    def host_of(self, address: int) -> str | None:
        liveness = self.inbox.liveness
        return None if liveness is None else liveness.hosts[self.layout.rank_of(address)]

    def _remote(self, peer: int) -> bool:
        return self.layout.rank_of(peer) != self.rank

    def disown(self, source: int) -> None:
        self.hub.disown(source, self.me, self._discard)

    def _discard(self, frame: Frame) -> None:
        """Drop a disowned peer's frame: a payload still in MPI is received into a scratch
        buffer first (up to DISCARD_MAX_BYTES), which lives until the receive completes."""
        if not isinstance(frame, RemotePayload) or frame.size > DISCARD_MAX_BYTES:
            return
        scratch = np.empty(frame.size, dtype=np.uint8)
        with self.mpi_lock:
            request = frame.handle.Irecv([scratch, MPI.BYTE])
            self.inbox.track([request])  # the inbox's tests complete it (and null it in place)
            self._discarding = [(r, b) for r, b in self._discarding if r] + [(request, scratch)]

    def tag_of(self, src: int, dest: int) -> int:
        return self.inbox.tag_of(src, dest)

    def _post(self, dest: int, header: bytes, arrays: list[np.ndarray]) -> Pending:
        """A header, then a message per array; a small message in one (`InlineFrame`). A header
        without arrays stays alone, as `send_header_only`'s withheld payload must."""
        if not self._remote(dest):
            return super()._post(dest, header, arrays)
        rank, tag, sent = self.layout.rank_of(dest), self.tag_of(self.me, dest), carried(arrays)
        if 0 < sum(a.nbytes for a in sent) <= INLINE_MAX_BYTES:
            return self._isend(rank, tag, inline_buffer(header, sent), [])
        return self._isend(rank, tag, np.frombuffer(header, np.uint8), arrays)

    def _isend(self, rank: int, tag: int, first: np.ndarray, arrays: list[np.ndarray]) -> Pending:
        """Post `first` (a header or an envelope) on `tag` and each carried array's bytes on
        tag + 1."""
        buffers = [first, *(a.reshape(-1).view(np.uint8) for a in carried(arrays))]
        with self.mpi_lock:
            requests = [self.comm.Isend([buffers[0], MPI.BYTE], dest=rank, tag=tag)]
            requests += [self.comm.Isend([b, MPI.BYTE], dest=rank, tag=tag + 1) for b in buffers[1:]]
            self.inbox.track(requests, self._bell)
        return _MpiPending(self, requests, buffers)

    def _post_all(self, dests: list[int], header: bytes, arrays: list[np.ndarray]) -> Pending:
        here = [d for d in dests if not self._remote(d)]
        parts = [super()._post_all(here, header, arrays)] if here else []
        by_rank: dict[int, list[int]] = defaultdict(list)
        for d in dests:
            if self._remote(d):
                by_rank[self.layout.rank_of(d)].append(self.layout.slot_of(d))
        tag = self.inbox.multicast_tag(self.layout.slot_of(self.me))
        parts += [
            self._isend(rank, tag, envelope(slots, len(carried(arrays)), header), arrays)
            for rank, slots in by_rank.items()
        ]
        return _AllSent(parts)

    def _processes(self, dests: list[int]) -> int:
        return len({self.layout.rank_of(d) for d in dests})

    def _awaiting(self, sources: Collection[int]) -> None:
        if any(self._remote(s) for s in sources):
            self.inbox.nudge()

    def _receive(self, source: int, expect: Expect) -> Message:
        """From the hub either way: an in-process frame carries its arrays, a header from
        another rank has them fetched from MPI."""
        return self.hub.receive(source, self.me, self.describe(source), expect, RankFetch(self, source, expect))

    def shared_payload(
        self, source: int, expect: Expect, frame: SharedFrame, layout: list[tuple[str, str, tuple[int, ...]]]
    ) -> tuple[np.ndarray, ...]:
        """The arrays of a message to several parties of this rank, fetched once: its payloads,
        filed by the inbox behind its envelope, each checked against its declared size."""
        who = self.describe(source)
        what = f"{expect.kind} (round {expect.round})"
        frame.fetcher = self._bell  # before the look: the inbox rings it once it sees it complete
        self._await_payload(frame.complete.is_set, who, what, rung=True)
        arrays = [np.empty(shape, dtype=dtype) for _, dtype, shape in layout]
        sent = carried(arrays)
        payloads = cast("list[RemotePayload]", frame.payloads)  # what this rank's inbox files
        if len(payloads) != len(sent) or any(p.size != a.nbytes for p, a in zip(payloads, sent)):
            raise ProtocolError(
                f"{who} sent a payload of {what} that does not fit its header: "
                f"{[p.size for p in payloads]} bytes, header declared "
                f"{[a.nbytes for a in sent]}"
            )
        self._fill(list(zip(payloads, sent)), who, what)
        return tuple(arrays)

    def _fill(self, payloads: list[tuple[RemotePayload, np.ndarray]], who: str, what: str) -> None:
        """Receive each matched payload into its array (sizes checked) and wait for all."""
        with self.mpi_lock:
            requests = [p.handle.Irecv([a.reshape(-1).view(np.uint8), MPI.BYTE]) for p, a in payloads]

        def arrived() -> bool:
            with self.mpi_lock:
                return MPI.Request.Testall(requests)

        self._await_payload(arrived, who, what)

    def _await_payload(self, ready: Callable[[], bool], who: str, what: str, rung: bool = False) -> None:
        """Wait for a payload that an honest peer posted right behind its header: until the
        inbox has filed it (`rung`: it rings this party's bell then), or MPI has received it
        (polled, as MPI progresses it only when called). One the inbox is to file is late only
        once the inbox has found nothing more in MPI for the rank `payload_timeout_s` after the
        wait began: a rank's inbox behind on a burst (a message that wakes a thousand silo
        threads) has not filed yet what an honest peer sent at once; past the message timeout
        it is late anyway."""
        start = time.monotonic()

        def here_or_late() -> bool:
            if ready():
                return True
            if self.inbox.idle_at - start > self.payload_timeout_s:
                raise PeerTimeout(what)
            return False

        def waiting_for() -> str:
            return f"the payload of {what} from {who}"

        try:
            if rung:  # the message timeout bounds it; the bell ends each sleep early
                self.wait_until(here_or_late, waiting_for, None, PAYLOAD_LATE_CHECK_S, 0.0, PAYLOAD_LATE_CHECK_S)
            else:
                sleep = min(PAYLOAD_MAX_SLEEP_S, self.max_sleep_s)
                self.wait_until(ready, waiting_for, self.payload_timeout_s, sleep, PAYLOAD_SPIN_S)
        except PeerTimeout:
            raise ProtocolError(
                f"{who} sent a header of {what} whose payload did not follow within {self.payload_timeout_s:g} s"
            ) from None

    def payload(
        self, source: int, expect: Expect, layout: list[tuple[str, str, tuple[int, ...]]]
    ) -> dict[str, np.ndarray]:
        """The arrays of a header from another rank: each payload the inbox filed behind it,
        checked against its declared size, then received into a fresh array (an empty array
        has no payload)."""
        who = self.describe(source)
        what = f"{expect.kind} (round {expect.round})"
        arrays = {name: np.empty(shape, dtype=dtype) for name, dtype, shape in layout}
        payloads: list[tuple[RemotePayload, np.ndarray]] = []
        for name, a in ((name, a) for name, a in arrays.items() if a.nbytes):  # as `carried`
            self._await_payload(lambda: self.hub.waiting(source, self.me), who, what, rung=True)
            frame = self.hub.take(source, self.me)
            if not isinstance(frame, RemotePayload):
                raise ProtocolError(f"{who} sent a header where the payload of {what} belongs")
            if frame.size != a.nbytes:
                raise ProtocolError(
                    f"{who} sent a payload of {what} that does not fit its header: "
                    f"{frame.size} bytes for array {name!r}, header declared {a.nbytes}"
                )
            payloads.append((frame, a))
        self._fill(payloads, who, what)
        return arrays
