"""How many silos of a process compute at once.

The silos a rank hosts (and the simulator's) are threads, each a sequential program that
blocks on its channel. Left alone, every one of them trains, embeds and evaluates at the same
time, so the process holds every silo's activations at once (the simple CNN's are tens of MB
per silo at a batch of 512), though its cores run only a few of them at a time. The gate
lets `slots` silos compute at once and the rest queue: the same work in the same time, with
the peak memory of `slots` silos. It is held around a computation only, never while waiting
for a message (a silo waiting for a peer while holding it could stall the peer's turn).
"""
from __future__ import annotations

import threading
from types import TracebackType

__all__ = ["ComputeGate"]


class ComputeGate:
    """A context manager: at most `slots` silos of this process inside it at once."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self._free = threading.BoundedSemaphore(slots)

    def __enter__(self) -> "ComputeGate":
        self._free.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._free.release()

    @staticmethod
    def for_share(cores: int, threads: int, silos: int, node_silos: int) -> "ComputeGate":
        """As many of this process's `silos` as its share of the node's `cores` (in proportion
        to the silos it hosts of the node's `node_silos`) runs at `threads` threads each; at
        least one."""
        return ComputeGate(max(1, min(silos, cores * silos // max(1, node_silos * threads))))
