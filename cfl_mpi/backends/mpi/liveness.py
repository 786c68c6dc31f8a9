"""Heartbeats between the ranks of an MPI job: a rank that is gone (its node crashed, its link
went down) ends the job within `runtime.heartbeat_timeout_s`, naming its node, the node's
ranks and their silos, instead of after `runtime.message_timeout_s` of silence.

Every silo rank beats to rank 0, and rank 0 to every silo rank, each `interval_s`, on a
communicator of their own (a duplicate of the job's: beats never meet the protocol's messages
nor its tag checks). The rank's inbox thread (channel.py) sends and takes them between its polls,
so a rank whose parties compute for minutes still beats. Any message the inbox takes from a
watched rank counts as hearing it too: a rank whose messages arrive is alive, and under load its
beats can wait behind its other traffic. A rank that has heard nothing from a watched rank for
the timeout reports it lost; a silo rank waits twice as long for rank 0, so that rank 0, which
can name the silent node, speaks first. A rank whose parties are done says goodbye and is
watched no more.

MPI's own failure report is not enough: under MPICH's Hydra nobody notices a link that went
down (TCP waits), and a node whose processes die takes the job down with the launcher's words
only.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ...channel.layout import RankLayout
from ...console import numbered
from ...wire.messages import ProtocolError

__all__ = ["Liveness"]

BEAT, BYE = 1, 2  # a heartbeat's one byte: alive, or done (watch me no more)


class Liveness:
    """One rank's heartbeats: `poll` (under the rank's MPI lock) sends the beats that are due,
    takes those that came, and says which watched rank fell silent, if any."""

    def __init__(
        self, comm: MPI.Comm, layout: RankLayout, hosts: list[str], interval_s: float, timeout_s: float
    ) -> None:
        self.comm = comm.Dup()  # collective: every rank builds its Liveness at the same point
        self.layout, self.hosts, self.interval_s = layout, hosts, interval_s
        self.rank = comm.Get_rank()
        self.timeout_s = timeout_s if self.rank == 0 else 2 * timeout_s
        self.peers = list(range(1, comm.Get_size())) if self.rank == 0 else [0]
        now = time.monotonic()
        self.heard = dict.fromkeys(self.peers, now)  # the ranks watched, and when each was last heard
        self.next_beat = now
        self._sends: list[MPI.Request] = []
        self._beat, self._bye = np.array([BEAT], dtype=np.uint8), np.array([BYE], dtype=np.uint8)

    def poll(self, now: float) -> str | None:
        """Beat if due, take the beats that came; why a watched rank is lost, or None."""
        if now >= self.next_beat:
            self._sends = [r for r in self._sends if not r.Test()]  # a lost peer's stay pending
            self._sends += [self.comm.Isend(self._beat, dest=p) for p in self.peers]
            self.next_beat = now + self.interval_s
        self._take(now)
        silent = [r for r, t in self.heard.items() if now - t > self.timeout_s]
        return self.describe(silent[0], now) if silent else None

    def heard_from(self, rank: int, now: float) -> None:
        """A message of the protocol came from `rank` (its inbox took it): alive."""
        if rank in self.heard:
            self.heard[rank] = now

    def _take(self, now: float) -> None:
        status = MPI.Status()
        while (handle := self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)) is not None:
            sender, size = status.Get_source(), status.Get_count(MPI.BYTE)
            if size != 1 or sender not in self.peers:
                raise ProtocolError(f"rank {sender} sent rank {self.rank} a heartbeat of {size} bytes, unasked")
            value = np.empty(1, dtype=np.uint8)
            handle.Recv(value)
            if value[0] not in (BEAT, BYE):
                raise ProtocolError(f"rank {sender} sent rank {self.rank} a heartbeat of value {value[0]}")
            if value[0] == BYE:
                self.heard.pop(sender, None)
            elif sender in self.heard:
                self.heard[sender] = now

    def describe(self, rank: int, now: float) -> str:
        """Why `rank` counts as lost: its node, with the node's ranks silent as long (missing
        two beats) and their silos, or the rank alone where its node's others still beat."""
        host, silent_s = self.hosts[rank], now - self.heard[rank]
        if rank == 0:
            return f"the server (rank 0 on {host}) silent for {silent_s:.0f} s: its node is lost or cut off"
        on_host = [r for r in self.heard if self.hosts[r] == host]
        silent = [r for r in on_host if now - self.heard[r] > 2 * self.interval_s]
        silos = [s for r in silent for s in self.layout.silos_on(r)]
        ranks = f"{numbered('rank', silent)} ({numbered('silo', silos)})"
        if len(silent) == len(on_host):
            return f"node {host} lost: {ranks} silent for {silent_s:.0f} s (its processes died, or its link is down)"
        return f"{ranks} on {host} silent for {silent_s:.0f} s while its node's other ranks beat (hung or died)"

    def goodbye(self) -> None:
        """This rank's parties are done: rank 0 stops watching it (under the rank's MPI lock)."""
        if self.rank:
            self.comm.Isend(self._bye, dest=0).Wait()  # one byte: leaves at once
