"""Which rank hosts which party: the one place that maps silo indices to MPI ranks.

Rank 0 hosts the server; ranks 1..R host consecutive blocks of silos, as even as possible
(the first C mod R ranks one silo more). One silo per rank is the case R = C.
"""

from __future__ import annotations

from functools import cached_property

from .base import SERVER, party_name

__all__ = ["RankLayout"]


class RankLayout:
    def __init__(self, silos: int, silo_ranks: int) -> None:
        if not 1 <= silo_ranks <= silos:
            raise ValueError(f"{silos} silos need between 1 and {silos} silo ranks, got {silo_ranks}")
        self.silos = silos
        self.silo_ranks = silo_ranks

    @cached_property
    def _blocks(self) -> list[range]:
        base, extra = divmod(self.silos, self.silo_ranks)
        starts = [r * base + min(r, extra) for r in range(self.silo_ranks + 1)]
        return [range(starts[r], starts[r + 1]) for r in range(self.silo_ranks)]

    @property
    def world_size(self) -> int:
        return 1 + self.silo_ranks

    @property
    def slots(self) -> int:
        """The most parties any rank hosts."""
        return len(self._blocks[0])

    def silos_on(self, rank: int) -> range:
        return range(0) if rank == 0 else self._blocks[rank - 1]

    def rank_of(self, address: int) -> int:
        if address == SERVER:
            return 0
        if not 0 <= address < self.silos:
            raise ValueError(f"no silo {address} among {self.silos}")
        base, extra = divmod(self.silos, self.silo_ranks)
        big = extra * (base + 1)  # silos held by the ranks with one more
        return 1 + (address // (base + 1) if address < big else extra + (address - big) // base)

    def slot_of(self, address: int) -> int:
        """The party's index among those of its rank (the server's is 0)."""
        return 0 if address == SERVER else address - self._blocks[self.rank_of(address) - 1].start

    def describe(self, address: int) -> str:
        return f"{party_name(address)} (rank {self.rank_of(address)})"
