"""Several parties of a run in one process, each in a thread of its own: the simulator's
silos, and the silos that share an MPI rank.

Threads suit the parties: each one is a plain sequential program that blocks on its channel,
and torch releases the GIL while it computes. The first failure closes the process's hub, so
every other party stops waiting at once (ChannelClosed) instead of timing out, and `join`
raises it under the failing party's name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..channel import ChannelClosed, LocalHub

__all__ = ["PartyFailure", "PartyThreads"]


class PartyFailure(RuntimeError):
    """A party of this process failed; `error` is what it raised."""

    def __init__(self, party: str, error: BaseException) -> None:
        super().__init__(f"{party} failed: {type(error).__name__}: {error}")
        self.party, self.error = party, error


class PartyThreads:
    def __init__(self, hub: LocalHub) -> None:
        self.hub = hub
        self.failures: list[PartyFailure] = []
        self._threads: list[threading.Thread] = []

    def start(self, party: str, body: Callable[[], None]) -> None:
        """Run `body` in a daemon thread (a party that hangs cannot keep the process alive)."""

        def guarded() -> None:
            try:
                body()
            except ChannelClosed:
                pass  # another party failed first; its failure is the one to report
            except BaseException as err:  # noqa: BLE001 - any failure must stop the other parties
                self.fail(party, err)

        thread = threading.Thread(target=guarded, name=party, daemon=True)
        self._threads.append(thread)
        thread.start()

    def fail(self, party: str, error: BaseException) -> None:
        self.failures.append(PartyFailure(party, error))
        self.hub.fail(str(self.failures[0]))

    def join(self, grace_s: float | None = None) -> None:
        """Wait for every party; after a failure wait at most `grace_s` more (a party may hang),
        then raise the first failure."""
        for thread in self._threads:
            while thread.is_alive():
                thread.join(0.2)  # short joins keep the main thread responsive to signals
                if self.failures and grace_s is not None:
                    thread.join(grace_s)
                    break
        if self.failures:
            raise self.failures[0]
        if self.hub.failure is not None:  # no party's doing: the rank's inbox failed, or a peer is lost
            raise ChannelClosed(self.hub.failure)
