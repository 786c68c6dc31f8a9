"""A process's freed memory handed back to the system while its silos run.

A silo's model is allocated and freed every round: training takes a copy of the weights it
was handed, and the copy goes once the update has left (models/build.py, `share_arrays`).
glibc's malloc keeps what the threads free in its arenas, for later requests of the same
arena, and a rank hosting thousands of silos then grows round after round by what it freed
(docs/research/PERFORMANCE.md, "Silos hold no model"). `malloc_trim` returns the free pages of every
arena; `FreedMemory` calls it every `period_s` while it is open, from a thread of its own
(ctypes releases the GIL for the call). By default every 5 s, not every second: a trim holds
an arena's lock while it hands pages back, and the pages handed back are faulted in again by
the next round's copies (docs/research/PERFORMANCE.md, "Silos hold no model"). Where the C library has
no `malloc_trim` (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["FreedMemory"]


def _malloc_trim() -> Callable[[int], object] | None:
    """glibc's `malloc_trim(size_t pad)`, or None where the C library lacks it."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


class FreedMemory:
    """A context in which a thread returns the process's freed memory every `period_s`."""

    def __init__(self, period_s: float = 5.0) -> None:
        self.period_s = period_s
        self._trim = _malloc_trim()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freed-memory", daemon=True)

    def _run(self) -> None:
        assert self._trim is not None
        while not self._closed.wait(self.period_s):
            self._trim(0)

    def __enter__(self) -> FreedMemory:
        if self._trim is not None:
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._closed.set()
