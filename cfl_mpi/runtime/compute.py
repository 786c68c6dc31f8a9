"""Where the silos of a process compute: a pool of a few worker threads that they all share.

The silos a rank hosts (and the simulator's) are threads, each a sequential program that
blocks on its channel. Their torch computations (training, evaluation, embedding) run on the
pool's `slots` workers, not in the silo's own thread: the process then holds `slots` silos'
activations at once, not every silo's, and only the workers carry the memory torch leaves in
every thread that has computed (more than a small silo's data and model take), and a rank may
host a thousand silo threads or more (docs/research/PERFORMANCE.md, "Compute pool").
A silo waits for its turn and its result without holding a worker, and never waits for a
message on one (a worker blocked on a peer could stall that peer's turn).

`batched` lets the silos that queue the same computation on different data (EMD-CFL's silos
embedding their samples under one representative's model) share one call: one large forward
pass costs less than many small ones over the same images
(docs/research/PERFORMANCE.md, "Shared embedding passes"). `together` does so for a group the caller names
(the process's silos training in a round): the call waits for every member, so which silos
compute together, and with it each one's float rounding, is a function of the config, not of
which silos happened to queue first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["ComputePool"]

T = TypeVar("T")


class ComputePool:
    """`pool(fn, *args)`: `fn` runs on one of `slots` workers and the caller waits for its
    result (or its exception). A context manager: the workers end on exit."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self._workers = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="compute")
        self._lock = threading.Lock()
        self._queued: dict[Hashable, _Batch] = {}  # by key: the batch no worker has taken up yet
        self._groups: dict[Hashable, _Group] = {}  # by key: `together`'s groups not complete yet
        self._gone: set[Hashable] = set()  # members that withdrew: no group waits for them

    def __call__(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        return self._workers.submit(fn, *args, **kwargs).result()

    def batched(self, key: Hashable, fn: Callable[[list[Any]], list[T]], item: object, limit: int) -> T:
        """`fn(items)[i]` for this caller's `item` = items[i]: one call of `fn` computes the items
        of every caller of the same `key` queued before a worker takes their batch up (at most
        `limit`; the first caller's `fn` serves them all, so it must depend on the key alone).
        An exception reaches every caller of the batch."""
        with self._lock:
            batch = self._queued.get(key)
            if batch is None or len(batch.items) >= batch.limit:
                batch = self._queued[key] = _Batch(max(1, limit))
                batch.result = self._workers.submit(self._run, key, batch, fn)
            index = len(batch.items)
            batch.items.append(item)
            result = batch.result
        assert result is not None  # submitted with the batch, under the lock
        return result.result()[index]

    def together(
        self,
        key: Hashable,
        fn: Callable[[list[Any]], list[T]],
        item: object,
        member: Hashable,
        members: Callable[[], Sequence[Hashable]],
    ) -> T:
        """`fn(items)[i]` for this caller's `item`, computed in one call with the items of the
        other `members()` (this caller among them; asked of the group's first caller only) that
        queue under `key`, once every member has queued or withdrawn (`withdraw`), in the order
        of `members()`: the group and its order are the caller's, never the timing's. An
        exception reaches every caller of the group."""
        with self._lock:
            group = self._groups.get(key) or _Group([m for m in members() if m not in self._gone], fn)
            if member not in group.members or member in group.items:
                raise ValueError(f"{member!r} is not a member of group {key!r} waiting for it")
            self._groups[key] = group
            group.items[member] = item
            self._start_if_complete(key, group)
        return group.result.result()[member]

    def withdraw(self, member: Hashable) -> None:
        """`member` (a silo that left) queues nothing any more: no group waits for it."""
        with self._lock:
            self._gone.add(member)
            for key, group in list(self._groups.items()):
                if member in group.members and member not in group.items:
                    group.members.remove(member)
                    self._start_if_complete(key, group)

    def _start_if_complete(self, key: Hashable, group: _Group) -> None:
        """Under the lock: a group whose members have all queued goes to a worker."""
        if group.members and len(group.items) == len(group.members):
            del self._groups[key]
            self._workers.submit(self._run_group, group)
        elif not group.members:
            del self._groups[key]

    @staticmethod
    def _run_group(group: _Group) -> None:
        try:
            results = group.fn([group.items[m] for m in group.members])
            if len(results) != len(group.members):
                raise ValueError(f"a computation together returned {len(results)} results for {len(group.members)}")
            group.result.set_result(dict(zip(group.members, results)))
        except BaseException as err:  # noqa: BLE001 - every member's caller gets it
            group.result.set_exception(err)

    def _run(self, key: Hashable, batch: _Batch, fn: Callable[[list[Any]], list[T]]) -> list[T]:
        with self._lock:  # later callers of the key start a batch of their own
            if self._queued.get(key) is batch:
                del self._queued[key]
        results = fn(batch.items)
        if len(results) != len(batch.items):
            raise ValueError(f"a batched computation returned {len(results)} results for {len(batch.items)} items")
        return results

    def __enter__(self) -> ComputePool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def for_share(cores: int, threads: int, silos: int, node_silos: int) -> ComputePool:
        """As many workers as this process's `silos` get of the node's `cores` (in proportion
        to the silos it hosts of the node's `node_silos`) at `threads` threads each; at least
        one."""
        return ComputePool(max(1, min(silos, cores * silos // max(1, node_silos * threads))))


class _Batch:
    """The items of one batched call, and its future (a list of results, one per item)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[Any] = []
        self.result: Future | None = None  # the worker's call, once submitted


class _Group:
    """The members of one `together` call, the items of those that queued, its function and
    the future of its results (member → result)."""

    def __init__(self, members: list[Hashable], fn: Callable[[list[Any]], list[Any]]) -> None:
        self.members = members
        self.fn = fn
        self.items: dict[Hashable, Any] = {}
        self.result: Future[dict[Hashable, Any]] = Future()
